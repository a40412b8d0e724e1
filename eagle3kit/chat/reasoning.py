"""The reasoning profile: what a tokenizer and its chat template say a correct final turn
looks like (think markers, harmony channels, the generation prompt, stop ids, and each
marker as it looks written as plain text).

It is learned by rendering probe conversations with the template, next to rendering
(chat/render.py); validate checks datasets against it. transformers is imported inside the
functions that need it, so importing this module is free.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from eagle3kit.chat.render import (
    PROBE_ANSWER,
    PROBE_ARGUMENT,
    PROBE_QUESTION,
    PROBE_REASONING,
    Renderer,
    RenderError,
    read_template,
)
from eagle3kit.chat.tokenizer import TOKENIZER_FILE_GLOBS, TOKENIZER_FILE_NAMES, load_tokenizer
from eagle3kit.errors import UserError


@dataclass(frozen=True)
class LiteralPattern:
    """A marker written as ordinary text: the `core` ids, after a token whose text ends with
    the part of the marker the core leaves out at its start (`before`; any token when None)
    and before one whose text starts with the part it leaves out at its end (`after`)."""

    core: np.ndarray
    before: np.ndarray | None
    after: np.ndarray | None


@dataclass
class Profile:
    """What the tokenizer and template say a correct final turn looks like."""

    renderer: Renderer | None = None
    start: int | None = None
    end: int | None = None
    start_text: str | None = None
    end_text: str | None = None
    harmony: bool = False
    """gpt-oss harmony channels instead of think markers (the fields below say which)."""
    analysis: np.ndarray | None = None
    """Harmony: the ids that open the analysis channel after the generation prompt."""
    analysis_end: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    """Harmony: the ids that close the analysis message (`<|end|>`)."""
    final: np.ndarray | None = None
    """Harmony: the ids that open the final channel (`<|start|>assistant<|channel|>final...`)."""
    call_end: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    """Harmony: the ids that end a tool-call turn (`<|call|>`): such a turn has no final."""
    opens_think: bool = False
    thinking_off: bool = False
    tail: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    stop_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    blank: np.ndarray | None = None
    """Per vocab id: the token decodes to whitespace only."""
    vocab_size: int = 0
    """The tokenizer's entries (`len(tokenizer)`): ids from here up are outside it."""
    literal: list[LiteralPattern] = field(default_factory=list)
    """Each marker as it looks written as ordinary text."""
    literal_names: list[str] = field(default_factory=list)
    why_none: str = ""

    @property
    def markers(self) -> bool:
        """Whether the final turn has a reasoning segment to check (think markers or the
        harmony analysis channel)."""
        return self.start is not None or self.analysis is not None

    def describe(self) -> dict[str, Any]:
        if self.renderer is None:
            return {"tokenizer": None, "why": self.why_none}
        mode = (
            "harmony channels: analysis, then final"
            if self.analysis is not None
            else "none (harmony tokens, but the template shows no analysis channel)"
            if self.harmony
            else "none"
            if not self.markers
            else "off (the template closes the reasoning in the prompt)"
            if self.thinking_off
            else "on, opened by the template in the prompt"
            if self.opens_think
            else "on, opened by the model"
        )
        decode = self.renderer.decode
        channels = (
            {
                "analysis_channel": decode(self.analysis.tolist()),
                "analysis_end": decode(self.analysis_end.tolist()),
                "final_channel": decode(self.final.tolist()) if self.final is not None else None,
                "tool_call_end": decode(self.call_end.tolist()) or None,
            }
            if self.analysis is not None
            else {}
        )
        return {
            "think_start": self.start_text,
            "think_start_id": self.start,
            "think_end": self.end_text,
            "think_end_id": self.end,
            "reasoning": mode,
            **channels,
            "generation_prompt": decode(self.tail.tolist()),
            "stop_token_ids": self.stop_ids.tolist(),
        }


def learn_profile(renderer: Renderer, think: tuple[str, str] | None = None) -> Profile:
    """The profile of `renderer`'s template. `think` (start, end) overrides the markers the
    tokenizer suggests (and harmony): the user says what to look for."""
    tok = renderer.tokenizer
    harmony = renderer.harmony and think is None
    prof = Profile(
        renderer=renderer, harmony=harmony, stop_ids=np.asarray(renderer.stop_token_ids, np.int32)
    )
    vocab = _vocab(tok)
    prof.blank = vocab.blank
    prof.vocab_size = len(vocab.blank)
    prof.tail = np.asarray(_generation_prompt(renderer), np.int32)
    pair = think if think is not None else renderer.think
    if harmony:
        _learn_channels(prof, renderer, vocab)
    elif pair is not None:
        prof.start_text, prof.end_text = pair
        prof.start = _single_id(tok, pair[0], "--think-start")
        prof.end = _single_id(tok, pair[1], "--think-end")
        tail = prof.tail.tolist()
        s_at = _last(tail, prof.start)
        e_at = _last(tail, prof.end)
        prof.opens_think = s_at > e_at
        prof.thinking_off = s_at >= 0 and e_at > s_at
        prof.literal = [p for m in pair for p in _literal_pattern(tok, m, vocab)]
        prof.literal_names = list(pair)
    return prof


def _learn_channels(prof: Profile, renderer: Renderer, vocab: _Vocab) -> None:
    """The harmony channel sequences, learned by rendering a final assistant turn with
    reasoning (`thinking`) and an answer, as the template writes it for training:
    `<|start|>assistant` (the generation prompt) `<|channel|>analysis<|message|>` REASONING
    `<|end|>` `<|start|>assistant<|channel|>final<|message|>` ANSWER `<|return|>`; and a
    tool-call turn, whose last token (`<|call|>`) ends a turn that has no final channel.
    Leaves `prof.analysis` None when the template shows no such turn."""
    user = {"role": "user", "content": PROBE_QUESTION}
    turn = {"role": "assistant", "thinking": PROBE_REASONING, "content": PROBE_ANSWER}
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_0",
                "type": "function",
                "function": {"name": "probe", "arguments": {"text": PROBE_ARGUMENT}},
            }
        ],
    }
    try:
        prompt = _apply(renderer, [user], True)
        full = _apply(renderer, [user, turn], False)
    except RenderError:
        return
    completion = full[len(prompt) :] if full.startswith(prompt) else ""
    head, found, rest = completion.partition(PROBE_REASONING)
    mid, answered, _ = rest.partition(PROBE_ANSWER)
    if not (found and answered and head):
        return
    encode = renderer.encode
    # The final message opens the way the generation prompt opened the analysis one.
    gen_prompt = renderer.decode(prof.tail.tolist())
    at = mid.rfind(gen_prompt) if gen_prompt else -1
    close, final = (mid[:at], mid[at:]) if at > 0 else ("", mid)
    special = set(renderer.tokenizer.all_special_ids) | {
        i for i, t in renderer.tokenizer.added_tokens_decoder.items() if t.special
    }
    if not (special & set(encode(head)) and special & set(encode(final))):
        return  # the template writes the reasoning some other way (as text): no channels
    prof.analysis = np.asarray(encode(head), np.int32)
    prof.analysis_end = np.asarray(encode(close), np.int32)
    prof.final = np.asarray(encode(final), np.int32)
    try:
        called = _apply(renderer, [user, call], False)
    except RenderError:
        called = ""
    ends = encode(called.rpartition(PROBE_ARGUMENT)[2]) if PROBE_ARGUMENT in called else []
    if ends and ends[-1] in prof.stop_ids:
        prof.call_end = np.asarray(ends[-1:], np.int32)
    # Literal markers: every special token of the channel sequences, written as text.
    used = [
        *prof.analysis.tolist(),
        *prof.analysis_end.tolist(),
        *prof.final.tolist(),
        *prof.stop_ids.tolist(),
    ]
    names = list(
        dict.fromkeys(vocab.texts[i] for i in used if i in special and len(vocab.texts[i]) > 1)
    )
    prof.literal = [p for m in names for p in _inner_patterns(renderer.tokenizer, m, vocab)]
    prof.literal_names = names


_TOKENIZERS: dict[tuple, Any] = {}
_VOCABS: dict[int, _Vocab] = {}


def load_renderer(
    tokenizer: Path,
    *,
    chat_template: Path | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
    system: str | None = None,
    trust_remote_code: bool = False,
) -> Renderer:
    """`Renderer.load`, with the tokenizer itself loaded once per process for each content.

    Loading a large tokenizer takes seconds; a process that validates several datasets made
    with the same one (tests, a benchmark, a sweep) pays for it once.
    """
    key = _dir_digest(tokenizer)
    if key not in _TOKENIZERS:
        if len(_TOKENIZERS) >= 4:
            _TOKENIZERS.pop(next(iter(_TOKENIZERS)))
        _TOKENIZERS[key] = load_tokenizer(tokenizer, trust_remote_code)
    tok = _TOKENIZERS[key]
    template = read_template(chat_template) if chat_template is not None else None
    if template is None and not tok.chat_template:
        raise UserError(
            f"--tokenizer {tokenizer}: it has no chat template; pass --chat-template FILE"
        )
    try:
        return Renderer(
            tok,
            template,
            template_file=chat_template,
            chat_template_kwargs=chat_template_kwargs,
            system=system,
        )
    except RenderError as exc:
        flag = f"--chat-template {chat_template}" if chat_template else f"--tokenizer {tokenizer}"
        raise UserError(f"{flag}: the chat template fails: {exc}") from None


def _dir_digest(path: Path) -> tuple[tuple[str, str], ...]:
    """The tokenizer files of `path` with their content hashes (a stored template is not one)."""
    import fnmatch

    import xxhash

    if not path.is_dir():
        return ((str(path), ""),)
    files = [
        p
        for p in sorted(path.iterdir())
        if p.is_file()
        and (
            p.name in TOKENIZER_FILE_NAMES
            or any(fnmatch.fnmatch(p.name, g) for g in TOKENIZER_FILE_GLOBS)
        )
    ]
    return tuple((p.name, xxhash.xxh3_128_hexdigest(p.read_bytes())) for p in files)


@dataclass
class _Vocab:
    """Facts about each vocab entry of one tokenizer object, computed once."""

    tok: Any
    texts: list[str]
    """Each entry's text, special tokens kept."""
    blank: np.ndarray
    """Per id: the text is whitespace only."""
    affixes: dict[tuple[str, str], np.ndarray] = field(default_factory=dict)

    def starting(self, text: str) -> np.ndarray:
        """The ids whose text starts with `text`."""
        if ("start", text) not in self.affixes:
            self.affixes["start", text] = np.flatnonzero(
                np.fromiter((t.startswith(text) for t in self.texts), bool, len(self.texts))
            )
        return self.affixes["start", text]

    def ending(self, text: str) -> np.ndarray:
        """The ids whose text ends with `text`."""
        if ("end", text) not in self.affixes:
            self.affixes["end", text] = np.flatnonzero(
                np.fromiter((t.endswith(text) for t in self.texts), bool, len(self.texts))
            )
        return self.affixes["end", text]


def _vocab(tok: Any) -> _Vocab:
    """The `_Vocab` of a tokenizer object (kept for the last few tokenizers seen)."""
    cached = _VOCABS.get(id(tok))
    if cached is None or cached.tok is not tok:
        if len(_VOCABS) >= 4:
            _VOCABS.pop(next(iter(_VOCABS)))
        texts = [
            str(t)
            for t in tok.batch_decode(
                [[i] for i in range(len(tok))],
                skip_special_tokens=False,
                clean_up_tokenization_spaces=False,
            )
        ]
        blank = np.fromiter((not t.strip() for t in texts), bool, len(texts))
        cached = _VOCABS[id(tok)] = _Vocab(tok, texts, blank)
    return cached


def _apply(renderer: Renderer, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
    """The template's text for `messages` with the renderer's kwargs (no --system added)."""
    return renderer._apply(messages, None, add_generation_prompt=add_generation_prompt)


def _generation_prompt(renderer: Renderer) -> list[int]:
    """The ids the template adds for the assistant's turn: a one-question conversation
    rendered with and without the generation prompt, minus their common prefix."""
    messages = [{"role": "user", "content": PROBE_QUESTION}]
    with_gp = renderer.encode(_apply(renderer, messages, True))
    without = renderer.encode(_apply(renderer, messages, False))
    common = 0
    while common < min(len(with_gp), len(without)) and with_gp[common] == without[common]:
        common += 1
    return with_gp[common:]


def _single_id(tok: Any, text: str, flag: str) -> int:
    ids = tok.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        raise UserError(
            f"{flag} {text!r}: not a single token of this tokenizer "
            f"(it encodes to {len(ids)} tokens)"
        )
    return int(ids[0])


def _last(ids: list[int], token: int) -> int:
    return len(ids) - 1 - ids[::-1].index(token) if token in ids else -1


def plain_ids(tok: Any, text: str) -> list[int] | None:
    """`text` tokenized as ordinary text: added tokens (special or not) are not matched."""
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None or backend.pre_tokenizer is None:
        return None
    norm = backend.normalizer.normalize_str(text) if backend.normalizer else text
    pieces = backend.pre_tokenizer.pre_tokenize_str(norm)
    return [t.id for piece, _ in pieces for t in backend.model.tokenize(piece)]


def _literal_pattern(tok: Any, marker: str, vocab: _Vocab) -> list[LiteralPattern]:
    """How `marker` looks when a parser or a text round trip turned it into plain text:
    its ids without the last one (BPE merges the last piece with what follows, e.g. ">\\n"),
    for each likely preceding character, plus the ids that may follow (text starting with
    the last piece)."""
    whole = plain_ids(tok, marker)
    if not whole or len(whole) < 2:
        return []
    last = vocab.texts[whole[-1]]
    cores: set[tuple[int, ...]] = set()
    for before in ("", " ", "\n", "a"):
        ids = plain_ids(tok, before + marker) or []
        lead = plain_ids(tok, before) or []
        core = ids[len(lead) : -1] if ids[: len(lead)] == lead else ids[:-1]
        if core:
            cores.add(tuple(core))
    follow = vocab.starting(last)
    return [LiteralPattern(np.asarray(c, np.int64), None, follow) for c in sorted(cores)]


def _inner_patterns(tok: Any, marker: str, vocab: _Vocab) -> list[LiteralPattern]:
    """How `marker` (e.g. `<|channel|>`) looks written as plain text, in the contexts it
    meets: BPE merges its first and last characters with their neighbours (".<", "><",
    ">\\n"), so the pattern is the ids lying wholly inside the marker, with the tokens
    around them required to end / start with the characters of the marker they hold."""
    found: set[tuple[tuple[int, ...], str, str]] = set()
    for before in ("", " ", "\n", "a", ".", ">"):
        for after in ("", " ", "\n", "a", "<", "("):
            ids = plain_ids(tok, before + marker + after) or []
            sizes = np.asarray([len(vocab.texts[i]) for i in ids], np.int64)
            ends = np.cumsum(sizes)
            starts = ends - sizes
            lo, hi = len(before), len(before) + len(marker)
            inside = np.flatnonzero((starts >= lo) & (ends <= hi))
            if len(inside) < 2 or ends[-1] != hi + len(after):  # not plain ASCII: skip
                continue
            k0, k1 = int(inside[0]), int(inside[-1])
            found.add((tuple(ids[k0 : k1 + 1]), marker[: starts[k0] - lo], marker[ends[k1] - lo :]))
    return [
        LiteralPattern(
            np.asarray(core, np.int64),
            vocab.ending(head) if head else None,
            vocab.starting(rest) if rest else None,
        )
        for core, head, rest in sorted(found)
    ]

"""`eagle3kit validate`: the checks a token dataset must pass before any GPU time is spent.

Every check runs over the shards' flat token arrays with numpy (marker positions by
`np.flatnonzero`, mapped to samples with `np.searchsorted` against the offsets), so a dataset
of tens of millions of tokens is checked in seconds without decoding a sample to text. The
result is a `ValidateReport` that collects every finding; the CLI turns it into the exit
status (0 all passed, 1 a check failed, 2 unusable input). See docs/validate.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from eagle3kit import _hf, _ui
from eagle3kit.errors import UserError
from eagle3kit.format import Dataset, DatasetError, DatasetWriter

if TYPE_CHECKING:
    from eagle3kit.gen.render import Renderer

CHECKS = ("integrity", "structure", "literal_markers", "truncation", "reasoning",
          "degenerate", "round_trip", "coverage", "reconstructed", "vocabulary", "invariants")
TITLES = {
    "integrity": "integrity", "structure": "final-turn structure",
    "literal_markers": "no literal markers", "truncation": "truncation",
    "reasoning": "reasoning capture", "degenerate": "no degenerate output",
    "round_trip": "template round trip", "coverage": "training coverage",
    "reconstructed": "exact token ids", "vocabulary": "ids in vocabulary",
    "invariants": "server invariants",
}
FINISHED = ("stop", "length")
LOOP_MAX_PERIOD = 32
"""Longest repeated unit (tokens) the loop detector looks for."""
LOOP_MIN_TOKENS = 128
"""A loop: at least this many tokens each equal to the token one period earlier."""
EXAMPLES = 5
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
"""A date as templates that write today's date (gpt-oss: `strftime_now`) write it."""


@dataclass
class ValidateConfig:
    path: Path
    """The token dataset directory to check."""
    tokenizer: Path | None = None
    """Tokenizer directory overriding the one stored in the dataset (DIR/tokenizer)."""
    chat_template: Path | None = None
    """Chat template file overriding the stored one."""
    think_start: str | None = None
    """Reasoning start token, overriding what the tokenizer suggests."""
    think_end: str | None = None
    """Reasoning end token, overriding what the tokenizer suggests."""
    max_truncation: float = 0.05
    """Largest share of samples finished by length that passes."""
    min_reasoning: float = 0.5
    """Smallest share of samples with a non-empty reasoning segment that passes."""
    only: list[str] | None = None
    """Run only these checks."""
    skip: list[str] | None = None
    """Leave out these checks."""
    write_clean: Path | None = None
    """Write a new dataset without the samples any check flagged."""
    trust_remote_code: bool | None = None
    """Run code the tokenizer ships (auto_map); None: as gen was told (the dataset records
    it) for the stored tokenizer, else no."""
    output: _ui.OutputOptions = field(default_factory=_ui.OutputOptions)

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        for flag, value in (("--max-truncation", self.max_truncation),
                            ("--min-reasoning", self.min_reasoning)):
            if not 0.0 <= value <= 1.0:
                raise UserError(f"{flag} must be a share between 0 and 1 (got {value})")
        if (self.think_start is None) != (self.think_end is None):
            raise UserError("--think-start and --think-end go together: give both")
        for flag, names in (("--only", self.only), ("--skip", self.skip)):
            unknown = [n for n in names or [] if n not in CHECKS]
            if unknown:
                raise UserError(f"{flag}: unknown check {', '.join(unknown)} "
                                f"(checks: {', '.join(CHECKS)})")
        if self.write_clean is not None:
            self.write_clean = Path(self.write_clean)
            if self.write_clean.resolve() == self.path.resolve():
                raise UserError("--write-clean must name a new directory, not the input")

    def selected(self) -> list[str]:
        chosen = [c for c in CHECKS if self.only is None or c in self.only]
        return [c for c in chosen if c not in (self.skip or [])]


@dataclass
class CheckResult:
    name: str
    status: str
    """pass, fail or skip."""
    detail: str
    failing: int = 0
    total: int = 0
    threshold: float | None = None
    rate: float | None = None
    examples: list[str] = field(default_factory=list)
    reasons: dict[str, int] = field(default_factory=dict)
    flagged: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    """Global indices of the samples this check flags (not in the JSON)."""

    @property
    def passed(self) -> bool:
        return self.status != "fail"

    def to_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "flagged"}
        d["title"] = TITLES[self.name]
        return d


@dataclass
class ValidateReport:
    path: str
    samples: int
    tokens: int
    profile: dict[str, Any]
    checks: list[CheckResult]
    partitions: dict[str, dict]
    warnings: list[str] = field(default_factory=list)
    clean: dict | None = None

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def check(self, name: str) -> CheckResult:
        return next(c for c in self.checks if c.name == name)

    def summary(self) -> str:
        failed = [c.name for c in self.checks if c.status == "fail"]
        skipped = sum(c.status == "skip" for c in self.checks)
        ran = len(self.checks) - skipped
        if failed:
            return f"{len(failed)} of {ran} checks failed: {', '.join(failed)}"
        return f"all {ran} checks passed" + (f" ({skipped} skipped)" if skipped else "")

    def to_dict(self) -> dict:
        return {"path": self.path, "passed": self.passed, "summary": self.summary(),
                "samples": self.samples, "tokens": self.tokens, "profile": self.profile,
                "checks": [c.to_dict() for c in self.checks], "partitions": self.partitions,
                "warnings": self.warnings, "clean": self.clean}


# -- reasoning profile ----------------------------------------------------------------------


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
        mode = ("harmony channels: analysis, then final" if self.analysis is not None else
                "none (harmony tokens, but the template shows no analysis channel)"
                if self.harmony else
                "none" if not self.markers else
                "off (the template closes the reasoning in the prompt)" if self.thinking_off else
                "on, opened by the template in the prompt" if self.opens_think else
                "on, opened by the model")
        decode = self.renderer.decode
        channels = ({"analysis_channel": decode(self.analysis.tolist()),
                     "analysis_end": decode(self.analysis_end.tolist()),
                     "final_channel": decode(self.final.tolist()) if self.final is not None
                     else None,
                     "tool_call_end": decode(self.call_end.tolist()) or None}
                    if self.analysis is not None else {})
        return {"think_start": self.start_text, "think_start_id": self.start,
                "think_end": self.end_text, "think_end_id": self.end, "reasoning": mode,
                **channels, "generation_prompt": decode(self.tail.tolist()),
                "stop_token_ids": self.stop_ids.tolist()}


def load_profile(cfg: ValidateConfig, ds: Dataset) -> Profile:
    renderer = _load_renderer(cfg, ds)
    if renderer is None:
        return Profile(why_none="no tokenizer stored in the dataset; pass --tokenizer")
    tok = renderer.tokenizer
    # Explicit --think-start/--think-end win over harmony: the user says what to look for.
    harmony = renderer.harmony and cfg.think_start is None
    prof = Profile(renderer=renderer, harmony=harmony,
                   stop_ids=np.asarray(renderer.stop_token_ids, np.int32))
    vocab = _vocab(tok)
    prof.blank = vocab.blank
    prof.vocab_size = len(vocab.blank)
    prof.tail = np.asarray(_generation_prompt(renderer), np.int32)
    pair = (cfg.think_start, cfg.think_end) if cfg.think_start is not None else renderer.think
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
    from eagle3kit.gen.render import (
        PROBE_ANSWER,
        PROBE_ARGUMENT,
        PROBE_QUESTION,
        PROBE_REASONING,
        RenderError,
    )

    user = {"role": "user", "content": PROBE_QUESTION}
    turn = {"role": "assistant", "thinking": PROBE_REASONING, "content": PROBE_ANSWER}
    call = {"role": "assistant", "content": "", "tool_calls": [{
        "id": "call_0", "type": "function",
        "function": {"name": "probe", "arguments": {"text": PROBE_ARGUMENT}}}]}
    try:
        prompt = _apply(renderer, [user], True)
        full = _apply(renderer, [user, turn], False)
    except RenderError:
        return
    completion = full[len(prompt):] if full.startswith(prompt) else ""
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
        i for i, t in renderer.tokenizer.added_tokens_decoder.items() if t.special}
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
    used = [*prof.analysis.tolist(), *prof.analysis_end.tolist(),
            *prof.final.tolist(), *prof.stop_ids.tolist()]
    names = list(dict.fromkeys(vocab.texts[i] for i in used
                               if i in special and len(vocab.texts[i]) > 1))
    prof.literal = [p for m in names for p in _inner_patterns(renderer.tokenizer, m, vocab)]
    prof.literal_names = names


def _load_renderer(cfg: ValidateConfig, ds: Dataset) -> Renderer | None:

    stored = ds.path / "tokenizer"
    tok_dir = cfg.tokenizer or (stored if (stored / "tokenizer_config.json").is_file()
                                or (stored / "tokenizer.json").is_file() else None)
    if tok_dir is None:
        return None
    recorded = ds.manifest.get("config", {}).get("renderer", {}) or {}
    template = cfg.chat_template
    if template is None and cfg.tokenizer is None:
        name = ds.manifest.get("provenance", {}).get("chat_template_file")
        if name and (stored / Path(name).name).is_file():
            template = stored / Path(name).name
    trust = cfg.trust_remote_code
    if trust is None:  # the dataset's own tokenizer: gen's consent to its code goes with it
        trust = cfg.tokenizer is None and _hf.recorded_trust(ds.manifest)
    return load_renderer(Path(tok_dir), chat_template=template,
                         chat_template_kwargs=recorded.get("chat_template_kwargs") or None,
                         system=recorded.get("system"), trust_remote_code=trust)


_TOKENIZERS: dict[tuple, Any] = {}
_VOCABS: dict[int, _Vocab] = {}


def load_renderer(tokenizer: Path, *, chat_template: Path | None = None,
                  chat_template_kwargs: dict[str, Any] | None = None,
                  system: str | None = None, trust_remote_code: bool = False) -> Renderer:
    """`Renderer.load`, with the tokenizer itself loaded once per process for each content.

    Loading a large tokenizer takes seconds; a process that validates several datasets made
    with the same one (tests, a benchmark, a sweep) pays for it once.
    """
    from eagle3kit.gen.render import Renderer, RenderError, load_tokenizer, read_template

    key = _dir_digest(tokenizer)
    if key not in _TOKENIZERS:
        if len(_TOKENIZERS) >= 4:
            _TOKENIZERS.pop(next(iter(_TOKENIZERS)))
        _TOKENIZERS[key] = load_tokenizer(tokenizer, trust_remote_code)
    tok = _TOKENIZERS[key]
    template = read_template(chat_template) if chat_template is not None else None
    if template is None and not tok.chat_template:
        raise UserError(f"--tokenizer {tokenizer}: it has no chat template; "
                        "pass --chat-template FILE")
    try:
        return Renderer(tok, template, template_file=chat_template,
                        chat_template_kwargs=chat_template_kwargs, system=system)
    except RenderError as exc:
        flag = f"--chat-template {chat_template}" if chat_template else f"--tokenizer {tokenizer}"
        raise UserError(f"{flag}: the chat template fails: {exc}") from None


def _dir_digest(path: Path) -> tuple[tuple[str, str], ...]:
    """The tokenizer files of `path` with their content hashes (a stored template is not one)."""
    import fnmatch

    import xxhash

    from eagle3kit.gen.render import TOKENIZER_FILE_GLOBS, TOKENIZER_FILE_NAMES

    if not path.is_dir():
        return ((str(path), ""),)
    files = [p for p in sorted(path.iterdir()) if p.is_file() and (
        p.name in TOKENIZER_FILE_NAMES
        or any(fnmatch.fnmatch(p.name, g) for g in TOKENIZER_FILE_GLOBS))]
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
            self.affixes["start", text] = np.flatnonzero(np.fromiter(
                (t.startswith(text) for t in self.texts), bool, len(self.texts)))
        return self.affixes["start", text]

    def ending(self, text: str) -> np.ndarray:
        """The ids whose text ends with `text`."""
        if ("end", text) not in self.affixes:
            self.affixes["end", text] = np.flatnonzero(np.fromiter(
                (t.endswith(text) for t in self.texts), bool, len(self.texts)))
        return self.affixes["end", text]


def _vocab(tok: Any) -> _Vocab:
    """The `_Vocab` of a tokenizer object (kept for the last few tokenizers seen)."""
    cached = _VOCABS.get(id(tok))
    if cached is None or cached.tok is not tok:
        if len(_VOCABS) >= 4:
            _VOCABS.pop(next(iter(_VOCABS)))
        texts = [str(t) for t in tok.batch_decode(
            [[i] for i in range(len(tok))], skip_special_tokens=False,
            clean_up_tokenization_spaces=False)]
        blank = np.fromiter((not t.strip() for t in texts), bool, len(texts))
        cached = _VOCABS[id(tok)] = _Vocab(tok, texts, blank)
    return cached


def _apply(renderer: Renderer, messages: list[dict[str, Any]],
           add_generation_prompt: bool) -> str:
    """The template's text for `messages` with the renderer's kwargs (no --system added)."""
    return renderer._apply(messages, None, add_generation_prompt=add_generation_prompt)


def _generation_prompt(renderer: Renderer) -> list[int]:
    """The ids the template adds for the assistant's turn: a one-question conversation
    rendered with and without the generation prompt, minus their common prefix."""
    from eagle3kit.gen.render import PROBE_QUESTION

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
        raise UserError(f"{flag} {text!r}: not a single token of this tokenizer "
                        f"(it encodes to {len(ids)} tokens)")
    return int(ids[0])


def _last(ids: list[int], token: int) -> int:
    return len(ids) - 1 - ids[::-1].index(token) if token in ids else -1


def _plain_ids(tok: Any, text: str) -> list[int] | None:
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
    whole = _plain_ids(tok, marker)
    if not whole or len(whole) < 2:
        return []
    last = vocab.texts[whole[-1]]
    cores: set[tuple[int, ...]] = set()
    for before in ("", " ", "\n", "a"):
        ids = _plain_ids(tok, before + marker) or []
        lead = _plain_ids(tok, before) or []
        core = ids[len(lead):-1] if ids[:len(lead)] == lead else ids[:-1]
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
            ids = _plain_ids(tok, before + marker + after) or []
            sizes = np.asarray([len(vocab.texts[i]) for i in ids], np.int64)
            ends = np.cumsum(sizes)
            starts = ends - sizes
            lo, hi = len(before), len(before) + len(marker)
            inside = np.flatnonzero((starts >= lo) & (ends <= hi))
            if len(inside) < 2 or ends[-1] != hi + len(after):  # not plain ASCII: skip
                continue
            k0, k1 = int(inside[0]), int(inside[-1])
            found.add((tuple(ids[k0:k1 + 1]), marker[: starts[k0] - lo], marker[ends[k1] - lo:]))
    return [LiteralPattern(np.asarray(core, np.int64), vocab.ending(head) if head else None,
                    vocab.starting(rest) if rest else None)
            for core, head, rest in sorted(found)]


# -- the scan: every per-sample figure, one shard at a time ---------------------------------


@dataclass
class Scan:
    """Per-sample figures for the whole dataset, in commit order."""

    ids: list[str] = field(default_factory=list)
    partition: list[np.ndarray] = field(default_factory=list)
    parts: dict[str, int] = field(default_factory=dict)
    cols: dict[str, list[np.ndarray]] = field(default_factory=dict)
    meta: list[dict] = field(default_factory=list)
    violations: dict[str, int] = field(default_factory=dict)
    """The invariant violations gen recorded (metadata.violations), numbers taken out, with
    how many samples recorded each."""

    def add(self, **arrays: np.ndarray) -> None:
        for k, v in arrays.items():
            self.cols.setdefault(k, []).append(v)

    def finish(self) -> dict[str, np.ndarray]:
        return {k: np.concatenate(v) for k, v in self.cols.items()}


def _count_in(pos: np.ndarray, owner: np.ndarray, lo: np.ndarray, n: int) -> np.ndarray:
    """How many of the positions `pos` (owned by sample `owner`) are >= lo[owner]."""
    keep = pos >= lo[owner]
    return np.bincount(owner[keep], minlength=n)


def _first_in(pos: np.ndarray, owner: np.ndarray, lo: np.ndarray, n: int) -> np.ndarray:
    """The first position >= lo[owner] of each sample; -1 when none."""
    keep = pos >= lo[owner]
    out = np.full(n, -1, np.int64)
    pos, owner = pos[keep], owner[keep]
    first_owner, at = np.unique(owner, return_index=True)
    out[first_owner] = pos[at]
    return out


def _positions(tokens: np.ndarray, token: int | None, offsets: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
    if token is None:
        empty = np.zeros(0, np.int64)
        return empty, empty
    pos = np.flatnonzero(tokens == token)
    return pos, np.searchsorted(offsets, pos, side="right") - 1


def _literal_hits(tokens: np.ndarray, prof: Profile) -> np.ndarray:
    """Start positions of every marker written as plain text."""
    hits = []
    firsts: dict[int, np.ndarray] = {}  # many patterns share a first id ("<", "|")
    for pat in prof.literal:
        core, k = pat.core, len(pat.core)
        if len(tokens) <= k:
            continue
        if int(core[0]) not in firsts:
            firsts[int(core[0])] = np.flatnonzero(tokens == core[0])
        cand = firsts[int(core[0])]
        cand = cand[cand < len(tokens) - k - (pat.after is not None) + 1]
        for j in range(1, k):
            cand = cand[tokens[cand + j] == core[j]]
        if pat.before is not None:
            cand = cand[cand > 0]
            cand = cand[np.isin(tokens[cand - 1], pat.before)]
        if pat.after is not None:
            cand = cand[np.isin(tokens[cand + k], pat.after)]
        hits.append(cand)
    return np.unique(np.concatenate(hits)) if hits else np.zeros(0, np.int64)


def _seq_starts(tokens: np.ndarray, seq: np.ndarray | None, offsets: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """Where the id sequence `seq` starts in `tokens`, and the sample of each start (a
    sequence that runs into the next sample is not counted)."""
    if seq is None or not len(seq) or len(tokens) < len(seq):
        empty = np.zeros(0, np.int64)
        return empty, empty
    k = len(seq)
    cand = np.flatnonzero(tokens[: len(tokens) - k + 1] == seq[0])
    for j in range(1, k):
        cand = cand[tokens[cand + j] == seq[j]]
    owner = np.searchsorted(offsets, cand, side="right") - 1
    keep = cand + k <= offsets[owner + 1]
    return cand[keep], owner[keep]


def _loop_hits(tokens: np.ndarray, comp_start: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Samples whose completion holds a run of LOOP_MIN_TOKENS tokens each equal to the one a
    period (1..LOOP_MAX_PERIOD) earlier: the same phrase repeated over and over."""
    n = len(offsets) - 1
    flagged = np.zeros(n, bool)
    for p in range(1, LOOP_MAX_PERIOD + 1):
        if len(tokens) <= p + LOOP_MIN_TOKENS:
            break
        eq = np.flatnonzero(tokens[p:] == tokens[:-p])  # tokens[j + p] == tokens[j]
        if len(eq) < LOOP_MIN_TOKENS:
            continue
        # Runs of consecutive positions: a loop is LOOP_MIN_TOKENS in a row.
        breaks = np.flatnonzero(np.diff(eq) != 1)
        starts = np.concatenate([[0], breaks + 1])
        ends = np.concatenate([breaks, [len(eq) - 1]])
        long = (ends - starts + 1) >= LOOP_MIN_TOKENS
        for s, e in zip(eq[starts[long]], eq[ends[long]], strict=True):
            owner = np.searchsorted(offsets, s, side="right") - 1
            if s >= comp_start[owner] and e + p < offsets[owner + 1]:
                flagged[owner] = True
    return flagged


def scan(ds: Dataset, prof: Profile, want_meta: bool) -> tuple[Scan, dict[str, np.ndarray]]:
    out = Scan()
    finish_code = {"stop": 0, "length": 1}
    for shard in ds.iter_shards():
        tokens = np.asarray(shard.tokens, np.int64)
        offsets = np.asarray(shard.offsets, np.int64)
        n = len(offsets) - 1
        plen = np.asarray(shard.prompt_lens, np.int64)
        c0 = offsets[:-1] + plen
        end = offsets[1:]
        meta = shard.meta
        out.ids.extend(shard.ids)
        gidx = np.asarray([out.parts.setdefault(p, len(out.parts))
                           for p in shard.partition_names], np.int64)
        out.partition.append(gidx[np.asarray(shard.partition_index, np.int64)]
                             if n else np.zeros(0, np.int64))
        finish = np.asarray([finish_code.get(m["finish_reason"], 2) for m in meta], np.int8)
        recon = np.asarray([bool(m.get("metadata", {}).get("reconstructed")) for m in meta], bool)
        violated = np.asarray([_note_violations(out, m) for m in meta], bool)
        if want_meta:
            out.meta.extend(meta)
        # Loss tokens per sample, from the span arrays.
        spans = np.asarray(shard.loss_spans, np.int64).reshape(-1, 2)
        span_off = np.asarray(shard.loss_span_offsets, np.int64)
        span_len = spans[:, 1] - spans[:, 0]
        span_owner = np.repeat(np.arange(n), np.diff(span_off))
        loss = np.bincount(span_owner, weights=span_len, minlength=n).astype(np.int64)
        prompt_loss = np.bincount(span_owner, minlength=n,
                                  weights=np.clip(plen[span_owner] - spans[:, 0], 0, span_len)
                                  ).astype(np.int64) if len(spans) else np.zeros(n, np.int64)
        cols: dict[str, np.ndarray] = dict(
            prompt_len=plen, comp_len=end - c0, finish=finish, reconstructed=recon, loss=loss,
            prompt_loss=prompt_loss, violated=violated)
        if prof.renderer is not None:
            outside = np.flatnonzero(tokens >= prof.vocab_size)
            cols["oov"] = np.bincount(np.searchsorted(offsets, outside, side="right") - 1,
                                      minlength=n)[:n]
            cols.update(_token_figures(tokens, offsets, c0, end, prof))
        out.add(**cols)
        del shard
    return out, out.finish() if out.cols else {}


def _note_violations(out: Scan, meta: dict) -> bool:
    recorded = meta.get("metadata", {}).get("violations")
    if not recorded:
        return False
    for v in recorded if isinstance(recorded, list) else [recorded]:
        kind = re.sub(r"-?\d+(\.\d+)?", "N", str(v))
        out.violations[kind] = out.violations.get(kind, 0) + 1
    return True


def _token_figures(tokens: np.ndarray, offsets: np.ndarray, c0: np.ndarray, end: np.ndarray,
                   prof: Profile) -> dict[str, np.ndarray]:
    """Marker counts and positions in each final turn, and what lies between them."""
    n = len(c0)
    L = len(prof.tail)
    r0 = np.maximum(c0 - L, offsets[:-1])
    tail_ok = np.ones(n, bool)
    if L:
        pl = c0 - offsets[:-1]
        tail_ok = pl >= L
        for j in range(L):
            idx = np.clip(c0 - L + j, 0, max(len(tokens) - 1, 0))
            tail_ok &= tokens[idx] == prof.tail[j] if len(tokens) else False
    nonempty = end > c0
    last = tokens[np.clip(end - 1, 0, max(len(tokens) - 1, 0))] if len(tokens) else \
        np.zeros(n, np.int64)
    ends_stop = nonempty & np.isin(last, prof.stop_ids)
    content = np.arange(len(tokens) + 1)
    if prof.blank is not None:
        # An id past the vocabulary (the vocabulary check names it) counts as content here.
        blank = np.append(prof.blank, False)
        content = np.concatenate([[0], np.cumsum(~blank[np.minimum(tokens, len(blank) - 1)])])
    figures: dict[str, np.ndarray] = dict(tail_ok=tail_ok, ends_stop=ends_stop)
    ans_end = end - ends_stop
    if prof.analysis is not None:
        figures.update(_channel_figures(tokens, offsets, r0, end, ans_end, content, prof))
        figures["tool_call"] = ends_stop & np.isin(last, prof.call_end)
    elif prof.markers:
        sp, so = _positions(tokens, prof.start, offsets)
        ep, eo = _positions(tokens, prof.end, offsets)
        n_start = _count_in(sp, so, r0, n)
        n_end = _count_in(ep, eo, r0, n)
        first_s = _first_in(sp, so, r0, n)
        first_e = _first_in(ep, eo, r0, n)
        has_e = first_e >= 0
        # Reasoning: after think-start up to think-end (or the end, when never closed).
        r_lo = np.where(first_s >= 0, first_s + 1, end)
        r_hi = np.where(has_e, first_e, end)
        reasoning = np.where(r_hi > r_lo, content[np.maximum(r_hi, r_lo)] - content[r_lo], 0)
        a_lo = np.where(has_e, first_e + 1, ans_end)
        after_end = np.maximum(ans_end - a_lo, 0)
        answer = content[np.maximum(ans_end, a_lo)] - content[a_lo]
        open_at_end = n_start > n_end
        figures.update(n_start=n_start, n_end=n_end, order_ok=~(has_e & (first_e < first_s)),
                       reasoning=reasoning, after_end=after_end, answer=answer,
                       open_at_end=open_at_end)
    else:
        figures.update(answer=content[ans_end] - content[c0], after_end=ans_end - c0)
    lit = _literal_hits(tokens, prof)
    figures["literal"] = np.bincount(np.searchsorted(offsets, lit, side="right") - 1,
                                     minlength=n)[:n]
    figures["loop"] = _loop_hits(tokens, c0, offsets)
    return figures


def _channel_figures(tokens: np.ndarray, offsets: np.ndarray, r0: np.ndarray,
                     end: np.ndarray, ans_end: np.ndarray, content: np.ndarray,
                     prof: Profile) -> dict[str, np.ndarray]:
    """The harmony counterpart of the think-marker figures: the analysis channel's header
    plays think-start, the final channel's header think-end (same column names, so the
    checks read both alike), plus whether the analysis message was closed by `<|end|>`."""
    assert prof.analysis is not None
    n = len(r0)
    ap, ao = _seq_starts(tokens, prof.analysis, offsets)
    fp, fo = _seq_starts(tokens, prof.final, offsets)
    n_a = _count_in(ap, ao, r0, n)
    n_f = _count_in(fp, fo, r0, n)
    first_a = _first_in(ap, ao, r0, n)
    first_f = _first_in(fp, fo, r0, n)
    has_a, has_f = first_a >= 0, first_f >= 0
    final_after = has_a & has_f & (first_f > first_a)
    # Reasoning: the analysis body, from its header to the first <|end|> after it (or the
    # final header, or the end of the sample when never closed).
    body = np.where(has_a, first_a + len(prof.analysis), end)
    r_hi = np.where(final_after, first_f, end)
    k = len(prof.analysis_end)
    closed = np.ones(n, bool)
    if k and len(tokens):
        cp, _ = _seq_starts(tokens, prof.analysis_end, offsets)
        if len(cp):
            at = np.searchsorted(cp, body)
            r_hi = np.minimum(r_hi, np.where(at < len(cp), cp[np.minimum(at, len(cp) - 1)],
                                             r_hi))
        # The final header must follow the analysis end: `...<|end|><|start|>assistant...`.
        closed = first_f - k >= body
        for j in range(k):
            closed &= tokens[np.clip(first_f - k + j, 0, len(tokens) - 1)] == prof.analysis_end[j]
    r_hi = np.maximum(r_hi, body)
    a_lo = np.where(has_f, first_f + len(prof.final if prof.final is not None else ()), ans_end)
    return dict(n_start=n_a, n_end=n_f, order_ok=~(has_a & has_f & (first_f < first_a)),
                unclosed=final_after & ~closed,
                reasoning=content[r_hi] - content[np.minimum(body, r_hi)],
                after_end=np.maximum(ans_end - a_lo, 0),
                answer=content[np.maximum(ans_end, a_lo)] - content[np.minimum(a_lo, ans_end)],
                open_at_end=n_a > n_f)


# -- the checks -----------------------------------------------------------------------------


def _result(name: str, mask: np.ndarray, scope: np.ndarray, ids: list[str], detail: str,
            reasons: dict[str, np.ndarray] | None = None, threshold: float | None = None,
            fail_above: float | None = 0.0) -> CheckResult:
    flagged = np.flatnonzero(mask & scope)
    total = int(scope.sum())
    rate = len(flagged) / total if total else 0.0
    failed = fail_above is not None and rate > fail_above
    return CheckResult(
        name, "fail" if failed else "pass", detail, failing=len(flagged), total=total,
        threshold=threshold, rate=round(rate, 6), examples=[ids[i] for i in flagged[:EXAMPLES]],
        reasons={k: int((v & scope).sum()) for k, v in (reasons or {}).items()
                 if (v & scope).any()},
        flagged=flagged)


def _skip(name: str, why: str) -> CheckResult:
    return CheckResult(name, "skip", why)


def check_integrity(ds: Dataset, sc: Scan, f: dict[str, np.ndarray], prof: Profile
                    ) -> CheckResult:
    problems: dict[str, int] = {}
    n = len(sc.ids)
    flagged = np.zeros(n, bool)
    ids = np.asarray(sc.ids, dtype=object)
    _, first, counts = np.unique(ids, return_index=True, return_counts=True)
    if (counts > 1).any():
        dup = ~np.isin(np.arange(n), first)
        flagged |= dup
        problems["duplicate sample ids"] = int(dup.sum())
    tokens = int((f["prompt_len"] + f["comp_len"]).sum()) if n else 0
    if tokens != ds.num_tokens or n != len(ds):
        problems["counts differ from the manifest"] = 1
    loss = int(f["loss"].sum()) if n else 0
    if loss != sum(s.get("loss_tokens", loss) for s in ds.shards) and ds.shards:
        problems["loss tokens differ from the manifest"] = 1
    config = ds.manifest.get("config", {})
    history = [c for c in ds.manifest.get("config_history", []) if c]
    renderings = {json.dumps((c or {}).get("renderer"), sort_keys=True)
                  for c in [config, *history]}
    if len(renderings) > 1:
        problems["several tokenizers or templates (continued with --force)"] = 1
    recorded = config.get("renderer") or {}
    if (prof.renderer is not None and recorded.get("chat_template_xxh3")
            and prof.renderer.identity()["chat_template_xxh3"] != recorded["chat_template_xxh3"]):
        problems["the template used differs from the one recorded"] = 1
    detail = ("checksums, counts, ids and tokenizer agree" if not problems
              else "; ".join(f"{k} ({v})" if v > 1 else k for k, v in problems.items()))
    res = _result("integrity", flagged, np.ones(n, bool), sc.ids, detail)
    res.reasons = problems
    if problems:
        res.status = "fail"
    return res


def check_structure(f: dict[str, np.ndarray], ids: list[str], prof: Profile) -> CheckResult:
    finish = f["finish"]
    scope = finish <= 1
    stop = finish == 0
    reasons: dict[str, np.ndarray] = {
        "prompt does not end with the generation prompt": ~f["tail_ok"],
        "no end-of-turn token last": stop & ~f["ends_stop"],
    }
    if prof.analysis is not None:
        answering = stop & ~f["tool_call"]  # a tool-call turn ends at <|call|>, no final
        reasons.update({
            "analysis channel missing": f["n_start"] == 0,
            "analysis channel repeated": f["n_start"] > 1,
            "final channel missing": answering & (f["n_end"] == 0),
            "final channel repeated": f["n_end"] > 1,
            "final channel before the analysis": ~f["order_ok"],
            "analysis not closed before the final channel": f["unclosed"],
            "no content after the final channel": answering & (f["n_end"] == 1)
            & (f["after_end"] == 0),
        })
        what = ("the analysis channel once, the final channel once after it, an answer, "
                "end-of-turn last")
    elif prof.markers:
        reasons.update({
            "think-start missing": f["n_start"] == 0,
            "think-start repeated": f["n_start"] > 1,
            "think-end missing": stop & (f["n_end"] == 0),
            "think-end repeated": f["n_end"] > 1,
            "think-end before think-start": ~f["order_ok"],
            "no content after think-end": stop & (f["n_end"] == 1) & (f["after_end"] == 0),
        })
        what = (f"{prof.start_text} once, {prof.end_text} once after it, an answer, "
                "end-of-turn last")
    else:
        what = "generation prompt, then end-of-turn last (no reasoning markers: those skipped)"
    mask = np.zeros(len(finish), bool)
    for v in reasons.values():
        mask |= v
    return _result("structure", mask, scope, ids, what, reasons)


def check_literal(f: dict[str, np.ndarray], ids: list[str], prof: Profile) -> CheckResult:
    scope = np.ones(len(f["finish"]), bool)
    return _result("literal_markers", f["literal"] > 0, scope, ids,
                   f"{' / '.join(prof.literal_names)} never written as plain text")


def check_truncation(f: dict[str, np.ndarray], ids: list[str], cfg: ValidateConfig,
                     parts: list[str], part: np.ndarray) -> CheckResult:
    length = f["finish"] == 1
    scope = f["finish"] <= 1
    reasons = {}
    if "open_at_end" in f:
        reasons = {"cut inside the reasoning": length & f["open_at_end"],
                   "cut inside the answer": length & ~f["open_at_end"]}
    res = _result("truncation", length, scope, ids, "", reasons, threshold=cfg.max_truncation,
                  fail_above=cfg.max_truncation)
    over = [p for i, p in enumerate(parts)
            if (scope & (part == i)).any()
            and (length & (part == i)).sum() / (scope & (part == i)).sum() > cfg.max_truncation]
    res.detail = (f"{res.rate:.1%} finished by length (max {cfg.max_truncation:.0%})"
                  + (f"; over the limit in {', '.join(over)}" if over else ""))
    return res


def check_reasoning(f: dict[str, np.ndarray], ids: list[str], cfg: ValidateConfig
                    ) -> CheckResult:
    scope = f["finish"] <= 1
    has = f["reasoning"] > 0
    res = _result("reasoning", ~has, scope, ids, "", threshold=cfg.min_reasoning,
                  fail_above=None)
    share = 1 - res.rate if res.total else 0.0
    res.rate = round(share, 6)
    res.status = "fail" if res.total and share < cfg.min_reasoning else "pass"
    res.detail = f"{share:.1%} with non-empty reasoning (min {cfg.min_reasoning:.0%})"
    return res


def check_degenerate(f: dict[str, np.ndarray], ids: list[str], prof: Profile) -> CheckResult:
    stop = f["finish"] == 0
    scope = f["finish"] <= 1
    reasons = {"repeated n-gram loop": f["loop"]}
    if prof.markers:
        closed = f["n_end"] >= 1  # think-end, or the final channel's header
        answering = stop & ~f["tool_call"] if "tool_call" in f else stop
        reasons["empty answer"] = stop & closed & (f["answer"] == 0)
        reasons["all reasoning, no answer"] = answering & (f["n_start"] >= 1) & ~closed
    else:
        reasons["empty answer"] = stop & (f["answer"] == 0)
    mask = np.zeros(len(stop), bool)
    for v in reasons.values():
        mask |= v
    return _result("degenerate", mask, scope, ids,
                   f"empty answers, loops (a {LOOP_MAX_PERIOD}-token unit or shorter repeated "
                   f"over {LOOP_MIN_TOKENS} tokens), reasoning with no answer", reasons)


def check_round_trip(ds: Dataset, sc: Scan, prof: Profile) -> CheckResult:
    stored = [i for i, m in enumerate(sc.meta)
              if isinstance(m.get("metadata", {}).get("messages"), list)]
    if not stored:
        return _skip("round_trip", "skipped: the dataset stores no source messages "
                                   "(metadata.messages)")
    from eagle3kit.gen.render import RenderError

    renderer = prof.renderer
    assert renderer is not None
    bad = np.zeros(len(sc.ids), bool)
    scope = np.zeros(len(sc.ids), bool)
    scope[stored] = True
    # gpt-oss's template writes today's date into its system message: a prompt rendered on
    # another day differs from today's rendering there only, and that is no defect.
    dated = "strftime_now" in str(renderer.template or renderer.tokenizer.chat_template or "")
    other_day = 0
    rendered: list[tuple[int, str]] = []
    for i in stored:
        meta = sc.meta[i]["metadata"]
        try:
            rendered.append((i, renderer.render_text(meta["messages"], meta.get("tools"))))
        except RenderError:
            bad[i] = True
    for i, ids in _encode_all(renderer, rendered):
        view = ds.token_view(i)
        prompt = view.input_ids[: view.prompt_len]
        bad[i] = view.prompt_len != len(ids) or not np.array_equal(prompt, ids)
        decodable = prompt.max(initial=0) < prof.vocab_size
        if bad[i] and dated and decodable and (DATE.sub("", renderer.decode(prompt.tolist()))
                                               == DATE.sub("", renderer.decode(ids))):
            bad[i] = False
            other_day += 1
    detail = "prompt ids equal the template's rendering of the stored messages"
    if other_day:
        detail += f" ({other_day:,} rendered on another day: the template writes the date)"
    return _result("round_trip", bad, scope, sc.ids, detail)


def _encode_all(renderer: Renderer, texts: list[tuple[int, str]], batch: int = 256
                ) -> Iterator[tuple[int, list[int]]]:
    """`renderer.encode` over many texts, a batch per tokenizer call: one call per text
    costs more in Python overhead than the tokenizing itself."""
    for at in range(0, len(texts), batch):
        chunk = texts[at:at + batch]
        encoded = renderer.tokenizer([t for _, t in chunk], add_special_tokens=False)
        for (i, _), ids in zip(chunk, encoded["input_ids"], strict=True):
            yield i, list(ids)


def check_coverage(f: dict[str, np.ndarray], ids: list[str]) -> CheckResult:
    scope = (f["finish"] <= 1) & (f["comp_len"] > 0)
    no_loss = f["loss"] == 0
    total = int(f["loss"].sum())
    res = _result("coverage", no_loss, scope, ids, "", {"no loss tokens": no_loss})
    res.detail = (f"{total:,} loss tokens; {int(f['prompt_loss'].sum()):,} of them on prompt "
                  "positions")
    if total == 0:
        res.status = "fail"
    return res


def check_reconstructed(ds: Dataset, f: dict[str, np.ndarray], ids: list[str]) -> CheckResult:
    text_api = ds.manifest.get("config", {}).get("api_family") == "text"
    mask = f["reconstructed"] | text_api
    return _result("reconstructed", mask, np.ones(len(ids), bool), ids,
                   "token ids as the server returned them, not rebuilt from text")


def check_vocabulary(f: dict[str, np.ndarray], ids: list[str], prof: Profile) -> CheckResult:
    """Ids the tokenizer has no entry for: a server that answered garbage, or a dataset made
    with another tokenizer. gen flags them as violations; convert takes what the file says."""
    res = _result("vocabulary", f["oov"] > 0, np.ones(len(ids), bool), ids,
                  f"every id below the tokenizer's {prof.vocab_size:,} entries")
    total = int(f["oov"].sum())
    if total:
        res.reasons = {"ids outside the vocabulary": total}
    return res


def check_invariants(f: dict[str, np.ndarray], ids: list[str], sc: Scan) -> CheckResult:
    """The answers gen stored or skipped while recording that they broke a server invariant
    (reference/SERVER_APIS.md §4: counts that disagree, ids out of range...)."""
    res = _result("invariants", f["violated"], np.ones(len(ids), bool), ids,
                  "no answer recorded breaking the server invariants when it was generated")
    top = sorted(sc.violations.items(), key=lambda kv: -kv[1])
    res.reasons = dict(top[:EXAMPLES])
    return res


# -- run ------------------------------------------------------------------------------------


def _partitions(sc: Scan, f: dict[str, np.ndarray]) -> dict[str, dict]:
    part = np.concatenate(sc.partition) if sc.partition else np.zeros(0, np.int64)
    out = {}
    lengths = f["prompt_len"] + f["comp_len"]
    for name, i in sorted(sc.parts.items()):
        m = part == i
        fin = m & (f["finish"] <= 1)
        lens = lengths[m]
        out[name] = {
            "samples": int(m.sum()), "tokens": int(lens.sum()),
            "loss_tokens": int(f["loss"][m].sum()),
            "truncated": round(float((f["finish"][m] == 1).sum() / max(fin.sum(), 1)), 4),
            "reasoning": (round(float((f["reasoning"][fin] > 0).mean()), 4)
                          if "reasoning" in f and fin.any() else None),
            "length_p50": int(np.percentile(lens, 50)) if len(lens) else 0,
            "length_p90": int(np.percentile(lens, 90)) if len(lens) else 0,
            "length_max": int(lens.max()) if len(lens) else 0,
            "histogram": _histogram(lens),
        }
    return out


def _histogram(lengths: np.ndarray) -> dict[str, int]:
    """Sample counts per power-of-two length bucket ("<=256", "<=512", ...)."""
    if not len(lengths):
        return {}
    edges = 2 ** np.arange(5, max(6, int(np.ceil(np.log2(max(lengths.max(), 2)))) + 1))
    counts = np.bincount(np.searchsorted(edges, lengths), minlength=len(edges))[: len(edges)]
    return {f"<={e}": int(c) for e, c in zip(edges, counts, strict=True)}


def validate(cfg: ValidateConfig) -> ValidateReport:
    ds = Dataset(cfg.path, kind="tokens", verify_shards=False)
    if len(ds) == 0:
        raise DatasetError(f"{cfg.path}: the dataset holds no samples; nothing to validate")
    problems = ds.check_files() or ds.verify()
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise DatasetError(f"{problems[0]}{more}; the dataset cannot be validated until the "
                           "shard is restored or the run that wrote it is repeated")
    selected = cfg.selected()
    prof = load_profile(cfg, ds)
    sc, f = scan(ds, prof, want_meta="round_trip" in selected and prof.renderer is not None)
    parts = [p for p, _ in sorted(sc.parts.items(), key=lambda kv: kv[1])]
    part = np.concatenate(sc.partition)
    checks: list[CheckResult] = []
    no_tok = prof.why_none or ""
    for name in selected:
        needs_tok = name in ("structure", "literal_markers", "reasoning", "degenerate",
                             "round_trip")
        if needs_tok and prof.renderer is None:
            checks.append(_skip(name, f"skipped: {no_tok}"))
        elif name == "integrity":
            checks.append(check_integrity(ds, sc, f, prof))
        elif name == "structure":
            checks.append(check_structure(f, sc.ids, prof))
        elif name == "literal_markers":
            checks.append(check_literal(f, sc.ids, prof) if prof.markers else _skip(
                name, "skipped: the tokenizer has no reasoning markers"))
        elif name == "truncation":
            checks.append(check_truncation(f, sc.ids, cfg, parts, part))
        elif name == "reasoning":
            checks.append(
                _skip(name, "skipped: the tokenizer has no reasoning markers")
                if not prof.markers else
                _skip(name, "skipped: thinking is off (the template closes the reasoning "
                            "block in the prompt)") if prof.thinking_off else
                check_reasoning(f, sc.ids, cfg))
        elif name == "degenerate":
            checks.append(check_degenerate(f, sc.ids, prof))
        elif name == "round_trip":
            checks.append(check_round_trip(ds, sc, prof))
        elif name == "coverage":
            checks.append(check_coverage(f, sc.ids))
        elif name == "reconstructed":
            checks.append(check_reconstructed(ds, f, sc.ids))
        elif name == "vocabulary":
            checks.append(_skip(name, f"skipped: {no_tok}") if prof.renderer is None
                          else check_vocabulary(f, sc.ids, prof))
        elif name == "invariants":
            checks.append(check_invariants(f, sc.ids, sc))
    warnings = []
    if prof.harmony and prof.analysis is None:
        warnings.append("gpt-oss harmony tokens, but the chat template shows no analysis "
                        "channel for a reasoning turn: the reasoning checks are skipped")
    return ValidateReport(path=str(cfg.path), samples=len(ds), tokens=ds.num_tokens,
                          profile=prof.describe(), checks=checks,
                          partitions=_partitions(sc, f), warnings=warnings)


def write_clean(cfg: ValidateConfig, report: ValidateReport) -> dict:
    """Copy every sample no check flagged into cfg.write_clean; the input is not touched."""
    assert cfg.write_clean is not None
    flagged: set[int] = set()
    for c in report.checks:
        flagged.update(c.flagged.tolist())
    ds = Dataset(cfg.path, verify_shards=False)
    kept = 0
    config = dict(ds.manifest.get("config", {}))
    provenance = {**ds.manifest.get("provenance", {}), "cleaned_from": str(cfg.path),
                  "removed_samples": len(flagged)}
    with DatasetWriter(cfg.write_clean, config=config, provenance=provenance) as writer:
        stored = cfg.path / "tokenizer"
        if stored.is_dir():
            writer.store_files("tokenizer", sorted(p for p in stored.iterdir() if p.is_file()))
        for i, sample in enumerate(ds.iter_samples()):
            if i not in flagged:
                kept += writer.add(sample)
    return {"path": str(cfg.write_clean), "kept": kept, "removed": len(flagged)}


def _sparkline(hist: dict[str, int]) -> str:
    bars = " ▁▂▃▄▅▆▇█"
    top = max(hist.values(), default=0)
    if not top:
        return ""
    return "".join(bars[int(np.ceil(8 * v / top))] for v in hist.values())


def show(report: ValidateReport, opts: _ui.OutputOptions) -> None:
    prof = report.profile
    _ui.kv(f"{report.path}: {report.samples:,} samples, {report.tokens:,} tokens",
           [(k, repr(v) if k == "generation_prompt" else v) for k, v in prof.items()
            if v is not None and k != "stop_token_ids"]
           + [("stop token ids", ", ".join(map(str, prof.get("stop_token_ids") or [])))], opts)
    rows = []
    for name, p in report.partitions.items():
        hist = p["histogram"]
        span = f" {next(iter(hist))}..{list(hist)[-1]}" if hist else ""
        rows.append([name, p["samples"], p["tokens"], p["loss_tokens"],
                     f"{p['truncated']:.1%}",
                     f"{p['reasoning']:.1%}" if p["reasoning"] is not None else None,
                     p["length_p50"], p["length_p90"], p["length_max"],
                     _sparkline(hist) + span])
    _ui.table("partitions", ["partition", "samples", "tokens", "loss tokens", "truncated",
                             "reasoning", "p50", "p90", "max", "lengths (x2 buckets)"], rows, opts)
    items = []
    for c in report.checks:
        detail = c.detail
        if c.status != "skip":
            detail = f"{c.failing:,}/{c.total:,} flagged  {detail}"
            if c.reasons:
                detail += "  [" + ", ".join(f"{k} {v:,}" for k, v in c.reasons.items()) + "]"
            if c.examples and c.failing:
                detail += f"  e.g. {', '.join(c.examples[:3])}"
        items.append(({"pass": True, "fail": False}.get(c.status), TITLES[c.name], detail))
    for w in report.warnings:
        _ui.warn(w)
    _ui.checklist(items, opts)
    _ui.info(report.summary(), opts)
    if report.clean:
        _ui.info(f"clean copy: {report.clean['kept']:,} samples written to "
                 f"{report.clean['path']} ({report.clean['removed']:,} left out)", opts)


def run(cfg: ValidateConfig) -> ValidateReport:
    report = validate(cfg)
    if cfg.write_clean is not None:
        report.clean = write_clean(cfg, report)
    if cfg.output.json:
        _ui.print_json(report.to_dict())
    else:
        show(report, cfg.output)
    return report

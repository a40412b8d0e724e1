"""Chat-template rendering: the exact prompt ids the target sees, and where its turns end.

gen renders client-side with the target's own tokenizer and sends ids (DESIGN.md, "Token ids
are the data"). A prompt is the template's text with the generation prompt, tokenized with
add_special_tokens=False: the template writes BOS itself where it wants one, so letting the
tokenizer add another would give the model a sequence it never sees in serving. A think token
the template appends (QwQ, DeepSeek-R1, Qwen3 with thinking off) is therefore part of the
prompt ids, and only the rest is generated.

The tokenizer itself is loaded by tokenizer.py; gpt-oss's harmony answers are read back by
harmony.py. transformers is imported inside the functions that need it, so importing this
module is free.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import xxhash

from eagle3kit.chat.conversation import Conversation, generation_points, is_placeholder
from eagle3kit.chat.markers import HARMONY_TOKENS, think_pair
from eagle3kit.errors import UserError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase
from eagle3kit.chat.harmony import harmony_message
from eagle3kit.chat.tokenizer import (
    TOKENIZER_FILE_GLOBS,
    TOKENIZER_FILE_NAMES,
    eos_ids,
    load_tokenizer,
    special_ids,
)

# Probe turns for learning a template's end-of-turn token; texts no template rewrites.
PROBE_QUESTION = "eagle3kit probe question"
PROBE_ANSWER = "eagle3kit probe answer"
PROBE_ARGUMENT = "eagle3kit probe argument"
PROBE_REASONING = "eagle3kit probe reasoning"

# What a template can raise on messages it cannot render: jinja's own errors (raise_exception
# included) and the Python errors of expressions like `None + "text"`.
TEMPLATE_ERRORS: tuple[type[Exception], ...] = (
    TypeError,
    KeyError,
    IndexError,
    AttributeError,
    ValueError,
)


class RenderError(ValueError):
    """The chat template refused a conversation (a bad record, not a bad setup)."""


class Renderer:
    """A tokenizer and chat template, applied exactly as the target's server would."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        template: str | None = None,
        *,
        template_file: Path | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        system: str | None = None,
    ) -> None:
        """Wrap a loaded tokenizer; `template` (text) overrides the tokenizer's own template.
        `Renderer.load` is the entry point that checks paths and flags."""
        self.tokenizer = tokenizer
        self.template = template
        self.template_file = template_file
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.system = system
        self.vocab_size = len(tokenizer)
        self.think = think_pair(tokenizer.get_vocab())
        self.harmony = set(HARMONY_TOKENS) <= tokenizer.get_added_vocab().keys()
        # Rendering a one-question prompt also checks that the template works at all.
        prompt = self.render_text([{"role": "user", "content": PROBE_QUESTION}])
        self.prompt_opens_think = self._opens_think(prompt[prompt.rfind(PROBE_QUESTION) :])
        self.stop_token_ids = _unique(eos_ids(tokenizer) + self._end_of_turn_ids())
        self.parses_answers = self._parses_answers()

    @classmethod
    def load(
        cls,
        tokenizer: Path,
        *,
        chat_template: Path | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        system: str | None = None,
        trust_remote_code: bool = False,
        flag: str = "--tokenizer",
    ) -> Renderer:
        """Load `--tokenizer` (a local directory) and `--chat-template`; every problem is a
        UserError naming its flag (`flag`: the one that named the tokenizer, gen's --target
        under --engine hf)."""
        kwargs = _check_kwargs(chat_template_kwargs)
        template = read_template(chat_template) if chat_template is not None else None
        tok = load_tokenizer(Path(tokenizer), trust_remote_code, flag)
        if template is None and not tok.chat_template:
            raise UserError(
                f"--tokenizer {tokenizer}: it has no chat template; pass --chat-template FILE"
            )
        flag = f"--chat-template {chat_template}" if chat_template else f"--tokenizer {tokenizer}"
        try:
            return cls(
                tok,
                template,
                template_file=chat_template,
                chat_template_kwargs=kwargs,
                system=system,
            )
        except RenderError as exc:  # the template breaks on the plainest conversation
            raise UserError(f"{flag}: the chat template fails: {exc}") from None

    # -- rendering -------------------------------------------------------------------------

    def render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        """The prompt ids: the template with the generation prompt, tokenized as is."""
        return self.encode(self.render_text(messages, tools))

    def render_text(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> str:
        """The prompt as text; `--system` goes first when the conversation has none."""
        if self.system is not None and not any(_is_system(m) for m in messages):
            messages = [{"role": "system", "content": self.system}, *messages]
        return self._apply(messages, tools, add_generation_prompt=True)

    def encode(self, text: str) -> list[int]:
        """Text to ids with no BOS/EOS added: special-token strings become their ids."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        """Ids to text with every special token kept, so the text encodes back to the ids."""
        return str(
            self.tokenizer.decode(
                list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
        )

    def _apply(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
    ) -> str:
        from jinja2 import TemplateError, TemplateSyntaxError

        refused: tuple[type[Exception], ...] = (TemplateError, *TEMPLATE_ERRORS)
        try:
            text = self.tokenizer.apply_chat_template(
                messages,
                tools=tools,  # type: ignore[arg-type]  # transformers: list[dict | Callable], invariant, so a list[dict] is refused
                chat_template=self.template,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                **self.chat_template_kwargs,
            )
        except TemplateSyntaxError as exc:
            raise RenderError(f"line {exc.lineno}: {exc.message}") from None
        except refused as exc:
            raise RenderError(f"{type(exc).__name__}: {exc}") from None
        return str(text)

    # -- multi-turn ------------------------------------------------------------------------

    def history(
        self, conv: Conversation, turn: int, own_answers: list[dict[str, Any]] | None
    ) -> list[dict[str, Any]]:
        """The messages before generation point `turn`, earlier assistant turns replaced by
        the model's own answers when given (else the dataset's)."""
        points = generation_points(conv)
        if not 0 <= turn < len(points):
            raise IndexError(
                f"{conv.source}:{conv.line}: no turn {turn} (the conversation has {len(points)})"
            )
        if own_answers is not None and len(own_answers) < turn:
            raise ValueError(
                f"{conv.source}:{conv.line}: turn {turn} needs {turn} own "
                f"answers, got {len(own_answers)}"
            )
        messages = [dict(m) for m in conv.messages[: points[turn]]]
        for i, point in enumerate(points[:turn]):
            if own_answers is not None:
                messages[point] = dict(own_answers[i])
            elif is_placeholder(messages[point]):
                raise ValueError(
                    f"{conv.source}:{conv.line}: turn {i} has no reference answer "
                    "(content null), so a later turn needs the model's own"
                )
        return messages

    def answer_message(self, completion_ids: list[int]) -> dict[str, Any]:
        """The model's answer as an assistant message for the next turn's history, shown as
        the template shows earlier answers (Qwen3, QwQ and R1 drop their reasoning).

        The final stop token is dropped and the rest decoded. A template that parses a raw
        answer itself gets it whole as `content`, so its own splitting and stripping apply;
        one that does not (Kimi-K2-Thinking) gets the reasoning split off into
        `reasoning_content`; gpt-oss gets its harmony channels as `thinking` and `content`.
        """
        ids = list(completion_ids)
        if ids and ids[-1] in self.stop_token_ids:
            ids = ids[:-1]
        text = self.decode(ids)
        if self.harmony:
            return harmony_message(text)
        if self.parses_answers:
            return {"role": "assistant", "content": text}
        message: dict[str, Any] = {"role": "assistant"}
        reasoning, message["content"] = self._split_reasoning(text)
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        return message

    def _split_reasoning(self, text: str) -> tuple[str | None, str]:
        """(reasoning, answer). Pieces are kept verbatim: templates strip their own way."""
        if self.think is None:
            return None, text
        start, end = self.think
        head, closed, answer = text.partition(end)
        if closed:
            return _after(head, start), answer
        if self.prompt_opens_think:  # cut off inside reasoning the prompt opened
            return text, ""
        if start in text:  # opened by the model, cut off before closing
            return _after(text, start), ""
        return None, text

    # -- what the template tells about turns -----------------------------------------------

    def _end_of_turn_ids(self) -> list[int]:
        """The special tokens that end an answer turn and a tool-call turn, learned from the
        template: render each as the last message and look at the tokens after its text."""
        user = {"role": "user", "content": PROBE_QUESTION}
        answer = {"role": "assistant", "content": PROBE_ANSWER}
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
        # An answer's end-of-turn comes right after its text; a template may add EOS after
        # it (Phi-3), so take the first special token. A tool call's text is followed by the
        # call's own closing tokens (Kimi's <|tool_call_end|>) and the turn ends at the last.
        after_answer = self._specials_after([user, answer], PROBE_ANSWER)
        after_call = self._specials_after([user, call], PROBE_ARGUMENT)
        return after_answer[:1] + after_call[-1:]

    def _specials_after(self, messages: list[dict[str, Any]], marker: str) -> list[int]:
        """The special-token ids after `marker` in the rendered messages; none when the
        template refuses or drops the probe (no tool support)."""
        try:
            text = self._apply(messages, None, add_generation_prompt=False)
        except RenderError:
            return []
        at = text.rfind(marker)
        if at < 0:
            return []
        special = special_ids(self.tokenizer)
        return [i for i in self.encode(text[at + len(marker) :]) if i in special]

    def _opens_think(self, prompt_tail: str) -> bool:
        """Whether the generation prompt ends inside a reasoning block (QwQ, R1), so that a
        completion without an end marker is all reasoning."""
        if self.think is None:
            return False
        start, end = self.think
        return prompt_tail.rfind(start) > prompt_tail.rfind(end)

    def _parses_answers(self) -> bool:
        """Whether the template takes a raw answer, reasoning and all, as content and shows
        only the answer part in history: then it is the best judge of how to split."""
        if self.think is None or self.harmony:
            return False
        start, end = self.think
        opening = "" if self.prompt_opens_think else f"{start}\n"
        raw = f"{opening}{PROBE_REASONING}\n{end}\n\n{PROBE_ANSWER}"
        messages = [
            {"role": "user", "content": PROBE_QUESTION},
            {"role": "assistant", "content": raw},
            {"role": "user", "content": PROBE_QUESTION},
        ]
        try:
            text = self._apply(messages, None, add_generation_prompt=True)
        except RenderError:
            return False
        return PROBE_REASONING not in text and PROBE_ANSWER in text

    # -- provenance ------------------------------------------------------------------------

    @property
    def tokenizer_dir(self) -> Path:
        return Path(self.tokenizer.name_or_path)

    def files(self) -> list[Path]:
        """The tokenizer's files and the template file used: what the dataset keeps a copy of."""
        found = [self.tokenizer_dir / n for n in TOKENIZER_FILE_NAMES]
        found = [p for p in found if p.is_file()]
        for pattern in TOKENIZER_FILE_GLOBS:
            found += sorted(p for p in self.tokenizer_dir.glob(pattern) if p.is_file())
        if self.template_file is not None:
            found.append(self.template_file)
        return found

    def identity(self) -> dict[str, Any]:
        """What decides the prompt ids, for the manifest and for refusing a changed resume."""
        return {
            "tokenizer": str(self.tokenizer.name_or_path),
            "tokenizer_files": {
                str(p.relative_to(self.tokenizer_dir)): _file_xxh3(p)
                for p in self.files()
                if p != self.template_file
            },
            "chat_template_file": str(self.template_file) if self.template_file else None,
            "chat_template_xxh3": xxhash.xxh3_128_hexdigest(self._template_text().encode()),
            "chat_template_kwargs": self.chat_template_kwargs,
            "system": self.system,
        }

    def _template_text(self) -> str:
        own = self.template if self.template is not None else self.tokenizer.chat_template
        # Several named templates (default, tool_use, ...) hash as one sorted JSON text.
        return own if isinstance(own, str) else json.dumps(own, sort_keys=True)


def think_markers(renderer: Renderer) -> tuple[str, str] | None:
    """The reasoning start and end markers, when the tokenizer has them as single tokens."""
    return renderer.think


def parse_chat_template_kwargs(text: str) -> dict[str, Any]:
    """The `--chat-template-kwargs` JSON text as a dict."""
    try:
        value = json.loads(text)
    except ValueError:
        value = text  # not JSON at all: the same message as for a JSON non-object
    return _check_kwargs(value)


def _check_kwargs(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UserError(
            "--chat-template-kwargs: not a JSON object (e.g. '{\"enable_thinking\": false}')"
        )
    return value


def read_template(path: Path) -> str:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--chat-template {path}: no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"--chat-template {path}: cannot read it: {exc}") from None
    return text


def _is_system(message: dict[str, Any]) -> bool:
    # gpt-oss and OpenAI's newer models call their system turn "developer".
    return message.get("role") in ("system", "developer")


def _after(text: str, start: str) -> str:
    return text.partition(start)[2] if start in text else text


def _file_xxh3(path: Path) -> str:
    return xxhash.xxh3_128_hexdigest(path.read_bytes())


def _unique(ids: list[int]) -> list[int]:
    return list(dict.fromkeys(ids))

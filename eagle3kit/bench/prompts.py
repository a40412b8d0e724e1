"""Prompts for bench: gen's readers and chat-template rendering, turn by turn.

A multi-turn conversation (MT-bench) is benchmarked as EAGLE's evaluation does it: each turn
is one generation whose history holds the model's own earlier answers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from eagle3kit import _ui
from eagle3kit._options import arg, opt
from eagle3kit.chat.conversation import Conversation, generation_points
from eagle3kit.chat.render import Renderer, RenderError
from eagle3kit.errors import UserError
from eagle3kit.gen import load_conversations, select


def load(
    paths: list[Path], fmt: str = "auto", max_samples: int | None = None
) -> list[Conversation]:
    convs, _ = load_conversations(paths, fmt=fmt)
    convs = select(convs, max_samples=max_samples)
    if not convs:
        raise UserError(f"{', '.join(map(str, paths))}: no prompts to run")
    return convs


def load_renderer(
    tokenizer: Path, flag: str, chat_template: Path | None = None, trust_remote_code: bool = False
) -> Renderer:
    """The tokenizer and template; errors name `flag` (--target when it is the target's)."""
    try:
        return Renderer.load(
            tokenizer, chat_template=chat_template, trust_remote_code=trust_remote_code
        )
    except UserError as exc:
        raise UserError(str(exc).replace("--tokenizer", flag, 1)) from None


def category(conv: Conversation) -> str:
    """The record's category field (EAGLE / MT-bench), else its partition (the file)."""
    value = conv.extra.get("category")
    return str(value) if value not in (None, "") else conv.partition


def label(conv: Conversation) -> str:
    return f"{conv.source}:{conv.line}"


def turns(
    renderer: Renderer, conv: Conversation, max_turns: int | None = None
) -> Iterator[tuple[int, Callable[[list[int]], None], list[int]]]:
    """(turn index, a callback taking that turn's answer ids, the turn's prompt ids) per turn.

    Call the callback with the generated ids before asking for the next turn: its history
    shows that answer as the template shows earlier answers.
    """
    answers: list[dict] = []
    count = len(generation_points(conv))
    for turn in range(count if max_turns is None else min(count, max_turns)):
        try:
            ids = renderer.render(renderer.history(conv, turn, answers), conv.tools)
        except (RenderError, ValueError) as exc:
            raise UserError(
                f"{label(conv)}: the chat template fails on turn {turn + 1}: {exc}"
            ) from None
        yield turn, lambda out: answers.append(renderer.answer_message(out)), ids


@dataclass(frozen=True)
class PromptSource:
    """One generation's worth of prompts for bench: a prompt file's conversation (turn by
    turn) or a context cut from a recorded sample (--context-from, one turn)."""

    label: str
    category: str
    conversation: Conversation | None = None
    ids: tuple[int, ...] | None = None

    def turns(
        self, renderer: Renderer, max_turns: int | None = None
    ) -> Iterator[tuple[int, Callable[[list[int]], None], list[int]]]:
        """As `turns` for a conversation; a ready context is one turn and takes no answer."""
        if self.conversation is not None:
            yield from turns(renderer, self.conversation, max_turns)
        else:
            assert self.ids is not None
            yield 0, lambda out: None, list(self.ids)


def sources(
    paths: list[Path],
    fmt: str,
    max_samples: int | None,
    context_from: Path | None,
    context_tokens: tuple[int | str, ...],
    vocab_size: int | None,
) -> list[PromptSource]:
    """The prompt files' conversations, then the contexts cut from --context-from."""
    out = [
        PromptSource(label(c), category(c), conversation=c)
        for c in (load(paths, fmt, max_samples) if paths else [])
    ]
    if context_from is not None:
        from eagle3kit.bench.contexts import from_dataset

        out += [
            PromptSource(c.label, c.category, ids=tuple(c.ids))
            for c in from_dataset(context_from, context_tokens, max_samples, vocab_size)
        ]
    return out


# The prompt files on each bench command's line, and what its config checks first ----------
PROMPTS_ARG = arg(metavar="PROMPTS...", optional=True)
"""Each bench command's prompt files: optional to the command line, so that the config
refuses their absence in its own words (and accept's and server's old --prompts FILE works)."""
PROMPTS_ALIAS = opt("--prompts", metavar="FILE", hidden=True)


def required(**values: object) -> None:
    """Refuse the first of `values` (by field name) the command line left out (None)."""
    for name, value in values.items():
        if value is None:
            raise UserError(f"--{name.replace('_', '-')} is required")


def prompt_files(
    given: list[Path] | None, alias: list[Path] | None = None, optional: bool = False
) -> list[Path]:
    """The prompt files: positional, as gen takes them; `--prompts FILE` (`alias`, the old
    spelling) still works, with a note. `optional`: none is fine (--context-from gives the
    prompts)."""
    if alias:
        _ui.warn("--prompts is deprecated: give the prompt files positionally, as gen takes them")
    files = [Path(p) for p in [*(given or []), *(alias or [])]]
    if not files and not optional:
        raise UserError(
            "give the prompt files (e.g. tests/data/prompts/eagle/mt_bench/question.jsonl)"
        )
    return files

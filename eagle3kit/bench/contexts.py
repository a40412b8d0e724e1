"""Deep contexts from recorded traces: bench prompts cut from a token dataset's samples.

Measuring acceptance 8K tokens into a reasoning trace needs 8K-token prompts of the kind the
target really continues. A dataset gen recorded holds them: each sample's prompt and
completion as the target produced them. `--context-from DATASET --context-tokens 8192`
takes the first 8192 tokens of every sample longer than that as the context (the prompt the
target continues: it resumes its own trace mid-way), and `last-turn` takes each sample up to
its last answer, the whole history of a multi-turn sample. Give a dataset the drafter did
not train on (its held-out prompts answered by gen), made with this target.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from eagle3kit._options import opt
from eagle3kit.errors import UserError
from eagle3kit.model.depth import DEPTH_EDGES_TEXT, parse_edges

LAST_TURN = "last-turn"
"""A --context-tokens value: each sample up to the start of its last answer."""


def parse_lengths(text: str, flag: str = "--context-tokens") -> tuple[int | str, ...]:
    """'1024,8192' or 'last-turn' (or both, comma-separated) -> the cuts to make."""
    out: list[int | str] = []
    for part in (p.strip() for p in text.split(",")):
        if part == LAST_TURN:
            out.append(part)
            continue
        try:
            value = int(part)
        except ValueError:
            raise UserError(
                f"{flag} {text}: expected token counts or {LAST_TURN}, separated "
                f"by commas (e.g. {flag} 1024,8192)"
            ) from None
        if value < 1:
            raise UserError(f"{flag} {text}: a context is at least 1 token")
        out.append(value)
    return tuple(dict.fromkeys(out))


@dataclass(frozen=True)
class DepthOptions:
    """Where in the sequence bench measures: the depth buckets of its reports, and deep
    contexts cut from recorded samples (accept, server and parity embed these)."""

    depth_buckets: str = field(default=DEPTH_EDGES_TEXT, metadata=opt(metavar="EDGES", ints=True))
    """Context-depth bucket edges in tokens: acceptance is also reported per bucket of where
    each verification round happens (the default: < 1K, 1K-4K, 4K-16K, >= 16K)."""
    context_from: Path | None = field(default=None, metadata=opt(metavar="DATASET"))
    """Also measure on contexts cut from this token dataset's recorded samples (prompt +
    completion; give one the drafter did not train on): see --context-tokens."""
    context_tokens: str | None = field(default=None, metadata=opt(metavar="N[,N...]", ints=True))
    """With --context-from: the first N tokens of each sample longer than N are a prompt the
    target continues (several N: one prompt each); last-turn: each sample up to its last
    answer (a multi-turn sample's whole history)."""

    def __post_init__(self) -> None:
        self.edges  # noqa: B018 (parsed here so a bad value is refused before any work)
        if self.context_from is not None:
            object.__setattr__(self, "context_from", Path(self.context_from))
            if self.context_tokens is None:
                raise UserError(
                    f"--context-from {self.context_from} needs --context-tokens "
                    f"(e.g. --context-tokens 8192, or {LAST_TURN})"
                )
            if not self.context_from.is_dir():
                raise UserError(f"--context-from {self.context_from}: no such dataset directory")
        elif self.context_tokens is not None:
            raise UserError(
                "--context-tokens cuts the samples of --context-from DATASET: give the dataset"
            )
        self.cuts  # noqa: B018

    @property
    def edges(self) -> tuple[int, ...]:
        try:
            return parse_edges(self.depth_buckets)
        except ValueError as exc:
            raise UserError(str(exc)) from None

    @property
    def cuts(self) -> tuple[int | str, ...]:
        """--context-tokens parsed (empty without --context-from)."""
        return () if self.context_tokens is None else parse_lengths(self.context_tokens)


@dataclass(frozen=True)
class Context:
    """One prompt cut from a recorded sample."""

    label: str
    """DATASET:SAMPLE_ID@CUT."""
    category: str
    """'context N' or 'last turn': a category of its own per cut, in the reports."""
    ids: list[int]


def last_answer_start(mask: np.ndarray) -> int:
    """Where the sample's last loss span (its last answer) starts; 0 when it has none."""
    opens = np.flatnonzero(mask.astype(bool) & ~np.concatenate([[False], mask[:-1].astype(bool)]))
    return int(opens[-1]) if len(opens) else 0


def cut(ids: np.ndarray, mask: np.ndarray, length: int | str) -> np.ndarray | None:
    """The context `length` makes of one sample; None when the sample is too short for it
    (a cut must leave at least one recorded token after it)."""
    if length == LAST_TURN:
        start = last_answer_start(mask)
        return ids[:start] if start > 0 else None
    assert isinstance(length, int)
    return ids[:length] if len(ids) > length else None


def from_dataset(
    path: Path,
    lengths: tuple[int | str, ...],
    max_samples: int | None,
    vocab_size: int | None,
    flag: str = "--context-from",
) -> list[Context]:
    """The contexts of every sample of the token dataset at `path` (at most `max_samples`
    samples that give one), in the dataset's order, each cut in turn."""
    from eagle3kit.format import Dataset, DatasetError

    try:
        dataset = Dataset(path, kind="tokens")
    except DatasetError as exc:
        raise UserError(f"{flag} {path}: {exc}") from None
    out: list[Context] = []
    used = 0
    for index in range(len(dataset)):
        if max_samples is not None and used >= max_samples:
            break
        view = dataset.token_view(index)
        ids = np.asarray(view.input_ids)
        if vocab_size is not None and len(ids) and int(ids.max()) >= vocab_size:
            raise UserError(
                f"{flag} {path}: sample {index} holds token id {int(ids.max())}, "
                f"outside the tokenizer's vocabulary of {vocab_size}: the dataset "
                "was made with another tokenizer"
            )
        made = [
            (n, c) for n in lengths if (c := cut(ids, np.asarray(view.loss_mask), n)) is not None
        ]
        if not made:
            continue
        used += 1
        sample_id = dataset[index].sample_id
        for n, context in made:
            name = "last turn" if n == LAST_TURN else f"context {n}"
            out.append(Context(f"{path}:{sample_id}@{n}", name, [int(t) for t in context]))
    if not out:
        wanted = ", ".join(map(str, lengths))
        raise UserError(
            f"{flag} {path}: no sample is long enough for --context-tokens "
            f"{wanted} (the longest holds {_longest(dataset)} tokens)"
        )
    return out


def _longest(dataset: Any) -> int:
    return max((int(c.lengths.max()) for c in dataset.columns() if len(c.lengths)), default=0)

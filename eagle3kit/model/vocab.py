"""The draft vocabulary: which target tokens the drafter's `lm_head` rows stand for.

`d2t[i]` is an offset: target id of draft index i = i + d2t[i] (what vLLM reads);
`t2d` is a bool mask over the target vocabulary, true at the kept ids (EAGLE3.md §1.3).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class DraftVocab:
    draft_ids: np.ndarray
    """Target id of each draft index, sorted ascending (int64, length Vd)."""
    vocab_size: int
    """The target's vocabulary size V."""
    coverage: float | None = None
    """Share of the counted (loss-carrying) tokens that the kept ids cover."""

    @property
    def size(self) -> int:
        return len(self.draft_ids)

    @property
    def d2t(self) -> np.ndarray:
        return self.draft_ids - np.arange(self.size, dtype=np.int64)

    @property
    def t2d(self) -> np.ndarray:
        mask = np.zeros(self.vocab_size, dtype=bool)
        mask[self.draft_ids] = True
        return mask

    @classmethod
    def from_d2t(cls, d2t: np.ndarray, vocab_size: int) -> DraftVocab:
        d2t = np.asarray(d2t, dtype=np.int64)
        return cls(d2t + np.arange(len(d2t), dtype=np.int64), vocab_size)

    @classmethod
    def full(cls, vocab_size: int) -> DraftVocab:
        return cls(np.arange(vocab_size, dtype=np.int64), vocab_size, 1.0)


def build_vocab(counts: np.ndarray, draft_size: int) -> DraftVocab:
    """The `draft_size` most frequent ids of `counts` (indexed by target id), sorted.

    Ties break toward the lower id, so the result does not depend on the order samples were
    counted in. With fewer distinct ids than `draft_size`, the rest are the lowest unused ids
    at zero count, as the reference trainers do.
    """
    counts = np.asarray(counts, dtype=np.int64)
    vocab_size = len(counts)
    draft_size = min(draft_size, vocab_size)
    order = np.lexsort((np.arange(vocab_size), -counts))  # by count desc, then id asc
    kept = np.sort(order[:draft_size])
    total = int(counts.sum())
    coverage = float(counts[kept].sum() / total) if total else 0.0
    return DraftVocab(kept.astype(np.int64), vocab_size, coverage)


def count_tokens(counts: np.ndarray, ids: np.ndarray, loss_mask: np.ndarray) -> None:
    """Add the loss-carrying ids of one sample to `counts` in place."""
    np.add.at(counts, np.asarray(ids)[np.asarray(loss_mask, dtype=bool)], 1)


def vocab_problems(
    d2t: np.ndarray | None, t2d: np.ndarray | None, vocab_size: int, draft_size: int
) -> list[str]:
    """What is wrong with a checkpoint's d2t/t2d (EAGLE3.md §1.3 checks); [] when sound."""
    problems: list[str] = []
    if d2t is None:
        if draft_size != vocab_size:
            problems.append(
                f"no d2t, but the draft vocabulary ({draft_size}) is smaller than "
                f"the target's ({vocab_size}): engines would read the rows wrongly"
            )
        return problems
    d2t = np.asarray(d2t)
    if len(d2t) != draft_size:
        problems.append(f"d2t has {len(d2t)} entries, lm_head has {draft_size} rows")
        return problems
    ids = d2t.astype(np.int64) + np.arange(len(d2t))
    if (ids < 0).any() or (ids >= vocab_size).any():
        if (d2t >= 0).all() and (d2t < vocab_size).all() and len(np.unique(d2t)) == len(d2t):
            problems.append("d2t holds target ids, not offsets (target id = i + d2t[i])")
        else:
            problems.append(
                f"d2t maps draft rows outside the target vocabulary (0..{vocab_size - 1})"
            )
        return problems
    if len(np.unique(ids)) != len(ids):
        problems.append("d2t maps two draft rows to the same target id")
    if t2d is not None:
        t2d = np.asarray(t2d)
        if len(t2d) != vocab_size:
            problems.append(f"t2d has {len(t2d)} entries, the target vocabulary {vocab_size}")
        elif int(t2d.sum()) != draft_size or not t2d[ids].all():
            problems.append("t2d does not mark exactly the ids d2t maps to")
    return problems

"""Training data: the datasets, the held-out split, the long-sample policy and the batch plan.

Everything here is a pure function of the datasets and the settings, so every rank of a
torchrun job, and a resumed run, computes the same plan without talking to the others: the
position in the data is just the optimizer step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import xxhash

from eagle3kit import _ui
from eagle3kit.errors import UserError
from eagle3kit.format import Dataset, DatasetError, read_marker

SPLIT_SALT = "eagle3kit-eval-split"
"""Mixed into the sample-id hash, so the split does not correlate with other id-hash uses
(extract's rank assignment) and stays the same whatever the seed."""


@dataclass
class DataSource:
    """One opened dataset and what the planner needs of it, read without touching states."""

    path: Path
    weight: float
    kind: str
    """"tokens" or "hidden"."""
    dataset: Dataset
    """Samples for training: each shard checked against its checksums when first read."""
    scan: Dataset
    """The same dataset unchecked, for the token-only passes at start-up (lengths, ids,
    vocabulary counts): checking a hidden dataset's shards there would read all its states
    before the first step."""
    ids: list[str]
    lengths: np.ndarray
    """Tokens per sample (before the --max-len policy)."""

    def tokens(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(input_ids, loss_mask) of sample i, without its states."""
        view = (self.scan if self.kind == "hidden" else self.dataset).token_view(i)
        return np.asarray(view.input_ids), np.asarray(view.loss_mask)

    def manifest_summary(self) -> dict:
        return {
            "path": str(self.path.resolve()),
            "weight": self.weight,
            "kind": self.kind,
            "samples": len(self.ids),
            "tokens": int(self.lengths.sum()),
            "manifest_xxh3": self.dataset.manifest_xxh3,
            "manifest": self.dataset.header(),
        }


def open_source(path: Path, weight: float, online: bool) -> DataSource:
    """Open a dataset given to train; the wrong kind for the mode is refused by name."""
    from eagle3kit.format import HiddenDataset

    try:
        kind = read_marker(path)["kind"]
    except DatasetError as exc:
        raise UserError(str(exc)) from None
    if online and kind != "tokens":
        raise UserError(
            f"{path}: a {kind} dataset; --online trains from token datasets "
            "(drop --online to train offline from hidden states)"
        )
    if not online and kind != "hidden":
        raise UserError(
            f"{path}: a token dataset; train from it with --online, or make a "
            "hidden-state dataset first with `eagle3kit extract`"
        )
    ds: Dataset = HiddenDataset(path) if kind == "hidden" else Dataset(path)
    _ui.warn_all(ds.warnings)
    scan: Dataset = (
        HiddenDataset(path, verify_shards=False, warn_stray=False) if kind == "hidden" else ds
    )
    ids: list[str] = []
    lengths: list[np.ndarray] = []
    for shard in scan.columns():
        ids.extend(shard.ids)
        lengths.append(shard.lengths)
    if not ids:
        raise UserError(f"{path}: the dataset holds no samples")
    return DataSource(
        path,
        weight,
        kind,
        ds,
        scan,
        ids,
        np.concatenate(lengths) if lengths else np.zeros(0, np.int64),
    )


def split_hash(sample_id: str) -> int:
    return xxhash.xxh3_64_intdigest((SPLIT_SALT + sample_id).encode())


def held_out(sources: list[DataSource], eval_split: float) -> list[np.ndarray]:
    """Per source, a bool mask of the held-out samples, chosen by sample-id hash.

    A share keeps each sample whose hash falls below it (stable as data is added); a count
    keeps the samples with the smallest hashes over all datasets. A share that selects
    nothing from a dataset of 2+ samples still holds out its smallest-hash sample, so a tiny
    run is evaluated too.
    """
    hashes = [np.array([split_hash(i) for i in s.ids], dtype=np.uint64) for s in sources]
    if eval_split == 0:
        return [np.zeros(len(h), bool) for h in hashes]
    if eval_split >= 1:
        everything = np.concatenate(hashes)
        count = min(int(eval_split), len(everything) - 1)
        if count <= 0:
            return [np.zeros(len(h), bool) for h in hashes]
        cut = np.sort(everything)[count - 1]
        return [h <= cut for h in hashes]
    cut = np.uint64(int(eval_split * 2.0**64))
    masks = [h < cut for h in hashes]
    total = sum(int(m.sum()) for m in masks)
    n = sum(len(h) for h in hashes)
    if total == 0 and n >= 2:
        first = int(np.argmin([h.min() for h in hashes]))
        masks[first][int(np.argmin(hashes[first]))] = True
    return masks


@dataclass(frozen=True)
class Item:
    """One sample of the plan: which dataset, which index, how many tokens it trains on."""

    source: int
    index: int
    length: int


@dataclass
class LongStats:
    dropped: int = 0
    truncated: int = 0
    tokens_cut: int = 0
    """Tokens left out: the tails of truncated samples and the whole of dropped ones."""
    max_len: int | None = None
    """The limit applied (None: none)."""
    tokens: int = 0
    """Tokens of all the samples, before the limit."""

    def to_dict(self) -> dict:
        return {
            "dropped": self.dropped,
            "truncated": self.truncated,
            "tokens_cut": self.tokens_cut,
            "max_len": self.max_len,
            "tokens": self.tokens,
        }


@dataclass
class Pool:
    """The usable samples, split into training and held-out items."""

    train: list[list[Item]]
    """Per source."""
    heldout: list[Item]
    long: LongStats = field(default_factory=LongStats)
    too_short: int = 0


def build_pool(
    sources: list[DataSource], masks: list[np.ndarray], max_len: int | None, policy: str
) -> Pool:
    """Apply --max-len / --long-samples (None: no limit) and drop samples too short to train
    on (< 3 tokens: a prediction needs a state, the next token and a target after it)."""
    pool = Pool([[] for _ in sources], [], LongStats(max_len=max_len))
    for s, (src, mask) in enumerate(zip(sources, masks, strict=True)):
        lengths = src.lengths.tolist()
        # In sample-id order, not file order: the plan is then the same for the same samples
        # however a writer ordered them (extract stores longest first, gen as answered), so
        # a token dataset and its hidden states train alike (train --online --server).
        for i in sorted(range(len(lengths)), key=src.ids.__getitem__):
            n = lengths[i]
            pool.long.tokens += n
            if max_len is not None and n > max_len:
                if policy == "drop":
                    pool.long.dropped += 1
                    pool.long.tokens_cut += n
                    continue
                pool.long.truncated += 1
                pool.long.tokens_cut += n - max_len
                n = max_len
            if n < 3:
                pool.too_short += 1
                continue
            (pool.heldout if mask[i] else pool.train[s]).append(Item(s, i, n))
    return pool


def epoch_items(
    pool: Pool, weights: list[float], seed: int, epoch: int, fixed_order: bool = False
) -> list[Item]:
    """One epoch's samples in training order. Weight w: each sample floor(w) times, plus a
    seeded random share frac(w) of the dataset, drawn anew each epoch. `fixed_order`: the
    same seeded permutation every epoch (--data-order fixed)."""
    chosen: list[Item] = []
    for s, (items, w) in enumerate(zip(pool.train, weights, strict=True)):
        rng = np.random.default_rng([seed, epoch, s, 1])
        whole, frac = int(w), w - int(w)
        chosen += items * whole
        extra = round(frac * len(items))
        if extra:
            chosen += [items[i] for i in sorted(rng.choice(len(items), extra, replace=False))]
    order = np.random.default_rng([seed, 0 if fixed_order else epoch, 0]).permutation(len(chosen))
    return [chosen[i] for i in order]


def global_batches(items: list[Item], budget: int) -> list[list[Item]]:
    """Consecutive items grouped while their tokens fit `budget` (one item at least)."""
    batches: list[list[Item]] = []
    current: list[Item] = []
    used = 0
    for item in items:
        if current and used + item.length > budget:
            batches.append(current)
            current, used = [], 0
        current.append(item)
        used += item.length
    if current:
        batches.append(current)
    return batches


def split_parts(batch: list[Item], parts: int) -> list[list[Item]]:
    """A global batch cut into `parts` micro-batches of about equal tokens, each of similar
    lengths (sorted first), so padding stays small. Some may be empty."""
    ordered = sorted(batch, key=lambda it: (it.length, it.source, it.index))
    total = sum(it.length for it in ordered)
    out: list[list[Item]] = [[] for _ in range(parts)]
    acc = 0
    for item in ordered:
        # The part whose share of the tokens this item's middle falls in.
        p = min(parts - 1, int((acc + item.length / 2) * parts / max(total, 1)))
        out[p].append(item)
        acc += item.length
    return out


@dataclass
class BatchPlan:
    """Every optimizer step's global batch, epoch by epoch."""

    epochs: list[list[list[Item]]]
    parts: int

    @property
    def total_steps(self) -> int:
        return sum(len(e) for e in self.epochs)

    def step(self, n: int) -> tuple[int, list[Item]]:
        """(epoch, global batch) of 0-based step n."""
        for e, batches in enumerate(self.epochs):
            if n < len(batches):
                return e, batches[n]
            n -= len(batches)
        raise IndexError(n)


def make_plan(
    pool: Pool,
    weights: list[float],
    seed: int,
    budget: int,
    parts: int,
    epochs: float | None,
    max_steps: int | None,
    fixed_order: bool = False,
) -> BatchPlan:
    """Global batches of `budget` x `parts` tokens; --epochs (a fraction cuts the last one),
    or as many epochs as --max-steps needs."""
    if not any(pool.train):
        raise UserError(
            "no training samples left (all held out, dropped as too long, or "
            "shorter than 3 tokens): lower --eval-split or raise --max-len"
        )
    out: list[list[list[Item]]] = []
    want_epochs = epochs if epochs is not None else (None if max_steps else 1.0)
    steps = 0
    e = 0
    while True:
        if want_epochs is not None and e >= want_epochs:
            break
        if max_steps is not None and steps >= max_steps:
            break
        batches = global_batches(epoch_items(pool, weights, seed, e, fixed_order), budget * parts)
        if want_epochs is not None and want_epochs - e < 1:
            batches = batches[: max(1, round(len(batches) * (want_epochs - e)))]
        if max_steps is not None:
            batches = batches[: max_steps - steps]
        out.append(batches)
        steps += len(batches)
        e += 1
    return BatchPlan(out, parts)


def count_vocab(sources: list[DataSource], pool: Pool, vocab_size: int) -> np.ndarray:
    """Loss-carrying token counts over the training items (as trained: truncated)."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for items in pool.train:
        chunk: list[np.ndarray] = []
        for item in items:
            ids, mask = sources[item.source].tokens(item.index)
            ids, mask = ids[: item.length], mask[: item.length]
            chunk.append(ids[mask.astype(bool)])
            if len(chunk) >= 4096:
                _add_counts(counts, chunk, sources[item.source].path)
                chunk = []
        if chunk:
            _add_counts(counts, chunk, sources[items[0].source].path)
    return counts


def _add_counts(counts: np.ndarray, chunk: list[np.ndarray], where: Path) -> None:
    ids = np.concatenate(chunk).astype(np.int64)
    if ids.size and ids.max() >= len(counts):
        raise UserError(
            f"{where}: holds token id {int(ids.max())}, but the target's "
            f"vocabulary has {len(counts)} ids: data made for another model?"
        )
    counts += np.bincount(ids, minlength=len(counts))

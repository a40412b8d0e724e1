"""The samples a writer queues for its next commit, packed as they arrive, and the counts
their manifest entry carries."""

from __future__ import annotations

from collections import Counter
from typing import Any, Protocol

import numpy as np
import orjson
import zstandard

from eagle3kit.format._ints import pack_int32_into, to_int32
from eagle3kit.format.sample import MAX_SAMPLE_TOKENS, IntSeq, TokenSample
from eagle3kit.format.shard import META_PER_SAMPLE, META_PER_TOKEN, META_SLACK, meta_bound


def loss_spans(sample: TokenSample, n_tokens: int) -> list[list[int]]:
    """The [start, end) runs of loss-carrying positions."""
    if sample.loss_mask is None:  # the common case stays in plain Python: no array per sample
        start = len(sample.prompt_ids)
        return [[start, n_tokens]] if n_tokens > start else []
    mask = np.asarray(sample.loss_mask)
    if mask.shape != (n_tokens,):
        raise ValueError(
            f"sample {sample.sample_id}: loss_mask has {mask.size} entries for {n_tokens} tokens"
        )
    if mask.size and not np.isin(mask, (0, 1)).all():
        raise ValueError(f"sample {sample.sample_id}: loss_mask must hold only 0 and 1")
    edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    return np.stack([np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)], 1).tolist()


class _TokenBuffer:
    """Samples waiting for the next commit, packed as they arrive."""

    dtypes: dict[str, str] = {}  # noqa: RUF012  (read-only: every array has its natural dtype)

    def __init__(self) -> None:
        self.tokens = np.empty(1 << 16, np.int32)
        self.n_tokens = 0
        self.offsets = [0]
        self.prompt_lens: list[int] = []
        self.spans: list[list[list[int]]] = []
        self.loss: list[int] = []
        self.partitions: list[str] = []
        self.ids: list[str] = []
        self.meta: list[bytes] = []  # each sample's meta as JSON, encoded when it is added
        self.finish: list[str] = []

    def __len__(self) -> int:
        return len(self.ids)

    def _pack(self, ids: IntSeq) -> None:
        n = len(ids)
        if self.n_tokens + n > self.tokens.size:
            grown = np.empty(max(2 * self.tokens.size, self.n_tokens + n), np.int32)
            grown[: self.n_tokens] = self.tokens[: self.n_tokens]
            self.tokens = grown
        if isinstance(ids, np.ndarray):
            # to_int32 range-checks: numpy's own assignment casts unsafely, so int64 ids past
            # int32 would wrap and float arrays would truncate without a word.
            self.tokens[self.n_tokens : self.n_tokens + n] = to_int32(ids)
            if n and self.tokens[self.n_tokens : self.n_tokens + n].min() < 0:
                raise ValueError("token ids must not be negative")
        else:
            pack_int32_into(ids, self.tokens, self.n_tokens, floor=0)
        self.n_tokens += n

    def add(self, sample: TokenSample) -> None:
        # Everything the shard stores is checked and encoded before anything is packed: a
        # value JSON cannot hold (an int past 64 bits, a set, an object) used to pass add()
        # and fail the next commit instead, again on every later commit, taking every queued
        # sample with it. Encoding now also snapshots the caller's dicts.
        if not isinstance(sample.partition, str) or not isinstance(sample.finish_reason, str):
            raise TypeError(
                f"sample {sample.sample_id}: partition and finish_reason must be strings"
            )
        meta: dict = {"finish_reason": sample.finish_reason}
        for key in ("source", "server", "latency", "counts"):
            value = getattr(sample, key)
            if value is not None:
                meta[key] = value
        if sample.metadata:
            meta["metadata"] = sample.metadata
        try:
            meta_json = orjson.dumps(meta)
        except orjson.JSONEncodeError as exc:
            raise ValueError(
                f"sample {sample.sample_id}: metadata cannot be stored as JSON ({exc})"
            ) from None
        n_tokens = len(sample.prompt_ids) + len(sample.completion_ids)
        if n_tokens > MAX_SAMPLE_TOKENS:
            raise ValueError(
                f"sample {sample.sample_id}: {n_tokens:,} tokens, more than a "
                f"sample may hold ({MAX_SAMPLE_TOKENS:,})"
            )
        if len(meta_json) + 1 > meta_bound(1, n_tokens) - META_SLACK:
            # Readers bound the metadata frame by this share (docs/format.md), so a shard
            # holding more would be unreadable.
            raise ValueError(
                f"sample {sample.sample_id}: its metadata is {len(meta_json):,} bytes as JSON, "
                f"over the format's limit of {meta_bound(1, n_tokens) - META_SLACK - 1:,} for "
                f"a sample of {n_tokens:,} tokens ({META_PER_SAMPLE >> 10} KiB + "
                f"{META_PER_TOKEN} bytes per token)"
            )
        held, start = len(self.ids), self.n_tokens
        try:
            self._pack(sample.prompt_ids)
            self._pack(sample.completion_ids)
            spans = loss_spans(sample, self.n_tokens - start)
            self.offsets.append(self.n_tokens)
            self.prompt_lens.append(len(sample.prompt_ids))
            self.spans.append(spans)
            self.loss.append(sum(end - start for start, end in spans))
            self.partitions.append(sample.partition)
            self.meta.append(meta_json)
            self.finish.append(sample.finish_reason)
            self.ids.append(sample.sample_id)
        except BaseException:
            # A rejected sample, or a stop signal (raised between any two lines), leaves no
            # part of itself behind: close() commits what is queued, and a sample half in
            # these lists gave a shard whose token count its partitions did not add up to.
            self._truncate(held, start)
            raise

    def _truncate(self, samples: int, tokens: int) -> None:
        """Keep the first `samples` samples (`tokens` tokens) and nothing after them."""
        self.n_tokens = tokens
        del self.offsets[samples + 1 :]
        for column in (
            self.prompt_lens,
            self.spans,
            self.loss,
            self.partitions,
            self.meta,
            self.finish,
            self.ids,
        ):
            del column[samples:]

    def arrays(self) -> tuple[dict[str, np.ndarray], list[str]]:
        names = sorted(set(self.partitions))
        index = {p: i for i, p in enumerate(names)}
        spans = np.array([pair for sample in self.spans for pair in sample], np.int32)
        arrays: dict[str, np.ndarray] = {
            "tokens": self.tokens[: self.n_tokens],
            "offsets": np.asarray(self.offsets, np.int64),
            "prompt_lens": np.asarray(self.prompt_lens, np.int32),
            "loss_spans": spans.reshape(-1, 2),
            "loss_span_offsets": np.cumsum([0] + [len(s) for s in self.spans], dtype=np.int64),
            "partition_index": np.asarray([index[p] for p in self.partitions], np.int32),
            "sample_ids": np.frombuffer("\n".join(self.ids).encode(), np.uint8),
            "meta_zst": np.frombuffer(
                zstandard.ZstdCompressor(level=3).compress(b"[" + b",".join(self.meta) + b"]"),
                np.uint8,
            ),
        }
        return arrays, names

    @property
    def nbytes(self) -> int:
        return self.n_tokens * 4

    def shard_metadata(self) -> dict[str, str]:
        return {}

    def entry(self) -> dict:
        """This buffer's counts for its manifest entry, so `info` never opens a shard."""
        lengths = np.diff(self.offsets).tolist()
        stats = partition_stats(self.partitions, lengths, self.loss, self.prompt_lens, self.finish)
        return {
            "tokens": self.n_tokens,
            "loss_tokens": sum(p["loss_tokens"] for p in stats.values()),
            "partitions": stats,
        }


def partition_stats(
    partitions: list[str],
    lengths: list[int],
    loss: list[int],
    prompt_lens: list[int],
    finish: list[str] | None,
) -> dict:
    """Per-partition samples, tokens, loss, completion tokens and finish reasons."""
    out: dict[str, dict] = {}
    for i, part in enumerate(partitions):
        p = out.setdefault(
            part,
            {
                "samples": 0,
                "tokens": 0,
                "loss_tokens": 0,
                "completion_tokens": 0,
                "finish": Counter(),
            },
        )
        p["samples"] += 1
        p["tokens"] += lengths[i]
        p["loss_tokens"] += loss[i]
        p["completion_tokens"] += lengths[i] - prompt_lens[i]
        if finish is not None:
            p["finish"][finish[i]] += 1
    for p in out.values():
        p["finish"] = dict(p["finish"])
    return out


class _Buffer(Protocol):
    """What a writer needs of the samples it queues: packed arrays and their counts."""

    dtypes: dict[str, str]

    def __len__(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    def add(self, sample: Any) -> None: ...
    def arrays(self) -> tuple[dict[str, np.ndarray], list[str]]: ...
    def shard_metadata(self) -> dict[str, str]: ...
    def entry(self) -> dict: ...

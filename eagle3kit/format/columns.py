"""What a reader hands out of a shard without copying it: `TokenView` (one sample's arrays,
for training loops) and `ShardColumns` (one shard's columns, for stages that scan whole
arrays). Both are views of the mapped file; the file's layout stays in the shard classes."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np


@dataclass
class TokenView:
    """A sample's arrays without its metadata, for training loops: no copies, no JSON."""

    input_ids: np.ndarray
    prompt_len: int
    loss_mask: np.ndarray


class ShardColumns:
    """One shard's columns: read-only views of the mapped file, one entry per sample (the
    token columns one per token). The public face of a token or hidden-state shard for
    stages that scan whole arrays; a shard's file layout stays inside format/."""

    def __init__(self, shard: Any) -> None:
        self._shard = shard

    @property
    def ids(self) -> list[str]:
        return self._shard.ids

    @property
    def tokens(self) -> np.ndarray:
        """Every sample's token ids, concatenated (sample i is `tokens[starts[i]:starts[i+1]]`)."""
        return self._shard.tokens

    @property
    def starts(self) -> list[int]:
        """Where each sample starts in `tokens`, and one past the last one's end."""
        return self._shard.starts

    @cached_property
    def offsets(self) -> np.ndarray:
        """`starts` as an int64 array."""
        return np.asarray(self._shard.offsets, np.int64)

    @cached_property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @cached_property
    def prompt_lens(self) -> np.ndarray:
        return np.asarray(self._shard.prompt_lens, np.int64)

    @property
    def partition_index(self) -> np.ndarray:
        """Each sample's index into `partition_names`."""
        return self._shard.partition_index

    @property
    def partition_names(self) -> list[str]:
        return self._shard.partition_names

    @property
    def meta(self) -> list[dict]:
        """Each sample's finish reason, source, server, latency, counts and metadata."""
        return self._shard.meta

    @cached_property
    def loss_spans(self) -> np.ndarray:
        """The [start, end) loss spans of every sample (token shards), as rows of an int64
        array; sample i's are `loss_spans[loss_span_offsets[i]:loss_span_offsets[i+1]]`."""
        return np.asarray(self._shard.loss_spans, np.int64).reshape(-1, 2)

    @cached_property
    def loss_span_offsets(self) -> np.ndarray:
        return np.asarray(self._shard.loss_span_offsets, np.int64)

"""What one token sample is, and how its identity is computed."""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import xxhash

IntSeq = Sequence[int] | np.ndarray

MAX_SAMPLE_TOKENS = 1 << 21
"""The most tokens (prompt + completion) one sample may hold: 2,097,152, twice the longest
context open models are served with (1M). Every writer refuses a longer sample, and convert
refuses a Parquet row that holds more before Python sees it: a file that compresses millions
of repeated ids into a few bytes costs no more than a sample may (docs/format.md)."""

FINISH_REASONS = ("stop", "length", "abort")
"""Finish reasons a server gives; a sample left out on purpose has `filtered:<why>` or
`skipped:<why>` instead, and may have no completion."""


@dataclass
class TokenSample:
    """One training sample: the exact prompt ids sent and the completion ids the model produced."""

    sample_id: str
    prompt_ids: IntSeq
    completion_ids: IntSeq
    finish_reason: str = "stop"
    partition: str = "default"
    loss_mask: IntSeq | None = None
    """0/1 per position of prompt + completion; None means the completion positions."""
    source: dict[str, Any] | None = None
    """Where the prompt came from: file, line, turn, dataset name."""
    server: dict[str, Any] | None = None
    """Who generated it: url, engine, engine version, model, sampling parameters."""
    latency: float | None = None
    """Seconds from sending the request to the full response."""
    counts: dict[str, int] | None = None
    """Counts the server reported (cached_tokens, reasoning_tokens, ...)."""
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)

    def dense_loss_mask(self) -> np.ndarray:
        if self.loss_mask is not None:
            return np.asarray(self.loss_mask, dtype=np.uint8)
        mask = np.zeros(self.num_tokens, dtype=np.uint8)
        mask[len(self.prompt_ids) :] = 1
        return mask


def check_sample_id(sample_id: object) -> str:
    if not isinstance(sample_id, str) or not sample_id or "\n" in sample_id:
        raise ValueError(
            f"sample_id must be a non-empty string without newlines, got {sample_id!r}"
        )
    return sample_id


def normalize(value: Any) -> Any:
    """Unicode NFC and stripped edges, so invisible edits to a prompt file keep the same id."""
    if isinstance(value, str):
        return unicodedata.normalize("NFC", value).strip()
    if isinstance(value, dict):
        return {str(k): normalize(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [normalize(v) for v in value]
    return value


def make_sample_id(source: str, messages: object, turn: int = 0, index: int = 0) -> str:
    """The stable id of a sample: a hash of (source name, normalized messages, turn, index).

    It never depends on a file position, so reordering or editing other prompts does not
    shift it, and a resumed run schedules exactly the ids not yet committed.
    """
    key = orjson.dumps([source, normalize(messages), turn, index], option=orjson.OPT_SORT_KEYS)
    return xxhash.xxh3_128_hexdigest(key)

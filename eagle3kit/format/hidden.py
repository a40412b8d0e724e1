"""Hidden-state datasets (kind "hidden"): what extract writes and offline training reads.

Per token a hidden shard holds the target's auxiliary states (`aux`, [T, n_aux*H], the
boundary-convention layer ids in order) and its last decoder layer's output (`last`, [T, H]):
before the final norm as extract writes it, after it (`last_state: post_norm`) where convert
imported SpecForge's states; beside them the token ids and the loss mask, flat: no padding is
stored.
The directory, the run lock and the commit protocol are the token datasets' (writer.py);
only the queued samples' packing and the shard's arrays differ: hidden_writer.py writes them,
hidden_reader.py reads them; this module is what both share. See docs/format.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CODECS = ("raw", "fp8", "zstd")
LAST_STATES = ("pre_norm", "post_norm")
TOKEN_OVERHEAD = 5
"""Stored bytes per token besides its states: the token id (int32) and its loss-mask byte."""
STATE_DTYPES: dict[str, dict[str, str]] = {
    "raw": {"aux": "BF16", "last": "BF16"},
    "fp8": {"aux": "F8_E4M3", "last": "F8_E4M3", "aux_scale": "F32", "last_scale": "F32"},
    "zstd": {"states_zst": "U8", "states_zst_offsets": "I64"},
}
"""Each codec's state arrays and their safetensors dtypes."""
MAX_HIDDEN_SIZE = 1 << 16
MAX_AUX = 64
"""Far past any model's: a manifest from elsewhere beyond them is damaged, since a sample's
states (and the buffer a compressed frame decodes into) are sized by them."""
ZSTD_LEVEL = 3
ZSTD_TYPICAL_RATIO = 0.75
"""zstd's stored size over raw bf16 states, for forecasts: benchmarks/extract_bench.py
measures 0.69 on a random tiny target (the high byte plane, sign and exponent, compresses;
the mantissa plane barely does). Real targets' states vary, so forecasts round up."""


@dataclass
class HiddenSample:
    """One sample's token ids, loss mask and target states (float32 when read back)."""

    sample_id: str
    input_ids: np.ndarray
    """int32 [T]: prompt and completion ids."""
    loss_mask: np.ndarray
    """uint8 [T]: 1 where the loss applies."""
    aux: np.ndarray
    """[T, n_aux*H]: the auxiliary states at the dataset's layer ids, concatenated in order."""
    last: np.ndarray
    """[T, H]: the last decoder layer's output, before the final norm."""
    partition: str = "default"
    prompt_len: int = 0
    """How many of the first tokens are the prompt (0 when unknown)."""

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)


def hidden_bytes_per_token(hidden_size: int, n_aux: int = 3, codec: str = "raw") -> float:
    """Expected stored bytes per token, per-token overhead included, for disk forecasts.

    raw: bf16 states; fp8: one byte per value plus an fp32 scale per state; zstd: raw times
    ZSTD_TYPICAL_RATIO. Per-sample and per-shard overhead (ids, offsets, headers) is not
    counted: it is a few dozen bytes per sample.
    """
    if codec not in CODECS:
        raise ValueError(f"unknown codec {codec!r} (one of {', '.join(CODECS)})")
    states = (n_aux + 1) * hidden_size
    if codec == "fp8":
        return states + 4 * (n_aux + 1) + TOKEN_OVERHEAD
    raw = 2.0 * states
    return (raw * ZSTD_TYPICAL_RATIO if codec == "zstd" else raw) + TOKEN_OVERHEAD

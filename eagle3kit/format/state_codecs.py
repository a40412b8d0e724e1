"""How hidden states are stored, value by value: bfloat16 bits, fp8 (e4m3) codes with a scale
per row, and the byte planes the zstd codec compresses; with the error each round trip
makes. Arrays in, arrays out: hidden.py's writer and shard use them."""

from __future__ import annotations

import numpy as np

FP8_MAX = 448.0  # the largest finite float8 e4m3fn value


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits (uint16), rounding to nearest even as torch does."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    return ((bits + (0x7FFF + ((bits >> 16) & 1))) >> 16).astype(np.uint16)


def from_bf16(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _fp8_table() -> np.ndarray:
    """float8 e4m3fn code -> float32: 1 sign, 4 exponent (bias 7), 3 mantissa bits."""
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp, man = (codes >> 3) & 0xF, codes & 0x7
    value = np.where(exp == 0, man / 8 * 2.0**-6, (1 + man / 8) * 2.0 ** (exp - 7.0))
    value = np.where((exp == 0xF) & (man == 0x7), np.nan, value)
    return (sign * value).astype(np.float32)


FP8_TABLE = _fp8_table()


def to_fp8(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[r, H] float32 -> (e4m3 codes uint8 [r, H], fp32 scale [r]): each row scaled to fit."""
    import torch  # only writing fp8 needs it: numpy has no float8 cast

    t = torch.from_numpy(np.ascontiguousarray(rows, np.float32))
    scale = (t.abs().amax(-1, keepdim=True) / FP8_MAX).clamp_min(torch.finfo(torch.float32).tiny)
    codes = (t / scale).to(torch.float8_e4m3fn).view(torch.uint8)
    return codes.numpy(), scale.squeeze(-1).numpy()


def from_fp8(codes: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return FP8_TABLE[codes] * scale[..., None]


def round_trip_errors(x: np.ndarray, back: np.ndarray, hidden_size: int) -> tuple[float, float]:
    """(max abs error, max error relative to its state's largest magnitude)."""
    if not x.size:
        return 0.0, 0.0
    err = np.abs(back - x).reshape(-1, hidden_size).max(-1)
    peak = np.abs(x).reshape(-1, hidden_size).max(-1)
    rel = np.divide(err, peak, out=np.zeros_like(err), where=peak > 0)
    return float(err.max()), float(rel.max())


def to_planes(bits: np.ndarray) -> bytes:
    """bf16 values as two byte planes, high bytes (sign, exponent) first: they repeat a lot,
    so zstd finds far more to share than in interleaved bytes."""
    pairs = bits.reshape(-1).view(np.uint8).reshape(-1, 2)
    return pairs[:, 1].tobytes() + pairs[:, 0].tobytes()


def from_planes(data: bytes, n: int) -> np.ndarray:
    planes = np.frombuffer(data, np.uint8)
    if planes.size != 2 * n:
        raise ValueError("wrong size")
    pairs = np.empty((n, 2), np.uint8)
    pairs[:, 1], pairs[:, 0] = planes[:n], planes[n:]
    return pairs.reshape(-1).view(np.uint16)

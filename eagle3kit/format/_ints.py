"""Convert Python lists of token ids into little-endian int32 arrays, fast.

``struct.pack_into`` packs ~10 ns/int, the fastest pure path measured (numpy's list
conversion is ~22). A C packer (~2 ns/int) was measured and removed: convert and gen end
to end did not get faster with it (benchmarks/int_pack_bench.py, benchmarks/README.md).

The contract:

* items: a list/tuple (or any iterable) of ``int`` or ``__index__`` objects;
  ``bool`` and numpy integer scalars are accepted (``True`` -> 1), floats and
  strings raise ``TypeError`` (numpy would silently truncate/parse them);
* a value outside int32 raises :class:`Int32RangeError`, which is both an
  ``OverflowError`` and a ``ValueError``, naming the value and its index;
* ``out`` must be a C-contiguous int32 (native/little-endian) or byte buffer
  with room for ``offset + len(items)`` int32 slots, else ``ValueError``; a
  read-only ``out`` raises ``ValueError``;
* on error, items before the failing one may already be written.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Iterable
from typing import SupportsIndex

import numpy as np

__all__ = ["Int32RangeError", "pack_int32_into", "to_int32"]

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1

# "<i4" rather than np.int32: the bytes are little-endian on every host, so the
# arrays we hand out must say so (identical to np.int32 on x86/ARM).
_INT32_LE = np.dtype("<i4")

IntItems = Iterable[SupportsIndex]


class Int32RangeError(OverflowError, ValueError):
    """A value does not fit int32. Subclasses both errors so either ``except`` works."""


def _as_sequence(items: IntItems) -> list[SupportsIndex] | tuple[SupportsIndex, ...]:
    # Lists/tuples as-is, other iterables materialised once.
    if isinstance(items, (list, tuple)):
        return items
    try:
        return list(items)
    except TypeError:
        raise TypeError("pack_int32: items must be a sequence of ints") from None


def _check_out(out: object, offset: int, n: int) -> None:
    """The buffer checks struct would make less clearly (or not at all: a strided view)."""
    # TypeError if out is not a buffer (the check: any object may come in)
    with memoryview(out) as mv:  # type: ignore[arg-type]
        if mv.readonly:
            raise ValueError("out is not writable")
        if not mv.c_contiguous:
            raise ValueError("out must be C-contiguous")
        fmt = mv.format.lstrip("<@=")
        if mv.itemsize != 1 and not (mv.itemsize == 4 and fmt in ("i", "l")):
            raise ValueError(
                f"out must be an int32 or byte buffer, got format '{mv.format}' "
                f"with itemsize {mv.itemsize}"
            )
        slots = mv.nbytes // 4
    if slots - offset < n:
        raise ValueError(
            f"out too small: need {n} int32 slots from offset {offset}, buffer holds {slots}"
        )


def _raise_first_bad(seq: list[SupportsIndex] | tuple[SupportsIndex, ...]) -> None:
    # struct.error does not say which item failed; rescan (error path only) to
    # name it.
    for i, item in enumerate(seq):
        try:
            v = operator.index(item)
        except TypeError:
            raise TypeError(f"item {i} is {type(item).__name__}, not an int") from None
        if not INT32_MIN <= v <= INT32_MAX:
            raise Int32RangeError(f"value {item!r} at index {i} is out of int32 range")


def pack_int32_into(
    items: IntItems, out: np.ndarray, offset: int = 0, floor: int | None = None
) -> int:
    """Write ``items`` as little-endian int32 into ``out`` from element ``offset``.

    Returns the number of values written. See the module docstring for errors; a value
    below ``floor`` (when given) raises ValueError.
    """
    offset = operator.index(offset)
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    seq = _as_sequence(items)
    n = len(seq)
    _check_out(out, offset, n)
    try:
        # One format per row length; struct caches compiled formats internally,
        # and "<" pins little-endian with no padding.
        struct.pack_into(f"<{n}i", out, offset * 4, *seq)  # type: ignore[arg-type]  # numpy's stubs give ndarray the buffer protocol for Python >= 3.12 only
    except struct.error:
        _raise_first_bad(seq)
        raise  # unreachable unless struct and operator.index disagree
    if floor is not None and n:
        written = np.frombuffer(out, _INT32_LE, n, offset * 4)
        at = int(written.argmin())
        if written[at] < floor:
            raise ValueError(f"value {int(written[at])} at index {at} is below {floor}")
    return n


def to_int32(items: IntItems | np.ndarray) -> np.ndarray:
    """Return ``items`` as a little-endian int32 array, range-checked.

    Lists/tuples/iterables give a new 1-D array. Integer (or bool) numpy arrays
    keep their shape and are returned without a copy when already ``<i4``.
    """
    if isinstance(items, np.ndarray) and items.dtype.kind != "O":
        return _ndarray_to_int32(items)
    seq = _as_sequence(items)
    out = np.empty(len(seq), dtype=_INT32_LE)
    pack_int32_into(seq, out, 0)
    return out


def _ndarray_to_int32(arr: np.ndarray) -> np.ndarray:
    kind = arr.dtype.kind
    if kind not in "biu":
        # Refuse floats rather than truncate, matching the list path.
        raise TypeError(f"expected an integer array, got dtype {arr.dtype}")
    if arr.size and not np.can_cast(arr.dtype, _INT32_LE, casting="safe"):
        bad = (arr > INT32_MAX) if kind == "u" else (arr < INT32_MIN) | (arr > INT32_MAX)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            v = arr.reshape(-1)[i].item()
            raise Int32RangeError(f"value {v!r} at index {i} is out of int32 range")
    return np.asarray(arr, dtype=_INT32_LE)

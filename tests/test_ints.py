"""Tests for eagle3kit.format._ints: the struct packer's contract."""

from __future__ import annotations

import random
import struct
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eagle3kit.format._ints import (
    INT32_MAX,
    INT32_MIN,
    Int32RangeError,
    pack_int32_into,
    to_int32,
)

# The behavioural tests take the packer as a parameter (one path since the C one went).
impls = pytest.mark.parametrize("pack", [pack_int32_into], ids=["struct"])


def _pack_new(pack: Callable[..., int], items: list[int]) -> np.ndarray:
    out = np.empty(len(items), dtype="<i4")
    assert pack(items, out, 0) == len(items)
    return out


@impls
@pytest.mark.parametrize("n", [0, 1, 2, 7, 1000])
def test_matches_numpy_on_random_lists(pack: Callable[..., int], n: int) -> None:
    rng = random.Random(n)
    # Mix token-like ids, full-range values (>= 2**30 takes the C slow path)
    # and the exact edges.
    edges = [0, 1, -1, INT32_MIN, INT32_MAX, 2**30, -(2**30), 2**30 - 1]

    def draw() -> int:
        r = rng.random()
        if r < 0.2:
            return rng.choice(edges)
        if r < 0.6:
            return rng.randint(INT32_MIN, INT32_MAX)
        return rng.randint(-300, 200_000)

    items = [draw() for _ in range(n)]
    got = _pack_new(pack, items)
    np.testing.assert_array_equal(got, np.array(items, dtype=np.int32))


@impls
def test_bounds_exact(pack: Callable[..., int]) -> None:
    got = _pack_new(pack, [INT32_MIN, -1, 0, INT32_MAX])
    assert got.tolist() == [INT32_MIN, -1, 0, INT32_MAX]


@impls
@pytest.mark.parametrize("bad", [2**31, INT32_MIN - 1, 2**70, -(2**100)])
def test_out_of_range_raises(pack: Callable[..., int], bad: int) -> None:
    out = np.zeros(3, dtype=np.int32)
    with pytest.raises(Int32RangeError, match=rf"value {bad} at index 1 "):
        pack([5, bad, 6], out, 0)
    # Documented to be both, so callers may catch either.
    with pytest.raises(OverflowError):
        pack([bad], out, 0)
    with pytest.raises(ValueError):
        pack([bad], out, 0)


@impls
@pytest.mark.parametrize("bad", [1.5, "3", None, np.float64(2.0), b"1"])
def test_non_int_raises_type_error(pack: Callable[..., int], bad: object) -> None:
    out = np.zeros(3, dtype=np.int32)
    with pytest.raises(TypeError, match=r"item 2 is "):
        pack([1, 2, bad], out, 0)


@impls
def test_bool_and_numpy_int_scalars_accepted(pack: Callable[..., int]) -> None:
    items = [True, False, np.int64(-5), np.uint16(7), np.int32(INT32_MAX)]
    assert _pack_new(pack, items).tolist() == [1, 0, -5, 7, INT32_MAX]


@impls
def test_tuples_and_iterables(pack: Callable[..., int]) -> None:
    assert _pack_new(pack, (3, -4)).tolist() == [3, -4]
    out = np.zeros(3, dtype=np.int32)
    assert pack(iter([9, 8, 7]), out, 0) == 3
    assert out.tolist() == [9, 8, 7]
    with pytest.raises(TypeError):
        pack(5, out, 0)


@impls
def test_offset_writes_only_its_slots(pack: Callable[..., int]) -> None:
    out = np.full(10, -7, dtype=np.int32)
    assert pack([1, 2, 3], out, 4) == 3
    assert out.tolist() == [-7, -7, -7, -7, 1, 2, 3, -7, -7, -7]
    assert pack([4, 5, 6], out, 7) == 3  # exactly fills the tail
    assert out[7:].tolist() == [4, 5, 6]
    assert pack([], out, 10) == 0  # empty at the very end is fine


@impls
@pytest.mark.parametrize(
    ("size", "n", "offset"), [(2, 3, 0), (5, 3, 3), (5, 0, 6), (0, 1, 0), (4, 1, 2**62)]
)
def test_too_small_raises(pack: Callable[..., int], size: int, n: int, offset: int) -> None:
    out = np.full(size, -7, dtype=np.int32)
    with pytest.raises(ValueError, match="too small"):
        pack(list(range(n)), out, offset)
    assert (out == -7).all()  # size is checked before anything is written


@impls
def test_negative_offset_raises(pack: Callable[..., int]) -> None:
    with pytest.raises(ValueError, match="offset"):
        pack([1], np.zeros(4, dtype=np.int32), -1)


@impls
def test_bytearray_gets_little_endian_bytes(pack: Callable[..., int]) -> None:
    buf = bytearray(16)
    assert pack([1, -2, INT32_MAX], buf, 1) == 3
    assert bytes(buf) == b"\0" * 4 + struct.pack("<3i", 1, -2, INT32_MAX)


@impls
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint32, ">i4", np.int16])
def test_wrong_out_dtype_rejected(pack: Callable[..., int], dtype: object) -> None:
    # These would otherwise be silently corrupted (reinterpreted bytes).
    with pytest.raises(ValueError, match="int32 or byte buffer"):
        pack([1, 2], np.zeros(8, dtype=dtype), 0)


@impls
def test_read_only_and_strided_out_rejected(pack: Callable[..., int]) -> None:
    ro = np.zeros(4, dtype=np.int32)
    ro.flags.writeable = False
    with pytest.raises(ValueError):
        pack([1], ro, 0)
    with pytest.raises(ValueError):
        pack([1], np.zeros(8, dtype=np.int32)[::2], 0)


def test_floor_names_the_value_and_its_index() -> None:
    out = np.zeros(4, dtype=np.int32)
    assert pack_int32_into([0, 5], out, 1, floor=0) == 2
    with pytest.raises(ValueError, match="value -3 at index 2 is below 0"):
        pack_int32_into([4, 1, -3, 2], out, 0, floor=0)


def test_to_int32_from_sequences() -> None:
    got = to_int32([1, -2, INT32_MAX])
    assert got.dtype == np.dtype("<i4")
    assert got.tolist() == [1, -2, INT32_MAX]
    assert to_int32(()).shape == (0,)
    assert to_int32(x for x in (4, 5)).tolist() == [4, 5]
    with pytest.raises(Int32RangeError):
        to_int32([2**31])
    with pytest.raises(TypeError):
        to_int32([1.0])


def test_to_int32_from_numpy() -> None:
    a32 = np.arange(5, dtype=np.int32)
    assert to_int32(a32) is a32  # already <i4 on little-endian hosts: no copy
    got = to_int32(np.array([[1, -2], [3, 4]], dtype=np.int64))
    assert got.dtype == np.dtype("<i4") and got.shape == (2, 2)
    assert to_int32(np.array([True, False])).tolist() == [1, 0]
    assert to_int32(np.array([], dtype=np.uint64)).shape == (0,)
    assert to_int32(np.array([INT32_MIN, INT32_MAX], dtype=np.int64)).tolist() == [
        INT32_MIN,
        INT32_MAX,
    ]
    with pytest.raises(Int32RangeError, match=r"value 2147483648 at index 1 "):
        to_int32(np.array([0, 2**31], dtype=np.int64))
    with pytest.raises(Int32RangeError):
        to_int32(np.array([INT32_MIN - 1], dtype=np.int64))
    with pytest.raises(Int32RangeError):
        to_int32(np.array([2**63], dtype=np.uint64))
    with pytest.raises(TypeError):
        to_int32(np.array([1.0]))
    assert to_int32(np.array([1, 2], dtype=object)).tolist() == [1, 2]


int32s = st.integers(min_value=INT32_MIN, max_value=INT32_MAX)


@settings(max_examples=200, deadline=None)
@given(items=st.lists(int32s, max_size=300), offset=st.integers(0, 5))
def test_property_round_trip(items: list[int], offset: int) -> None:
    a = np.full(len(items) + offset, 99, dtype=np.int32)
    assert pack_int32_into(items, a, offset) == len(items)
    assert a[offset:].tolist() == items
    assert (a[:offset] == 99).all()
    np.testing.assert_array_equal(to_int32(items), np.array(items, dtype=np.int32))

"""Fuzzing the format readers: whatever a dataset from elsewhere holds, reading it ends in a
named problem or a clean result (issue 25).

Each case damages a real dataset (token, hidden raw, hidden zstd) one way: a truncated file,
flipped bits with or without the checksums recomputed, a rewritten array or header value
(checksums recomputed), a crafted metadata or state frame (decompression bombs among them),
a hostile manifest or marker value. Then it reads the dataset the ways the stages do:
info's (counts, `verify()`, `duplicate_ids()`), validate's (`check_files() or verify()`, then
figures.scan) and train's (every sample, checksums on). Only DatasetError may come out, the
case's peak traced memory must stay under MEMORY_LIMIT and its time under TIME_LIMIT_S.
Cases are seeded by their number: a failure names it, and `_case(kind, n)` replays it.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import struct
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from shardcraft import (
    Arrays,
    bomb,
    hidden_dataset,
    read_shard,
    recompute,
    rewrite,
    shard_paths,
    token_dataset,
    zst,
)

from eagle3kit.chat.reasoning import Profile
from eagle3kit.format import Dataset, DatasetError
from eagle3kit.format.layout import MANIFEST, MARKER
from eagle3kit.validate.figures import scan

SEED = 25
CASES = 800
"""Per dataset kind in the default run (three kinds): cases 0 to CASES - 1."""
SLOW_CASES = 8_000
"""Per dataset kind in the `slow` tier: the SLOW_CASES cases after the default run's, so the
two tiers together read 26,400 different damaged datasets and the slow tier repeats none."""
MEMORY_LIMIT = 32 << 20
RSS_GROWTH_LIMIT = 192 << 20
TRACE_EVERY = 10
TIME_LIMIT_S = 5.0
BOMB_BYTES = 256 << 20
KINDS = ("tokens", "raw", "zstd")
HOSTILE = [
    None,
    True,
    -1,
    0,
    1,
    2**31,
    2**62,
    2**63 - 1,
    2**64,
    1e308,
    float("nan"),
    "x",
    "",
    "1",
    [],
    [1, 2],
    {},
    {"a": 1},
]


class Base:
    """A dataset written once, and its files' bytes, restored before every case (only the
    files a case changed: opening files is what a case costs most)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.files = {p: p.read_bytes() for p in path.rglob("*") if p.is_file()}
        self.stats = {p: self._stat(p) for p in self.files}
        self.shards = shard_paths(path)
        self.touched: set[Path] = set()
        """Files a case changed in ways their stat may not show (same size, same tick)."""

    @staticmethod
    def _stat(p: Path) -> tuple[int, int, int] | None:
        try:
            st = p.stat()
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    def restore(self) -> None:
        for p, data in self.files.items():
            if p in self.touched or self._stat(p) != self.stats[p]:
                p.write_bytes(data)
                self.stats[p] = self._stat(p)
        self.touched.clear()

    def rewrite(self, k: int, edit: Callable[[Arrays, dict], object]) -> None:
        self.touched.update([self.shards[k], self.path / MANIFEST])
        rewrite(self.path, k, edit)


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Base]]:
    # In memory where the host has it: every crafted shard is fsynced, as the writer does.
    shm = Path("/dev/shm")
    root = (
        Path(tempfile.mkdtemp(prefix="eagle3kit-fuzz-", dir=shm))
        if shm.is_dir() and os.access(shm, os.W_OK)
        else tmp_path_factory.mktemp("fuzz")
    )
    yield {
        "tokens": Base(token_dataset(root / "tokens")),
        "raw": Base(hidden_dataset(root / "raw", "raw")),
        "zstd": Base(hidden_dataset(root / "zstd", "zstd")),
    }
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def bombs() -> list[np.ndarray]:
    objects = b"[" + b",".join([b'{"finish_reason": "stop"}'] * 4) + b"]"
    return [bomb(objects, BOMB_BYTES, stated) for stated in (True, False)]


# Damage -------------------------------------------------------------------------------------
def _truncate(base: Base, rng: np.random.Generator, bombs: list) -> None:
    target = rng.choice([*base.shards, base.path / MANIFEST, base.path / MARKER])
    base.touched.add(Path(target))
    data = Path(target).read_bytes()
    Path(target).write_bytes(data[: int(rng.integers(0, len(data)))])


def _flip(base: Base, rng: np.random.Generator, bombs: list, again: bool) -> None:
    shard = base.shards[int(rng.integers(len(base.shards)))]
    raw = bytearray(shard.read_bytes())
    (n,) = struct.unpack_from("<Q", raw, 0)
    # Half the flips in the data: with the checksums recomputed they reach the array checks.
    lo = 8 + n if rng.random() < 0.5 else 0
    for _ in range(int(rng.integers(1, 5))):
        raw[int(rng.integers(lo, len(raw)))] ^= 1 << int(rng.integers(8))
    base.touched.add(shard)
    shard.write_bytes(bytes(raw))
    if again:
        # A header that no longer parses stays as flipped.
        with contextlib.suppress(DatasetError, ValueError, TypeError):
            base.rewrite(base.shards.index(shard), lambda a, m: None)


def _value_like(rng: np.random.Generator, array: np.ndarray, n: int) -> np.ndarray:
    """Another array where `array` was: other values, lengths or dtypes."""
    shape = list(array.shape) or [1]
    how = int(rng.integers(6))
    if how == 0:  # values near the valid range, and past it
        return rng.integers(-3, n + 6, shape).astype(array.dtype)
    if how == 1:
        return np.full(
            shape, np.iinfo(array.dtype).max if array.dtype.kind in "iu" else 1, array.dtype
        )
    if how == 2:  # one shorter
        return array[:-1] if len(array) else np.zeros((1, *array.shape[1:]), array.dtype)
    if how == 3:  # one longer (an empty array of rows gains a row of zeros)
        return np.concatenate(
            [array, array[-1:] if len(array) else np.zeros((1, *array.shape[1:]), array.dtype)]
        )
    if how == 4:
        return array.astype(np.float32 if array.dtype.kind != "f" else np.int64)
    return np.zeros((0, *shape[1:]), array.dtype)


def _arrays(base: Base, rng: np.random.Generator, bombs: list) -> None:
    k = int(rng.integers(len(base.shards)))
    names = sorted(read_shard(base.shards[k])[0])

    def edit(a: Arrays, m: dict) -> None:
        for _ in range(int(rng.integers(1, 3))):
            name = names[int(rng.integers(len(names)))]
            if rng.random() < 0.1:
                a.pop(name, None)
            elif name in a:  # the first edit may have dropped `offsets`: size from the array
                samples = len(a["offsets"]) if "offsets" in a else len(a[name])
                a[name] = _value_like(rng, a[name], samples)

    base.rewrite(k, edit)


def _header(base: Base, rng: np.random.Generator, bombs: list) -> None:
    key = str(
        rng.choice(
            ["samples", "partitions", "version", "kind", "codec", "hidden_size", "n_aux", "format"]
        )
    )
    value = str(
        rng.choice(
            [
                "",
                "x",
                "-1",
                "0",
                "3",
                "99999999",
                "1e9",
                '["a","a"]',
                "[1]",
                '["code","math"]',
                "{}",
                "zstd",
                "raw",
                "fp8",
            ]
        )
    )
    base.rewrite(int(rng.integers(len(base.shards))), lambda a, m: m.update({key: value}))


def _meta(base: Base, rng: np.random.Generator, bombs: list) -> None:
    """A crafted metadata frame (token shards) or state frame (zstd hidden shards)."""
    k = int(rng.integers(len(base.shards)))
    arrays, _, _ = read_shard(base.shards[k])
    n = len(arrays["offsets"]) - 1
    json_values = [
        b"[]",
        b"{}",
        b"null",
        b"[1]",
        b"[" + b",".join([b"{}"] * n) + b"]",
        b"[" + b",".join([b'{"finish_reason": 1}'] * n) + b"]",
        b"[" + b",".join([b'{"finish_reason": "stop", "counts": []}'] * n) + b"]",
        b"[" + b",".join([b'{"finish_reason": "stop", "latency": "1"}'] * n) + b"]",
    ]
    frames = [
        *bombs,
        zst(bytes(rng.integers(0, 256, 64, np.uint8))),
        np.frombuffer(bytes(rng.integers(0, 256, 64, np.uint8)), np.uint8),
        *(zst(v) for v in json_values),
    ]
    frame = frames[int(rng.integers(len(frames)))]
    if "meta_zst" in arrays:
        base.rewrite(k, lambda a, m: a.update(meta_zst=frame))
    elif "states_zst" in arrays:

        def swap_first(a: Arrays, m: dict) -> None:
            o = a["states_zst_offsets"]
            rest = a["states_zst"][o[1] :]
            a["states_zst"] = np.concatenate([frame, rest])
            a["states_zst_offsets"] = np.concatenate([[0], o[1:] - o[1] + len(frame)])

        base.rewrite(k, swap_first)
    else:
        _arrays(base, rng, bombs)


def _json_file(base: Base, rng: np.random.Generator, bombs: list) -> None:
    """A hostile value at a random place in the manifest or marker, or a key taken away."""
    path = base.path / (MANIFEST if rng.random() < 0.85 else MARKER)
    base.touched.add(path)
    doc = json.loads(path.read_text())
    holders: list[dict] = [doc]
    if path.name == MANIFEST:
        entry = doc["shards"][int(rng.integers(len(doc["shards"])))]
        holders += [entry, *entry["partitions"].values(), doc.get("hidden") or {}]
    holder = holders[int(rng.integers(len(holders)))]
    if not holder:
        return
    key = str(rng.choice(sorted(holder)))
    if rng.random() < 0.15:
        del holder[key]
    else:
        holder[key] = HOSTILE[int(rng.integers(len(HOSTILE)))]
    path.write_text(json.dumps(doc))


def _counts(base: Base, rng: np.random.Generator, bombs: list) -> None:
    """A manifest entry whose counts agree with themselves and with nothing on disk."""
    base.touched.add(base.path / MANIFEST)
    doc = json.loads((base.path / MANIFEST).read_text())
    entry = doc["shards"][int(rng.integers(len(doc["shards"])))]
    v = int(rng.choice([0, 1, 1000, 2**31, 2**60, 2**63 - 1]))
    entry.update(
        samples=v, bytes=max(entry["bytes"], 8 * v) if rng.random() < 0.5 else entry["bytes"]
    )
    entry["partitions"] = {
        "p": {
            "samples": v,
            "tokens": entry["tokens"],
            "loss_tokens": entry["loss_tokens"],
            "completion_tokens": 0,
            "finish": {"stop": v} if base.path.name == "tokens" else {},
        }
    }
    (base.path / MANIFEST).write_text(json.dumps(doc))
    if rng.random() < 0.5:
        recompute(base.path, base.shards[0])


DAMAGE: list[Callable[[Base, np.random.Generator, list], None]] = [
    _truncate,
    lambda b, r, x: _flip(b, r, x, again=False),
    lambda b, r, x: _flip(b, r, x, True),
    _arrays,
    _header,
    _meta,
    _json_file,
    _counts,
]


# Reading ------------------------------------------------------------------------------------
def _read_like_info(path: Path) -> list[str]:
    ds = Dataset(path, kind=None, verify_shards=False, warn_stray=False)
    ds.partition_stats()
    (len(ds), ds.num_tokens, ds.shard_bytes)
    return ds.check_files() or ds.verify() + ds.duplicate_ids()


def _read_like_validate(path: Path) -> list[str]:
    ds = Dataset(path, kind=None, verify_shards=False)
    problems = ds.check_files() or ds.verify()
    if not problems and ds.kind == "tokens":
        scan(ds, Profile(why_none="fuzz"), want_meta=True)
    return problems


def _read_like_train(path: Path) -> list[str]:
    ds = Dataset(path, kind=None)
    for i in range(len(ds)):
        ds[i]
        ds.token_view(i)
    return []


def _rng(kind: str, n: int) -> tuple[np.random.Generator, int]:
    """Case `n`'s random source and the damage it does (its first draw)."""
    rng = np.random.default_rng([SEED, KINDS.index(kind), n])
    return rng, int(rng.integers(len(DAMAGE)))


def _case(bases: dict[str, Base], bombs: list, kind: str, n: int) -> str:
    """Damage `kind`'s dataset as case `n` says and read it three ways; the outcome."""
    base = bases[kind]
    base.restore()
    rng, damage = _rng(kind, n)
    DAMAGE[damage](base, rng, bombs)
    outcomes = []
    for read in (_read_like_info, _read_like_validate, _read_like_train):
        try:
            problems = read(base.path)
        except DatasetError as exc:
            problems = [str(exc)]
        assert all(p and "\n" not in p for p in problems), problems
        outcomes.append("named" if problems else "clean")
    return "/".join(outcomes)


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10


def _run(bases: dict[str, Base], bombs: list, cases: range) -> dict[str, int]:
    """Every case, each within TIME_LIMIT_S; the process's peak resident size may not grow
    by RSS_GROWTH_LIMIT in all, and the cases that craft frames (the bombs) and every
    TRACE_EVERY-th one are traced: their Python and numpy allocations under MEMORY_LIMIT.
    (Tracing triples a case's time, so not every case is traced.)"""
    seen: dict[str, int] = {}
    rss_before = _peak_rss()
    for kind in KINDS:
        for n in cases:
            traced = DAMAGE[_rng(kind, n)[1]] is _meta or n % TRACE_EVERY == 0
            if traced:
                tracemalloc.start()
            start = time.monotonic()
            try:
                outcome = _case(bases, bombs, kind, n)
            except Exception as exc:
                raise AssertionError(f"case {kind}/{n}: {type(exc).__name__}: {exc}") from exc
            finally:
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
            took = time.monotonic() - start
            assert peak < MEMORY_LIMIT, f"case {kind}/{n}: peak {peak:,} bytes traced"
            assert took < TIME_LIMIT_S, f"case {kind}/{n}: {took:.1f} s"
            assert _peak_rss() - rss_before < RSS_GROWTH_LIMIT, f"case {kind}/{n}: resident size"
            seen[outcome] = seen.get(outcome, 0) + 1
    return seen


def test_fuzzed_datasets_end_in_named_problems(bases: dict[str, Base], bombs: list) -> None:
    seen = _run(bases, bombs, range(CASES))
    # The fuzz reaches both ends: damage that is caught, and damage no reader minds (a
    # flipped bit in header padding, a manifest time changed).
    assert seen.get("named/named/named", 0) > CASES
    assert sum(v for k, v in seen.items() if "clean" in k) > 0


@pytest.mark.slow
def test_fuzzed_datasets_end_in_named_problems_at_length(
    bases: dict[str, Base], bombs: list
) -> None:
    _run(bases, bombs, range(CASES, CASES + SLOW_CASES))

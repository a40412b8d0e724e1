"""Fuzzing convert's Parquet import: whatever a Parquet file from elsewhere holds, the import
ends in one line naming the file (and the row), or in rows refused and counted, within
TIME_LIMIT_S and bounded memory (issue 38, item 8).

Crafted cases are the bombs a small file can hold: a run of one repeated id declaring
millions of ids (alone in its row group, among valid rows, in every column that takes
lists, nested in a struct, in an unknown column), a long string repeated on every row (read
as a dictionary), a long string alone, and rows of every wrong shape and type. Random cases
draw a schema (known and unknown columns, of list, string, int, float, struct and null
types), row groups and values (hostile ints among them), and some are truncated or have bytes
flipped. Each runs the stage's `run` on a real file with --skip-bad-lines or without; its
traced Python memory stays under MEMORY_LIMIT, and the process's peak resident size grows by
less than RSS_GROWTH_LIMIT over all of them. Cases are seeded by their number: a failure
names it, and `_random_case(path, n)` writes it again.
"""

from __future__ import annotations

import resource
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from parquetcraft import ids_bomb_table, repeated_ids, rows_table, sample_row, write_groups

from eagle3kit._options import OutputOptions
from eagle3kit.convert import ConvertConfig, run
from eagle3kit.errors import UserError
from eagle3kit.format import MAX_SAMPLE_TOKENS, Dataset

SEED = 38
CASES = 40
SLOW_CASES = 2_000
TIME_LIMIT_S = 5.0
MEMORY_LIMIT = 64 << 20
RSS_GROWTH_LIMIT = 512 << 20
HOSTILE_INTS = [0, 1, -1, 2**31 - 1, 2**31, 2**62, -(2**63), 2**63 - 1]
IDS = pa.list_(pa.int64())


# Crafted cases -------------------------------------------------------------------------------
def _valid(n: int, first: int = 0) -> pa.Table:
    schema = pa.schema([("sample_id", pa.string()), ("prompt_ids", IDS), ("completion_ids", IDS)])
    return rows_table([sample_row(first + i) for i in range(n)], schema)


def _lone_bomb(column: str, ids: int) -> Callable[[Path], Path]:
    def write(path: Path) -> Path:
        return write_groups(path, [_valid(2), ids_bomb_table(2, [ids], column), _valid(2, 3)])

    return write


def _shared_bomb(path: Path) -> Path:
    return write_groups(path, [ids_bomb_table(0, [2, MAX_SAMPLE_TOKENS + 1, 2, 5])])


def _many_groups(path: Path) -> Path:
    return write_groups(path, [ids_bomb_table(k, [MAX_SAMPLE_TOKENS + 1]) for k in range(4)])


def _mask_bomb(path: Path) -> Path:
    table = _valid(3).append_column("loss_mask", repeated_ids([4, MAX_SAMPLE_TOKENS + 1, 4], 1))
    return write_groups(path, [table])


def _unknown_column_bomb(path: Path) -> Path:
    return write_groups(
        path, [_valid(1).append_column("padding", repeated_ids([MAX_SAMPLE_TOKENS + 1]))]
    )


def _struct_bomb(path: Path) -> Path:
    nested = pa.StructArray.from_arrays([repeated_ids([MAX_SAMPLE_TOKENS + 1, 1])], names=["pad"])
    return write_groups(path, [_valid(2).append_column("metadata", nested)])


def _repeated_string(path: Path) -> Path:
    # One 1 MiB string on each of 100 rows: a dictionary page holds it once.
    text = '{"pad": "' + "x" * (1 << 20) + '"}'
    indices = pa.array(np.zeros(100, np.int32))
    column = pa.DictionaryArray.from_arrays(indices, pa.array([text])).cast(pa.string())
    return write_groups(path, [_valid(100).append_column("metadata", column)])


def _long_string(path: Path) -> Path:
    text = "y" * (8 << 20)
    with pq.ParquetWriter(
        path,
        _valid(1).schema.append(pa.field("source", pa.string())),
        compression="zstd",
        use_dictionary=False,
    ) as out:
        out.write_table(_valid(1).append_column("source", pa.array([text])))
    return path


def _wrong_types(path: Path) -> Path:
    table = pa.table(
        {
            "sample_id": pa.array([1, 2, None, 4], pa.int64()),
            "prompt_ids": pa.array([[1.5], None, [1e300], []], pa.list_(pa.float64())),
            "completion_ids": pa.array(["a", "b", None, "d"]),
            "latency": pa.array(["fast", None, "1", "x"]),
            "partition": pa.array([[1], [2], None, []], IDS),
        }
    )
    return write_groups(path, [table])


def _hostile_ids(path: Path) -> Path:
    rows = [sample_row(i, completion_ids=[v]) for i, v in enumerate(HOSTILE_INTS)]
    return write_groups(
        path,
        [
            rows_table(
                rows,
                pa.schema(
                    [("sample_id", pa.string()), ("prompt_ids", IDS), ("completion_ids", IDS)]
                ),
            )
        ],
    )


def _large_list_ids(path: Path) -> Path:
    ids = pa.large_list(pa.uint64())
    table = pa.table(
        {
            "sample_id": ["a", "b"],
            "prompt_ids": pa.array([[1], [2**64 - 1]], ids),
            "completion_ids": pa.array([[2], [3]], ids),
        }
    )
    return write_groups(path, [table])


def _no_columns_known(path: Path) -> Path:
    return write_groups(path, [pa.table({"x": pa.array([None, None], pa.null())})])


def _empty(path: Path) -> Path:
    return write_groups(path, [_valid(0)])


CRAFTED: dict[str, Callable[[Path], Path]] = {
    "lone bomb in completion_ids": _lone_bomb("completion_ids", MAX_SAMPLE_TOKENS + 1),
    "lone bomb in prompt_ids": _lone_bomb("prompt_ids", MAX_SAMPLE_TOKENS + 1),
    "bomb among valid rows": _shared_bomb,
    "a bomb in each of four groups": _many_groups,
    "loss_mask bomb": _mask_bomb,
    "unknown column bomb": _unknown_column_bomb,
    "bomb nested in a struct": _struct_bomb,
    "1 MiB string on every row": _repeated_string,
    "one 8 MiB string": _long_string,
    "every column of a wrong type": _wrong_types,
    "hostile ids": _hostile_ids,
    "large_list of uint64 ids": _large_list_ids,
    "no column known": _no_columns_known,
    "no rows": _empty,
}


# Random cases --------------------------------------------------------------------------------
def _random_ids(rng: np.random.Generator, n: int) -> list:
    out: list = []
    for _ in range(n):
        r = rng.random()
        if r < 0.1:
            out.append(None)
        elif r < 0.2:
            out.append([int(v) for v in rng.choice(HOSTILE_INTS, int(rng.integers(1, 4)))])
        else:
            out.append(rng.integers(0, 1000, int(rng.integers(0, 12))).tolist())
    return out


def _random_column(rng: np.random.Generator, name: str, n: int) -> pa.Array:
    kind = int(rng.integers(6))
    if kind == 0 or name.endswith("_ids") or name == "loss_mask":
        if rng.random() < 0.1:
            # Short rows, and one past the bound (whose Python objects are never made).
            lengths = rng.integers(0, 100, n).tolist()
            if n:
                lengths[int(rng.integers(n))] = int(
                    rng.integers(MAX_SAMPLE_TOKENS + 1, 2 * MAX_SAMPLE_TOKENS)
                )
            return repeated_ids(lengths)
        return pa.array(_random_ids(rng, n), IDS)
    if kind == 1:
        return pa.array(
            [None if rng.random() < 0.2 else f"{name}-{int(rng.integers(1e6))}" for _ in range(n)]
        )
    if kind == 2:
        return pa.array([int(rng.choice(HOSTILE_INTS)) for _ in range(n)], pa.int64())
    if kind == 3:
        return pa.array(rng.standard_normal(n))
    if kind == 4:
        return pa.StructArray.from_arrays([pa.array(rng.integers(0, 9, n))], names=["k"])
    return pa.nulls(n)


NAMES = [
    "sample_id",
    "prompt_ids",
    "completion_ids",
    "finish_reason",
    "partition",
    "metadata",
    "loss_mask",
    "source",
    "server",
    "latency",
    "counts",
    "prompt_text",
    "extra",
]


def _random_case(path: Path, n: int) -> Path:
    """Random case `n`: a random table in random row groups, sometimes damaged after."""
    rng = np.random.default_rng([SEED, n])
    rows = int(rng.integers(0, 40))
    names = [name for name in NAMES if rng.random() < 0.8]
    if rng.random() < 0.7:  # most have the ids a sample needs, so rows get further
        names = list(dict.fromkeys(["sample_id", "prompt_ids", "completion_ids", *names]))
    columns: dict[str, pa.Array] = {}
    for name in names:
        columns[name] = (
            pa.array([f"id-{i}" for i in range(rows)])
            if name == "sample_id" and rng.random() < 0.8
            else _random_column(rng, name, rows)
        )
    table = pa.table(columns) if columns else pa.table({"x": pa.nulls(rows)})
    groups = int(rng.integers(1, 5))
    pq.write_table(table, path, row_group_size=max(1, rows // groups), compression="zstd")
    damage = rng.random()
    if damage < 0.15:  # truncated
        data = path.read_bytes()
        path.write_bytes(data[: int(rng.integers(0, len(data)))])
    elif damage < 0.3:  # bytes flipped
        data = bytearray(path.read_bytes())
        for at in rng.integers(0, len(data), int(rng.integers(1, 8))):
            data[at] ^= 1 << int(rng.integers(8))
        path.write_bytes(bytes(data))
    return path


# Running -------------------------------------------------------------------------------------
def _import(src: Path, dst: Path, skip: bool) -> str:
    """Import `src` as the stage does; its outcome, checked to be one line or counted rows."""
    output = OutputOptions(quiet=True, no_progress=True)
    try:
        result = run(ConvertConfig(src, dst, skip_bad_lines=skip, output=output))
    except UserError as exc:
        message = str(exc)
        assert message and "\n" not in message, message
        assert str(src) in message, message
        return "one line"
    assert skip or result.bad_lines == 0
    assert len(Dataset(dst)) == result.written
    return "refused rows" if result.bad_lines else "clean"


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10


def _check(name: str, case: Callable[[Path], Path], tmp: Path) -> str:
    """Write the case, import it twice (stopping at a bad row, then skipping them), within
    the time and memory bounds; the second run's outcome."""
    src = case(tmp / "case.parquet")
    outcome = ""
    for skip in (False, True):
        dst = tmp / f"ds-{skip}"
        tracemalloc.start()
        start = time.monotonic()
        try:
            outcome = _import(src, dst, skip)
        except AssertionError:
            raise
        except Exception as exc:
            raise AssertionError(f"case {name}: {type(exc).__name__}: {exc}") from exc
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        took = time.monotonic() - start
        assert took < TIME_LIMIT_S, f"case {name}: {took:.1f} s"
        assert peak < MEMORY_LIMIT, f"case {name}: peak {peak:,} bytes traced"
        if dst.exists():  # a small file never stores a large dataset
            assert sum(f.stat().st_size for f in dst.rglob("*") if f.is_file()) < 1 << 20
    return outcome


def _fresh(tmp_path: Path, label: str) -> Path:
    where = tmp_path / label
    where.mkdir()
    return where


def test_crafted_parquet_files_end_in_one_line_or_refused_rows(tmp_path: Path) -> None:
    rss_before = _peak_rss()
    seen = {
        name: _check(name, case, _fresh(tmp_path, f"c{k}"))
        for k, (name, case) in enumerate(CRAFTED.items())
    }
    assert _peak_rss() - rss_before < RSS_GROWTH_LIMIT
    # Every bomb is refused by row, and its neighbours stored.
    for name in CRAFTED:
        if "bomb" in name or "string" in name:
            assert seen[name] == "refused rows", (name, seen[name])
    assert seen["no rows"] == "clean"


def _random_cases(tmp_path: Path, cases: range) -> dict[str, int]:
    rss_before = _peak_rss()
    seen: dict[str, int] = {}
    for n in cases:
        outcome = _check(
            f"random {n}", lambda path, n=n: _random_case(path, n), _fresh(tmp_path, f"r{n}")
        )
        seen[outcome] = seen.get(outcome, 0) + 1
        assert _peak_rss() - rss_before < RSS_GROWTH_LIMIT, f"case random {n}: resident size"
    return seen


def test_random_parquet_files_end_in_one_line_or_refused_rows(tmp_path: Path) -> None:
    seen = _random_cases(tmp_path, range(CASES))
    # The fuzz reaches every end: damage named in one line, rows refused, clean imports.
    assert set(seen) == {"one line", "refused rows", "clean"}, seen


@pytest.mark.slow
def test_random_parquet_files_end_in_one_line_or_refused_rows_at_length(tmp_path: Path) -> None:
    _random_cases(tmp_path, range(CASES, CASES + SLOW_CASES))

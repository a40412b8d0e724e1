"""Crafting Parquet files for convert's import: rows of token samples, and bombs (a run of
one repeated id that compresses millions of ids into a few hundred bytes, a long string
repeated on every row) written with pyarrow itself, so the files are real Parquet."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def sample_row(i: int, **extra: object) -> dict:
    return {"sample_id": f"id-{i}", "prompt_ids": [1, 2], "completion_ids": [3, i], **extra}


def repeated_ids(lengths: list[int], value: int = 7) -> pa.ListArray:
    """A list<int64> column whose rows hold `lengths` ids, all `value` (dictionary and RLE
    encoding make any run of them a few bytes)."""
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = pa.array(np.full(int(offsets[-1]), value, np.int64), pa.int64())  # no copy
    return pa.ListArray.from_arrays(pa.array(offsets), values)


def write_groups(path: Path, groups: list[pa.Table]) -> Path:
    """One row group per table (all of one schema), zstd-compressed."""
    with pq.ParquetWriter(path, groups[0].schema, compression="zstd") as out:
        for table in groups:
            out.write_table(table, row_group_size=max(1, table.num_rows))
    return path


def rows_table(rows: list[dict], schema: pa.Schema | None = None) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=schema)


def ids_bomb_table(first: int, lengths: list[int], column: str = "completion_ids") -> pa.Table:
    """Rows `first`.. with `lengths` repeated ids in `column` (the others short and valid)."""
    n = len(lengths)
    columns = {
        "sample_id": [f"id-{first + k}" for k in range(n)],
        "prompt_ids": pa.array([[1, 2]] * n, pa.list_(pa.int64())),
        "completion_ids": pa.array([[3, 4]] * n, pa.list_(pa.int64())),
    }
    columns[column] = repeated_ids(lengths)
    return pa.table(columns)


BOMB_IDS = 20_000_000
"""The issue's bomb: 20 M ids in one row, in about 1.3 KB of file."""


def bomb_file(path: Path, before: int = 2, after: int = 2, ids: int = BOMB_IDS) -> Path:
    """`before` valid rows, one row of `ids` repeated ids (its own row group), `after` more
    valid rows: the bomb is row `before`."""
    plain = pa.schema(
        [
            ("sample_id", pa.string()),
            ("prompt_ids", pa.list_(pa.int64())),
            ("completion_ids", pa.list_(pa.int64())),
        ]
    )
    groups = [
        rows_table([sample_row(i) for i in range(before)], plain),
        ids_bomb_table(before, [ids]),
        rows_table([sample_row(before + 1 + i) for i in range(after)], plain),
    ]
    return write_groups(path, [g for g in groups if g.num_rows])

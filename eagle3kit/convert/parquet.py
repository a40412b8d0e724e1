"""`eagle3kit convert` for token datasets as Parquet: a dataset to one `.parquet` file and
back, losslessly, so pandas, polars and `datasets.load_dataset("parquet", ...)` open it.

One row per sample, with the JSONL record's columns (jsonl.py): `sample_id`, `prompt_ids`,
`completion_ids` and `loss_mask` as lists of int64, `finish_reason` and `partition` as
strings, `latency` as a float, and `metadata`, `source`, `server`, `counts` as JSON text —
a free-form object has no fixed Parquet type, and a struct column would add every other
row's keys to each row (as nulls), which would not read back as the same sample. A column
a sample lacks is null. With a tokenizer, export adds `prompt_text` and `completion_text`.

Import reads any Parquet file with these columns (object columns as JSON text or as
structs) and checks each row exactly as a JSONL line (`record_to_sample`), naming the file
and the row (counted from 0, as pandas and datasets number them).
"""

from __future__ import annotations

import faulthandler
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from eagle3kit import _ui
from eagle3kit._durable import fsync_file, replace_durably
from eagle3kit.convert.config import ConvertConfig
from eagle3kit.convert.jsonl import (
    FIRST_COMMIT,
    TEXT_KEYS,
    SourceMark,
    check_partition,
    count_added,
    count_bad,
    export_error,
    load_export_tokenizer,
    record_to_sample,
    report_import,
    sample_to_record,
)
from eagle3kit.convert.result import ConvertResult
from eagle3kit.errors import UserError
from eagle3kit.format import MAX_SAMPLE_TOKENS, Dataset, DatasetWriter, meta_bound

JSON_COLUMNS = ("metadata", "source", "server", "counts")
ROWS_PER_GROUP = 1024
"""Rows written per row group (and read per batch): small enough to hold in memory at any
sample length, large enough that a reader sees few groups."""


def _schema(with_text: bool) -> Any:
    import pyarrow as pa

    ids = pa.list_(pa.int64())
    columns = [
        ("sample_id", pa.string()),
        ("prompt_ids", ids),
        ("completion_ids", ids),
        ("finish_reason", pa.string()),
        ("partition", pa.string()),
        ("metadata", pa.string()),
        ("loss_mask", ids),
        ("source", pa.string()),
        ("server", pa.string()),
        ("latency", pa.float64()),
        ("counts", pa.string()),
    ]
    if with_text:
        columns += [("prompt_text", pa.string()), ("completion_text", pa.string())]
    return pa.schema(columns)


def _row(record: dict) -> dict:
    for key in JSON_COLUMNS:
        if record.get(key) is not None:
            record[key] = orjson.dumps(record[key]).decode()
    return record


# Export ------------------------------------------------------------------------------------
def export_parquet(cfg: ConvertConfig) -> ConvertResult:
    import pyarrow as pa
    import pyarrow.parquet as pq

    ds = Dataset(cfg.src)
    _ui.warn_all(ds.warnings)
    check_partition(cfg, ds)
    tokenizer = load_export_tokenizer(cfg)
    schema = _schema(tokenizer is not None)
    tmp = cfg.dst.with_name(cfg.dst.name + f".{os.getpid()}.tmp")
    n = 0
    rows: list[dict] = []
    try:
        with pq.ParquetWriter(tmp, schema) as out:
            for sample in ds.iter_samples(cfg.partition):
                record = sample_to_record(sample)
                if tokenizer is not None:
                    record["prompt_text"] = tokenizer.decode(record["prompt_ids"])
                    record["completion_text"] = tokenizer.decode(record["completion_ids"])
                rows.append(_row(record))
                n += 1
                if len(rows) == ROWS_PER_GROUP:
                    out.write_table(pa.Table.from_pylist(rows, schema=schema))
                    rows.clear()
            if rows or not n:  # an empty dataset still gets a file with the columns
                out.write_table(pa.Table.from_pylist(rows, schema=schema))
        fsync_file(tmp)
        replace_durably(tmp, cfg.dst)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        # A full disk or an unwritable place is the user's to fix: one line, no traceback.
        if isinstance(exc, OSError):
            raise export_error(cfg.dst, exc) from None
        raise
    _ui.info(f"wrote {n:,} samples to {cfg.dst}", cfg.output)
    return ConvertResult("export", n, dst=str(cfg.dst))


# Import ------------------------------------------------------------------------------------
def _open(src: Path) -> Any:
    """The file, its string columns read as dictionaries: a long string repeated on every
    row is decoded once, not once per row, before the rows' sizes are checked."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(src)
        strings = [
            f.name
            for f in schema
            if pa.types.is_string(f.type)
            or pa.types.is_large_string(f.type)
            or pa.types.is_binary(f.type)
            or pa.types.is_large_binary(f.type)
        ]
        pf = pq.ParquetFile(src, read_dictionary=strings)
    except (OSError, pa.ArrowException) as exc:
        # Arrow's messages may run over lines (thrift's end with one): one line here.
        raise UserError(
            f"{src}: not a readable Parquet file ({' '.join(str(exc).split())})"
        ) from None
    aborted_at = _metadata_abort(pf)
    if aborted_at is not None:
        raise UserError(
            f"{src}: not a readable Parquet file (the Parquet reader aborts on the metadata "
            f"of {aborted_at}: the file is damaged)"
        )
    return pf


METADATA_WALK_S = 60.0
"""How long a forked child may take to walk a file's column metadata (it takes milliseconds
for any footer pyarrow would open)."""


def _metadata_abort(pf: Any) -> str | None:
    """The column chunk whose metadata aborts the process when read, or None. pyarrow 25
    builds a column chunk's metadata where a C++ exception cannot be caught (a damaged
    size-statistics histogram ends in std::terminate, not a Python error), so a forked child
    reads every chunk's first, writing down a pipe each one it reaches."""
    if not hasattr(os, "fork"):
        return None
    meta = pf.metadata
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: touch every chunk, then leave without running any cleanup
        try:  # a Python error here is the parent's to report, when it meets it itself
            os.close(read_end)
            os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # the C++ runtime's last words
            faulthandler.disable()  # and Python's, where it was on (its own copy of stderr)
            for group in range(meta.num_row_groups):
                row_group = meta.row_group(group)
                for column in range(row_group.num_columns):
                    os.write(write_end, f"row group {group}, column {column}\n".encode())
                    row_group.column(column)
        finally:
            os._exit(0)  # only a death by signal (or the time bound) counts
    os.close(write_end)
    try:
        reached, status = _last_line_and_status(read_end, pid)
    finally:
        os.close(read_end)
    if os.WIFEXITED(status):
        return None
    return reached or "the file's footer"


def _last_line_and_status(fd: int, pid: int) -> tuple[str, int]:
    """The last line the child wrote and how it ended; a child still walking after
    METADATA_WALK_S is killed (and so counts as aborting)."""
    import select
    import signal
    import time

    deadline = time.monotonic() + METADATA_WALK_S
    tail = b""
    while True:
        ready, _, _ = select.select([fd], [], [], max(deadline - time.monotonic(), 0))
        if not ready:
            os.kill(pid, signal.SIGKILL)
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        tail = (tail + chunk)[-4096:]
    _, status = os.waitpid(pid, 0)
    lines = tail.decode(errors="replace").splitlines()
    return (lines[-1] if lines else ""), status


def _file_hash(src: Path) -> str:
    import xxhash

    hasher = xxhash.xxh3_128()
    with open(src, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            hasher.update(chunk)
    return hasher.hexdigest()


BATCH_VALUES = 1 << 21
"""Values (token ids, strings) a batch decodes when its row group's rows share them evenly:
as many as the longest sample holds (MAX_SAMPLE_TOKENS), 16 MiB in Arrow, whatever the rows
per group."""
IDS_COLUMNS = ("prompt_ids", "completion_ids")
ROW_BYTES_PER_TOKEN = 16
"""A row's bytes per token beside its metadata's share: its ids and its loss mask, as int64."""


def row_bytes_bound(tokens: int) -> int:
    """The most bytes a row of `tokens` tokens may decode to: its ids and loss mask, and the
    share of metadata the format allows a sample (docs/format.md)."""
    return meta_bound(1, tokens) + ROW_BYTES_PER_TOKEN * tokens


MAX_ROW_BYTES = row_bytes_bound(MAX_SAMPLE_TOKENS)


def _group_refusal(group: Any) -> str | None:
    """Why no row of this row group can be a sample, from its metadata alone (nothing is
    decoded): a column declaring more values than its rows may hold (a run of one repeated id
    compresses millions of them into a few bytes), or more bytes."""
    rows = group.num_rows
    most = f"more than {'a sample' if rows == 1 else f'{rows:,} samples'} may hold"
    declared = 0
    for i in range(group.num_columns):
        column = group.column(i)
        if column.num_values > rows * MAX_SAMPLE_TOKENS:
            name = column.path_in_schema.split(".")[0]
            return (
                f"its row group declares {column.num_values:,} values in {name}, {most} "
                f"({MAX_SAMPLE_TOKENS:,} tokens each)"
            )
        declared += column.total_uncompressed_size
    if declared > rows * MAX_ROW_BYTES:
        return f"its row group declares {declared:,} bytes, {most} ({MAX_ROW_BYTES:,} bytes each)"
    return None


def _batch_rows(group: Any) -> int:
    """Rows per batch for this row group: about BATCH_VALUES values decoded at a time."""
    values = sum(
        max(group.column(i).num_values, group.column(i).total_uncompressed_size // 8)
        for i in range(group.num_columns)
    )
    return max(1, min(ROWS_PER_GROUP, BATCH_VALUES * group.num_rows // max(values, 1)))


def _entry_bytes(array: Any) -> Any:
    """The bytes each entry of an Arrow array decodes to (as a numpy int64 array): what
    `to_pylist` would turn into Python objects."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = array.type
    n = len(array)
    if pa.types.is_dictionary(kind):  # read_dictionary: each distinct string held once
        sizes = _entry_bytes(array.dictionary)
        indices = array.indices.fill_null(0).to_numpy(zero_copy_only=False)
        return sizes[indices] if len(sizes) else np.zeros(n, np.int64)
    if (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
    ):
        return pc.binary_length(array).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        lengths = (
            pc.list_value_length(array).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        )
        inner = array.flatten()
        if pa.types.is_primitive(inner.type):
            return lengths * max(1, inner.type.bit_width // 8)
        ends = np.cumsum(lengths)
        total = np.concatenate([[0], np.cumsum(_entry_bytes(inner))])
        return total[ends] - total[ends - lengths]
    if pa.types.is_struct(kind):
        return sum((_entry_bytes(child) for child in array.flatten()), np.zeros(n, np.int64))
    if pa.types.is_primitive(kind):
        return np.full(n, max(1, kind.bit_width // 8), np.int64)
    return np.full(n, array.nbytes, np.int64)  # a map or a union: charged the whole array


def _row_problems(batch: Any) -> list[str | None]:
    """Why each row of a decoded batch cannot be a sample because of its size (None: it may
    be one), found in Arrow before any of it becomes Python objects."""
    import numpy as np

    names = batch.schema.names
    tokens = sum(
        (_lengths(batch, name) for name in IDS_COLUMNS if name in names),
        np.zeros(batch.num_rows, np.int64),
    )
    mask = _lengths(batch, "loss_mask") if "loss_mask" in names else np.zeros_like(tokens)
    nbytes = sum(
        (_entry_bytes(column) for column in batch.columns), np.zeros(batch.num_rows, np.int64)
    )
    problems: list[str | None] = []
    for n, m, size in zip(tokens.tolist(), mask.tolist(), nbytes.tolist(), strict=True):
        if max(n, m) > MAX_SAMPLE_TOKENS:
            problems.append(
                f"{max(n, m):,} tokens, more than a sample may hold ({MAX_SAMPLE_TOKENS:,})"
            )
        elif size > row_bytes_bound(n):
            problems.append(
                f"it decodes to {size:,} bytes, more than a sample of {n:,} tokens "
                f"may hold ({row_bytes_bound(n):,})"
            )
        else:
            problems.append(None)
    return problems


def _lengths(batch: Any, name: str) -> Any:
    """The entries of list column `name` in each row (0 for a null; what is not a list
    is left to the row's own check)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    column = batch.column(name)
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)):
        return np.zeros(batch.num_rows, np.int64)
    return pc.list_value_length(column).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)


def _decoded(batch: Any) -> list[dict | ValueError]:
    """A batch's rows as dicts; a row too large to be a sample as the ValueError saying so,
    never turned into Python objects."""
    import pyarrow as pa

    problems = _row_problems(batch)
    if not any(problems):
        return batch.to_pylist()
    fine = iter(batch.filter(pa.array([p is None for p in problems])).to_pylist())
    return [ValueError(p) if p else next(fine) for p in problems]


def _batches(pf: Any, src: Path, skip: int) -> Iterator[list[dict | ValueError]]:
    """The file's rows as lists of dicts, from row `skip` on; a row too large to be a sample
    as the ValueError saying why (refused like any malformed row); a damaged file ends in
    one line naming it. The text columns export adds are not read: import ignores them."""
    import pyarrow as pa

    columns = [name for name in pf.schema_arrow.names if name not in TEXT_KEYS]
    try:
        for group in range(pf.num_row_groups):
            meta = pf.metadata.row_group(group)
            size = meta.num_rows
            if skip >= size:  # a group the committed samples already cover: not even read
                skip -= size
                continue
            refusal = _group_refusal(meta)
            if refusal is not None:
                yield [ValueError(refusal)] * (size - skip)
                skip = 0
                continue
            for batch in pf.iter_batches(
                batch_size=_batch_rows(meta), row_groups=[group], columns=columns
            ):
                if skip >= batch.num_rows:
                    skip -= batch.num_rows
                    continue
                rows = _decoded(batch.slice(skip))
                skip = 0
                yield rows
    except (OSError, pa.ArrowException) as exc:
        raise UserError(
            f"{src}: cannot read the Parquet data ({' '.join(str(exc).split())})"
        ) from None


def _record(row: dict) -> dict:
    """A row as the JSONL record it stands for: the JSON-text columns parsed, nulls dropped
    (a null is a key the record lacks)."""
    record = {}
    for key, value in row.items():
        if value is None:
            continue
        if key in JSON_COLUMNS and isinstance(value, str):
            try:
                value = orjson.loads(value)
            except orjson.JSONDecodeError as exc:
                raise ValueError(f"{key} is not valid JSON ({exc.msg})") from None
        record[key] = value
    return record


def import_parquet(cfg: ConvertConfig) -> ConvertResult:
    pf = _open(cfg.src)
    # The whole file's size and hash stand for it: a rerun on the same file continues at the
    # row after the last committed one; any other file is read from the top (ids dedupe).
    whole = SourceMark(cfg.src.name, nbytes=cfg.src.stat().st_size, xxh3=_file_hash(cfg.src))
    result = ConvertResult("import", 0, dst=str(cfg.dst))
    writer = DatasetWriter(
        cfg.dst,
        **cfg.write.writer_options(),
        config={"stage": "convert", "source": cfg.src.name},
        provenance={"source": str(cfg.src.resolve())},
    )
    _ui.warn_all(writer.warnings)
    first_commit = min(cfg.write.commit_every, FIRST_COMMIT)
    with writer:
        saved = SourceMark.from_json(cfg.src.name, writer.progress_at_open)
        same = saved is not None and (saved.nbytes, saved.xxh3) == (whole.nbytes, whole.xxh3)
        mark = saved if saved is not None and same else whole
        result.skipped_existing = mark.samples
        earlier_bad = mark.bad_lines
        with _ui.Progress(
            "convert", pf.metadata.num_rows, cfg.output, unit="rows", initial=mark.line
        ) as progress:
            for rows in _batches(pf, cfg.src, mark.line):
                for row in rows:
                    _import_row(cfg, row, mark, writer, result, progress)
                    mark.line += 1
                    writer.note_progress(mark.to_json())
                    if result.written == first_commit and writer.pending == first_commit:
                        writer.commit(wait=False)
    report_import(cfg, result, writer, earlier_bad, "rows")
    return result


def _import_row(
    cfg: ConvertConfig,
    row: dict | ValueError,
    mark: SourceMark,
    writer: DatasetWriter,
    result: ConvertResult,
    progress: _ui.Progress,
) -> None:
    try:
        if isinstance(row, ValueError):  # too large to decode: refused as it stands
            raise row
        sample = record_to_sample(_record(row))
        added = writer.add(sample)
    except (ValueError, OverflowError, TypeError) as exc:
        if not cfg.skip_bad_lines:
            raise UserError(
                f"{cfg.src}: row {mark.line} (counting from 0): {exc} (use "
                "--skip-bad-lines to skip such rows; samples before it are "
                "committed)"
            ) from None
        count_bad(mark, result, progress)
        return
    count_added(sample, added, mark, result, progress)

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

import os
from pathlib import Path
from typing import Any

import orjson

from eagle3kit import _ui
from eagle3kit._durable import fsync_file, replace_durably
from eagle3kit.convert.config import ConvertConfig
from eagle3kit.convert.jsonl import (
    FIRST_COMMIT,
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
from eagle3kit.format import Dataset, DatasetWriter

JSON_COLUMNS = ("metadata", "source", "server", "counts")
ROWS_PER_GROUP = 1024
"""Rows written per row group (and read per batch): small enough to hold in memory at any
sample length, large enough that a reader sees few groups."""


def _schema(with_text: bool) -> Any:
    import pyarrow as pa

    ids = pa.list_(pa.int64())
    columns = [("sample_id", pa.string()), ("prompt_ids", ids), ("completion_ids", ids),
               ("finish_reason", pa.string()), ("partition", pa.string()),
               ("metadata", pa.string()), ("loss_mask", ids), ("source", pa.string()),
               ("server", pa.string()), ("latency", pa.float64()), ("counts", pa.string())]
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
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(src)
    except (OSError, pa.ArrowException) as exc:
        raise UserError(f"{src}: not a readable Parquet file ({exc})") from None


def _file_hash(src: Path) -> str:
    import xxhash

    hasher = xxhash.xxh3_128()
    with open(src, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            hasher.update(chunk)
    return hasher.hexdigest()


def _batches(pf: Any, src: Path, skip: int):
    """The file's rows as lists of dicts, from row `skip` on; a damaged file ends in one line
    naming it."""
    import pyarrow as pa

    try:
        for group in range(pf.num_row_groups):
            size = pf.metadata.row_group(group).num_rows
            if skip >= size:  # a group the committed samples already cover: not even read
                skip -= size
                continue
            for batch in pf.iter_batches(batch_size=ROWS_PER_GROUP, row_groups=[group]):
                rows = batch.to_pylist()
                if skip:
                    rows, skip = rows[skip:], max(0, skip - len(rows))
                yield rows
    except (OSError, pa.ArrowException) as exc:
        raise UserError(f"{src}: cannot read the Parquet data ({exc})") from None


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
        cfg.dst, **cfg.write.writer_options(),
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
        with _ui.Progress("convert", pf.metadata.num_rows, cfg.output, unit="rows",
                          initial=mark.line) as progress:
            for rows in _batches(pf, cfg.src, mark.line):
                for row in rows:
                    _import_row(cfg, row, mark, writer, result, progress)
                    mark.line += 1
                    writer.note_progress(mark.to_json())
                    if result.written == first_commit and writer.pending == first_commit:
                        writer.commit(wait=False)
    report_import(cfg, result, writer, earlier_bad, "rows")
    return result


def _import_row(cfg: ConvertConfig, row: dict, mark: SourceMark, writer: DatasetWriter,
                result: ConvertResult, progress: _ui.Progress) -> None:
    try:
        sample = record_to_sample(_record(row))
        added = writer.add(sample)
    except (ValueError, OverflowError, TypeError) as exc:
        if not cfg.skip_bad_lines:
            raise UserError(f"{cfg.src}: row {mark.line} (counting from 0): {exc} (use "
                            "--skip-bad-lines to skip such rows; samples before it are "
                            "committed)") from None
        count_bad(mark, result, progress)
        return
    count_added(sample, added, mark, result, progress)

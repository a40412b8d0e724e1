"""`eagle3kit convert` for token datasets: a dataset to JSONL and JSONL to a dataset,
losslessly.

One sample per line: `sample_id`, `prompt_ids`, `completion_ids`, `finish_reason`,
`partition`, `metadata`, plus `loss_mask` (only when it is not the completion positions),
`source`, `server`, `latency` and `counts` when the sample has them. With a tokenizer,
export adds `prompt_text` and `completion_text`, which import ignores.

Hidden-state datasets go to and from speculators' and SpecForge's per-sample files instead
(`--to`, eagle3kit/convert/hidden.py).
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from eagle3kit import _text, _ui
from eagle3kit._durable import replace_durably
from eagle3kit.convert.config import ConvertConfig
from eagle3kit.convert.result import ConvertResult
from eagle3kit.errors import UserError
from eagle3kit.format import Dataset, DatasetWriter, TokenSample

REQUIRED = ("sample_id", "prompt_ids", "completion_ids")
OPTIONAL = (
    "finish_reason",
    "partition",
    "metadata",
    "loss_mask",
    "source",
    "server",
    "latency",
    "counts",
)
TEXT_KEYS = ("prompt_text", "completion_text")


# Export ------------------------------------------------------------------------------------
def sample_to_record(sample: TokenSample) -> dict:
    record: dict = {
        "sample_id": sample.sample_id,
        "prompt_ids": [int(t) for t in sample.prompt_ids],
        "completion_ids": [int(t) for t in sample.completion_ids],
        "finish_reason": sample.finish_reason,
        "partition": sample.partition,
        "metadata": sample.metadata,
    }
    if sample.loss_mask is not None:
        record["loss_mask"] = [int(m) for m in sample.loss_mask]
    for key in ("source", "server", "latency", "counts"):
        if getattr(sample, key) is not None:
            record[key] = getattr(sample, key)
    return record


def export_error(dst: Path, exc: OSError) -> UserError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return UserError(
            f"{dst}: no space left to write ({exc.strerror}); the partial file was "
            "removed and the dataset is untouched: free some space and rerun the "
            "same command"
        )
    return UserError(f"{dst}: cannot write: {exc.strerror or exc}")


def check_partition(cfg: ConvertConfig, ds: Dataset) -> None:
    if cfg.partition is not None and cfg.partition not in ds.partitions:
        raise UserError(
            f"--partition {cfg.partition}: not in {cfg.src} "
            f"(partitions: {', '.join(ds.partitions) or 'none'})"
        )


def load_export_tokenizer(cfg: ConvertConfig) -> Any:
    """The --tokenizer that decodes prompt_text and completion_text on export, or None."""
    if cfg.tokenizer is None:
        return None
    from eagle3kit import _hf

    return _hf.load_tokenizer(cfg.tokenizer, cfg.trust_remote_code)


def export_jsonl(cfg: ConvertConfig) -> ConvertResult:
    ds = Dataset(cfg.src)
    _ui.warn_all(ds.warnings)
    check_partition(cfg, ds)
    tokenizer = load_export_tokenizer(cfg)
    to_stdout = str(cfg.dst) == "-"
    tmp = cfg.dst.with_name(cfg.dst.name + f".{os.getpid()}.tmp")
    n = 0
    try:
        out = sys.stdout.buffer if to_stdout else open(tmp, "wb")  # noqa: SIM115 (stdout stays open)
    except OSError as exc:
        raise export_error(cfg.dst, exc) from None
    try:
        for sample in ds.iter_samples(cfg.partition):
            record = sample_to_record(sample)
            if tokenizer is not None:
                record["prompt_text"] = tokenizer.decode(record["prompt_ids"])
                record["completion_text"] = tokenizer.decode(record["completion_ids"])
            out.write(orjson.dumps(record) + b"\n")
            n += 1
        out.flush()
        if not to_stdout:
            os.fsync(out.fileno())
            out.close()
            replace_durably(tmp, cfg.dst)
    except BaseException as exc:
        if not to_stdout:
            # close() flushes, which fails again on a full disk: the temp file must go anyway.
            with contextlib.suppress(OSError):
                out.close()
            tmp.unlink(missing_ok=True)
            # A full disk or an unwritable place is the user's to fix: one line, no traceback.
            if isinstance(exc, OSError):
                raise export_error(cfg.dst, exc) from None
        raise
    _ui.info(f"wrote {n:,} samples to {cfg.dst}", cfg.output)
    return ConvertResult("export", n, dst=str(cfg.dst))


# Import ------------------------------------------------------------------------------------
def _int_list(value: object, key: str) -> list[int]:
    if not isinstance(value, list) or not all(type(v) is int for v in value):
        raise ValueError(f"{key} must be a list of integers")
    if key != "loss_mask" and value and min(value) < 0:
        raise ValueError(f"{key} holds a negative token id ({min(value)})")
    return value


def _default(value: str | None, default: str) -> str:
    return default if value is None else value


def _refuse_controls(record: dict) -> None:
    """Names shown on a terminal later (info, validate) hold no control character: ESC and
    its kin would clear the screen or hide a line of the report there."""
    for key in ("sample_id", "finish_reason", "partition"):
        value = record.get(key)
        found = _text.control_in(value) if isinstance(value, str) else None
        if found is not None:
            raise ValueError(f"{key} holds a control character ({found})")


def record_to_sample(record: object) -> TokenSample:
    """A sample from one parsed JSONL record; ValueError names what is wrong."""
    if not isinstance(record, dict):
        raise ValueError("expected a JSON object")
    missing = [k for k in REQUIRED if k not in record]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}")
    unknown = set(record) - {*REQUIRED, *OPTIONAL, *TEXT_KEYS}
    if unknown:
        raise ValueError(f"unknown keys {', '.join(sorted(unknown))}")
    sample_id = record["sample_id"]
    if not isinstance(sample_id, str) or not sample_id or "\n" in sample_id:
        raise ValueError("sample_id must be a non-empty string without newlines")
    for key, kind in (
        ("finish_reason", str),
        ("partition", str),
        ("metadata", dict),
        ("source", dict),
        ("server", dict),
        ("counts", dict),
    ):
        if key in record and record[key] is not None and not isinstance(record[key], kind):
            raise ValueError(f"{key} must be a {'string' if kind is str else 'JSON object'}")
    _refuse_controls(record)
    latency = record.get("latency")
    if latency is not None and not isinstance(latency, int | float):
        raise ValueError("latency must be a number of seconds")
    mask = record.get("loss_mask")
    return TokenSample(
        sample_id=sample_id,
        prompt_ids=_int_list(record["prompt_ids"], "prompt_ids"),
        completion_ids=_int_list(record["completion_ids"], "completion_ids"),
        # Only a missing (or null) key takes the default: "" is a value the writer stores and
        # export writes, so `or` would turn it into another one and break the round trip.
        finish_reason=_default(record.get("finish_reason"), "stop"),
        partition=_default(record.get("partition"), "default"),
        loss_mask=None if mask is None else _int_list(mask, "loss_mask"),
        source=record.get("source"),
        server=record.get("server"),
        latency=latency,
        counts=record.get("counts"),
        metadata=record.get("metadata") or {},
    )


FIRST_COMMIT = 100
"""A run commits its first this many new samples at once (or --commit-every, if fewer): a
convert killed again and again, soon after each start, still gains that much every time."""


@dataclass
class SourceMark:
    """How far into the source file the committed samples reach: `nbytes` bytes, `line`
    lines, `samples` of them samples (the others malformed and skipped, or blank), and the
    xxh3-128 of those bytes. A rerun whose source starts with the same bytes begins there
    instead of parsing every committed line again; any other source is read from the top."""

    source: str
    nbytes: int = 0
    line: int = 0
    samples: int = 0
    bad_lines: int = 0
    xxh3: str = ""

    def to_json(self) -> dict:
        return {
            "source": self.source,
            "bytes": self.nbytes,
            "line": self.line,
            "samples": self.samples,
            "bad_lines": self.bad_lines,
            "xxh3": self.xxh3,
        }

    @classmethod
    def from_json(cls, source: str, saved: object) -> SourceMark | None:
        if not isinstance(saved, dict) or saved.get("source") != source:
            return None
        counts = [saved.get(k) for k in ("bytes", "line", "samples", "bad_lines")]
        if not all(type(v) is int and v >= 0 for v in counts) or not isinstance(
            saved.get("xxh3"), str
        ):
            return None
        return cls(
            source,
            saved["bytes"],
            saved["line"],
            saved["samples"],
            saved["bad_lines"],
            xxh3=saved["xxh3"],
        )


def _resume_point(f, saved: SourceMark | None, hasher) -> SourceMark | None:
    """Read the first `saved.nbytes` of `f` into `hasher`; `saved` when they are the bytes it
    was made from (`f` is then positioned after them), else None with `f` at the start."""
    if saved is None or saved.nbytes > os.fstat(f.fileno()).st_size:
        return None
    left = saved.nbytes
    while left:
        chunk = f.read(min(left, 1 << 24))
        if not chunk:
            break
        hasher.update(chunk)
        left -= len(chunk)
    if left == 0 and hasher.hexdigest() == saved.xxh3:
        return saved
    f.seek(0)
    hasher.reset()
    return None


def _count_lines(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 24), b""))


def import_jsonl(cfg: ConvertConfig) -> ConvertResult:
    import xxhash

    total = _count_lines(cfg.src)
    result = ConvertResult("import", 0, dst=str(cfg.dst))
    writer = DatasetWriter(
        cfg.dst,
        **cfg.write.writer_options(),
        # The file name, not its path: the same file moved or copied continues the import.
        config={"stage": "convert", "source": cfg.src.name},
        provenance={"source": str(cfg.src.resolve())},
    )
    _ui.warn_all(writer.warnings)
    first_commit = min(cfg.write.commit_every, FIRST_COMMIT)
    with writer, open(cfg.src, "rb") as f:
        hasher = xxhash.xxh3_128()
        start = _resume_point(
            f, SourceMark.from_json(cfg.src.name, writer.progress_at_open), hasher
        )
        mark = start or SourceMark(cfg.src.name)
        result.skipped_existing = mark.samples
        earlier_bad = mark.bad_lines
        with _ui.Progress(
            "convert", total, cfg.output, unit="lines", initial=mark.line
        ) as progress:
            for line in f:
                mark.line += 1
                mark.nbytes += len(line)
                hasher.update(line)
                if line.strip():
                    _import_line(cfg, line, mark, writer, result, progress)
                mark.xxh3 = hasher.hexdigest()
                writer.note_progress(mark.to_json())
                if result.written == first_commit and writer.pending == first_commit:
                    writer.commit(wait=False)
    report_import(cfg, result, writer, earlier_bad, "lines")
    return result


def report_import(
    cfg: ConvertConfig, result: ConvertResult, writer: DatasetWriter, earlier_bad: int, unit: str
) -> None:
    """The import's closing lines (JSONL and Parquet alike): what was skipped, and added."""
    if result.bad_lines or earlier_bad:
        earlier = f" ({earlier_bad:,} of them by an earlier run)" if earlier_bad else ""
        _ui.warn(f"{cfg.src}: skipped {result.bad_lines + earlier_bad:,} malformed {unit}{earlier}")
    _ui.info(
        f"{cfg.dst}: {result.written:,} samples added, {result.skipped_existing:,} already "
        f"there, {writer.committed_samples:,} in the dataset",
        cfg.output,
    )


def _import_line(
    cfg: ConvertConfig,
    line: bytes,
    mark: SourceMark,
    writer: DatasetWriter,
    result: ConvertResult,
    progress: _ui.Progress,
) -> None:
    try:
        # Without its newline: orjson counts lines within what it is given, and a "line 2"
        # of a one-line string would read as a second line of the file.
        sample = record_to_sample(orjson.loads(line.rstrip(b"\r\n")))
        added = writer.add(sample)
    except (ValueError, OverflowError, TypeError) as exc:
        if isinstance(exc, orjson.JSONDecodeError):
            exc = ValueError(f"invalid JSON ({exc.msg} at column {exc.colno})")
        if not cfg.skip_bad_lines:
            raise UserError(
                f"{cfg.src}:{mark.line}: {exc} (use --skip-bad-lines to skip such "
                "lines; samples before it are committed)"
            ) from None
        count_bad(mark, result, progress)
        return
    count_added(sample, added, mark, result, progress)


def count_bad(mark: SourceMark, result: ConvertResult, progress: _ui.Progress) -> None:
    """A malformed record skipped under --skip-bad-lines (JSONL line or Parquet row)."""
    result.bad_lines += 1
    mark.bad_lines += 1
    progress.add(1, errors=1)


def count_added(
    sample: TokenSample,
    added: bool,
    mark: SourceMark,
    result: ConvertResult,
    progress: _ui.Progress,
) -> None:
    """A record read: added, or already in the dataset."""
    mark.samples += 1
    if added:
        result.written += 1
    else:
        result.skipped_existing += 1
    progress.add(1, tokens=sample.num_tokens)

"""Durable file writes: temp file, fsync, rename, fsync the directory."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import orjson

from eagle3kit import _durable
from eagle3kit.format.errors import DatasetError
from eagle3kit.format.layout import TMP_SUFFIX


def tmp_path(path: Path) -> Path:
    """A temp name beside `path` that no other process picks and that readers know to skip."""
    return path.with_name(f"{path.name}.{os.getpid()}{TMP_SUFFIX}")


def disk_error(path: Path, exc: OSError) -> DatasetError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return DatasetError(
            f"{path}: no space left to write ({exc.strerror}). Everything committed before is "
            "intact: free some space and rerun the same command to continue."
        )
    return DatasetError(f"{path}: cannot write: {exc.strerror or exc}")


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """`_durable.write_bytes_atomic` under a temp name readers skip; a full disk becomes a
    DatasetError naming the file."""
    try:
        _durable.write_bytes_atomic(path, data, tmp_path(path))
    except OSError as exc:
        raise disk_error(path, exc) from None


def write_json_atomic(path: Path, obj: object) -> None:
    """Replace `path` with `obj` as JSON so that a crash leaves either the old or the new file."""
    write_bytes_atomic(path, _durable.json_bytes(obj))


def read_json(path: Path) -> dict:
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        raise DatasetError(f"{path}: missing") from None
    except orjson.JSONDecodeError as exc:
        raise DatasetError(f"{path}: not valid JSON ({exc}); the file is damaged") from None
    if not isinstance(data, dict):
        raise DatasetError(f"{path}: expected a JSON object")
    return data

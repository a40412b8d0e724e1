"""Durable file writes: temp file, fsync, rename, fsync the directory."""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import orjson

from eagle3kit._durable import fsync_dir
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


def open_new(path: Path) -> BinaryIO:
    """`path` opened for writing, never through a symbolic link planted at that name (which
    would write wherever it points)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o644)
    return os.fdopen(fd, "wb")


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so that a crash leaves either the old or the new file."""
    tmp = tmp_path(path)
    try:
        with open_new(tmp) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as exc:
        if not tmp.is_symlink():
            tmp.unlink(missing_ok=True)
        raise disk_error(path, exc) from None


def write_json_atomic(path: Path, obj: object) -> None:
    """Replace `path` with `obj` as JSON so that a crash leaves either the old or the new file."""
    write_bytes_atomic(path, orjson.dumps(
        obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))


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


@contextmanager
def file_lock(path: Path, exclusive: bool = True) -> Iterator[None]:
    """A blocking flock held for the duration of the block."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)

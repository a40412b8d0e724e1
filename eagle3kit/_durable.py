"""Crash-safe writes: a file written and renamed here survives a crash whole, or not at all.

The one set of durable-write helpers. The dataset format wraps them only to name its temp
files the way its readers skip and to turn a full disk into a DatasetError (`format/_io.py`);
the training run directory, checkpoints, exports, hidden-state conversions and the
quickstart's state use them directly. A whole directory (a training checkpoint, an export) is
published with `publish_dir`.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import orjson


def fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    """Make a rename or a new file in `path` durable (POSIX needs the directory synced)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_durably(tmp: Path, dst: Path) -> None:
    """Move the finished `tmp` over `dst`: a crash leaves the old `dst` or the new one."""
    fsync_file(tmp)
    os.replace(tmp, dst)
    fsync_dir(dst.parent)


def publish_dir(tmp: Path, final: Path) -> None:
    """Put the finished directory `tmp` in place of `final`: every file and folder in it is
    fsynced, a `final` already there is moved aside (hidden, `.NAME.tmp-old-PID`) and removed
    once the new one is in place, and the parent is fsynced. A crash leaves the old `final` or
    the new one whole (between the two renames, the old one under its hidden name)."""
    for path in sorted(tmp.rglob("*"), reverse=True):  # a folder after the files in it
        if path.is_dir():
            fsync_dir(path)
        else:
            fsync_file(path)
    fsync_dir(tmp)
    old = final.with_name(f".{final.name}.tmp-old-{os.getpid()}") if final.exists() else None
    if old is not None:
        os.rename(final, old)
    os.rename(tmp, final)
    fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def temp_beside(path: Path) -> Path:
    """A hidden temp name beside `path` that no other process picks."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def open_new(path: Path) -> BinaryIO:
    """`path` opened for writing, never through a symbolic link planted at that name (which
    would write wherever it points)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    return os.fdopen(fd, "wb")


def write_atomic(path: Path, write: Callable[[Path], Any], tmp: Path | None = None) -> None:
    """`write(tmp)` then `replace_durably(tmp, path)`: a file under its final name is complete.
    On any failure the temp file goes (unless it is a link someone planted: not ours)."""
    tmp = tmp or temp_beside(path)
    try:
        write(tmp)
        replace_durably(tmp, path)
    except BaseException:
        if not tmp.is_symlink():
            tmp.unlink(missing_ok=True)
        raise


def write_bytes_atomic(path: Path, data: bytes, tmp: Path | None = None) -> None:
    """Replace `path` with `data` (see `write_atomic`)."""

    def write(to: Path) -> None:
        with open_new(to) as f:
            f.write(data)

    write_atomic(path, write, tmp)


def write_text_atomic(path: Path, text: str, tmp: Path | None = None) -> None:
    """Replace `path` with `text`, UTF-8 (see `write_atomic`)."""
    write_bytes_atomic(path, text.encode(), tmp)


def json_bytes(obj: object) -> bytes:
    """`obj` as indented JSON ending in a newline; numpy values as numbers, anything else
    orjson does not know (paths) as its str."""
    return orjson.dumps(
        obj,
        default=str,
        option=orjson.OPT_INDENT_2
        | orjson.OPT_SERIALIZE_NUMPY
        | orjson.OPT_NON_STR_KEYS
        | orjson.OPT_APPEND_NEWLINE,
    )


def write_json_atomic(path: Path, obj: object, tmp: Path | None = None) -> None:
    """Replace `path` with `obj` as JSON (see `write_atomic`)."""
    write_bytes_atomic(path, json_bytes(obj), tmp)


# Small files a copied directory holds ---------------------------------------------------------
# A run, a dataset or a quickstart directory may come from another machine: where eagle3kit
# keeps a file of its own (an owner or lock file, run.json) something else may stand, a link
# to /dev/zero, a FIFO that blocks any open, a directory. These look before they open.

_READ_ONLY = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def kind_of(mode: int) -> str:
    """What `mode` (an lstat's st_mode) is, in words, for a refusal."""
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def odd_file(path: Path) -> str | None:
    """What stands at `path` when it is there and not a regular file itself ("a symbolic
    link", "a FIFO", ...), from its lstat: nothing is opened, so nothing can block."""
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    return None if stat.S_ISREG(mode) else kind_of(mode)


def read_small(path: Path, limit: int) -> bytes:
    """At most `limit` bytes of the regular file `path`, opened without following a link and
    without blocking (OSError for a link, ValueError naming what else stands there)."""
    fd = os.open(path, _READ_ONLY)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ValueError(kind_of(mode))
        chunks, left = [], limit
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)

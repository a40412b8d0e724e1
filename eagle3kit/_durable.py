"""fsync helpers: a file written and renamed here survives a crash whole, or not at all.

The dataset format has its own writers on top of these (`format/_io.py`, which also turns
a full disk into a DatasetError); the training run directory, checkpoints, exports and the
quickstart's state use them directly.
"""

from __future__ import annotations

import os
from pathlib import Path


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


def write_text_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` through a temp file beside it (see `replace_durably`)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    replace_durably(tmp, path)

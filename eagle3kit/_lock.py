"""One run owns a directory: every process of the run holds a shared flock on a lock file.

The kernel drops an flock when its process dies, SIGKILL included, so a crashed run never
leaves a stale lock. An owner file names the run, so that processes of the same run (torchrun
ranks) join while any other run is refused with a message naming the holder. The dataset
format (`format/lock.py`), the training run directory and export's OUT use this one mechanism.

The lock and owner files sit in a directory that may have been copied from elsewhere: each is
looked at (lstat) before it is opened, a link, FIFO, device or directory in its place is
refused by name, opens never follow a link (so no file is created where a dangling link
points) and the owner file is read only up to OWNER_MAX_BYTES.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import stat
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from eagle3kit import _durable
from eagle3kit._argv import command_line
from eagle3kit.errors import UserError


def new_run_id() -> str:
    """An id for this run: EAGLE3KIT_RUN_ID when the launcher shares one across ranks."""
    return os.environ.get("EAGLE3KIT_RUN_ID") or uuid.uuid4().hex


OWNER_MAX_BYTES = 16 << 10
"""The most of an owner file read: eagle3kit writes a few hundred bytes (COMMAND_MAX_CHARS
of the command line at most); a longer one is read as damaged (an unknown owner)."""
COMMAND_MAX_CHARS = 4096
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def open_lock_file(path: Path, error: type[UserError] = UserError) -> int:
    """`path` opened (created when missing) for an flock: refused by name, unopened, when
    something other than a regular file stands there; never through a link."""
    odd = _durable.odd_file(path)
    if odd is None:
        try:
            fd = os.open(path, _LOCK_FLAGS, 0o644)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise  # a read-only disk, no permission: the caller says what it means
            odd = "a symbolic link"  # planted between the look and the open
        else:
            mode = os.fstat(fd).st_mode
            if stat.S_ISREG(mode):
                return fd
            os.close(fd)
            odd = _durable.kind_of(mode)
    raise error(
        f"{path}: {odd} where eagle3kit keeps a lock file of its own; refused (remove "
        "it: eagle3kit makes it again)"
    )


@contextmanager
def file_lock(
    path: Path, exclusive: bool = True, error: type[UserError] = UserError
) -> Iterator[None]:
    """A blocking flock held for the duration of the block."""
    fd = open_lock_file(path, error)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


def _write_owner(path: Path, owner: dict) -> None:
    _durable.write_bytes_atomic(path, _durable.json_bytes(owner))


@dataclass(frozen=True)
class Owned:
    """A place one run owns and the files that say so."""

    path: Path
    """What the refusal names (the dataset, the run directory, export's OUT)."""
    kind: str
    """What it is, for the refusal: "a dataset", "a run directory"."""
    lock: Path
    """Held (flock, shared) by every process of the run."""
    gate: Path
    """Serializes taking the lock, so a run's first process sets up before others join."""
    owner: Path
    """Names the run holding the lock."""
    error: type[UserError] = UserError
    write_owner: Callable[[Path, dict], None] = field(default=_write_owner)


@dataclass
class RunLock:
    """The lock held by one process; `first` says it found no live process of any run."""

    fd: int
    run_id: str
    first: bool
    same_run_before: bool
    """The owner file already named this run (a rank joining late, after the others left)."""

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _read_owner(path: Path, error: type[UserError] = UserError) -> dict:
    """The owner file's record; {} when missing or damaged (an unknown owner). Anything but a
    regular file there is refused by name, unopened."""
    odd = _durable.odd_file(path)
    if odd is None:
        try:
            data = _durable.read_small(path, OWNER_MAX_BYTES + 1)
        except FileNotFoundError:
            return {}
        except ValueError as exc:  # became a FIFO or a directory between the look and the open
            odd = str(exc)
        except OSError as exc:
            odd = "a symbolic link" if exc.errno == errno.ELOOP else None
            if odd is None:
                return {}
        else:
            if len(data) > OWNER_MAX_BYTES:
                return {}
            try:
                owner = orjson.loads(data)
            except orjson.JSONDecodeError:
                return {}
            return owner if isinstance(owner, dict) else {}
    raise error(
        f"{path}: {odd} where eagle3kit keeps the file naming a directory's owner; "
        "refused (remove it: eagle3kit makes it again)"
    )


def describe(owner: dict) -> str:
    """The run an owner file names: its id, pid, host, start and command line."""
    started = owner.get("started")
    when = "?"
    if isinstance(started, int | float) and not isinstance(started, bool):
        with suppress(ValueError, OverflowError, OSError):  # nan, 1e308: a damaged file
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started))
    return (
        f"run {owner.get('run_id', '?')} (pid {owner.get('pid', '?')} on "
        f"{owner.get('host', '?')}, started {when}: {owner.get('command', '?')})"
    )


def acquire(
    place: Owned, run_id: str, setup: Callable[[bool], None] = lambda same_run: None
) -> RunLock:
    """Join or start the run owning `place`; refuse when another run holds it.

    `setup(same_run_before)` runs inside the gate in a process that found no live holder, so
    it may clean up, wipe or create what the run owns before any other process of it joins.
    """
    fd = open_lock_file(place.lock, place.error)
    try:
        with file_lock(place.gate, error=place.error):
            owner = _read_owner(place.owner, place.error)
            same_run = owner.get("run_id") == run_id
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                first = True
            except BlockingIOError:
                first = False
                if not same_run:
                    raise place.error(
                        f"{place.path} is in use by {describe(owner)}. Wait for it to finish "
                        f"or stop it; one run owns {place.kind} at a time."
                    ) from None
            if first and not same_run:
                place.write_owner(
                    place.owner,
                    {
                        "run_id": run_id,
                        "pid": os.getpid(),
                        "host": socket.gethostname(),
                        "started": time.time(),
                        "command": command_line()[:COMMAND_MAX_CHARS],
                    },
                )
            if first:
                setup(same_run)
            # Every process holds the lock shared; set-up happens inside the gate, so no
            # other run can slip in while it is briefly released.
            fcntl.flock(fd, fcntl.LOCK_SH)
    except BaseException:
        os.close(fd)
        raise
    return RunLock(fd, run_id, first, same_run)

"""One run owns a directory: every process of the run holds a shared flock on a lock file.

The kernel drops an flock when its process dies, SIGKILL included, so a crashed run never
leaves a stale lock. An owner file names the run, so that processes of the same run (torchrun
ranks) join while any other run is refused with a message naming the holder. The dataset
format (`format/lock.py`), the training run directory and export's OUT use this one mechanism.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from eagle3kit import _durable
from eagle3kit._argv import command_line
from eagle3kit.errors import UserError


def new_run_id() -> str:
    """An id for this run: EAGLE3KIT_RUN_ID when the launcher shares one across ranks."""
    return os.environ.get("EAGLE3KIT_RUN_ID") or uuid.uuid4().hex


@contextmanager
def file_lock(path: Path, exclusive: bool = True) -> Iterator[None]:
    """A blocking flock held for the duration of the block."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
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


def _read_owner(path: Path) -> dict:
    try:
        owner = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return owner if isinstance(owner, dict) else {}


def describe(owner: dict) -> str:
    """The run an owner file names: its id, pid, host, start and command line."""
    started = owner.get("started")
    when = (time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started))
            if isinstance(started, int | float) else "?")
    return (f"run {owner.get('run_id', '?')} (pid {owner.get('pid', '?')} on "
            f"{owner.get('host', '?')}, started {when}: {owner.get('command', '?')})")


def acquire(place: Owned, run_id: str,
            setup: Callable[[bool], None] = lambda same_run: None) -> RunLock:
    """Join or start the run owning `place`; refuse when another run holds it.

    `setup(same_run_before)` runs inside the gate in a process that found no live holder, so
    it may clean up, wipe or create what the run owns before any other process of it joins.
    """
    fd = os.open(place.lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with file_lock(place.gate):
            owner = _read_owner(place.owner)
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
                place.write_owner(place.owner, {
                    "run_id": run_id, "pid": os.getpid(), "host": socket.gethostname(),
                    "started": time.time(), "command": command_line(),
                })
            if first:
                setup(same_run)
            # Every process holds the lock shared; set-up happens inside the gate, so no
            # other run can slip in while it is briefly released.
            fcntl.flock(fd, fcntl.LOCK_SH)
    except BaseException:
        os.close(fd)
        raise
    return RunLock(fd, run_id, first, same_run)

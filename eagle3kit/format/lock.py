"""One run owns a dataset: every process of the run holds a shared flock on `.run.lock`.

The kernel drops an flock when its process dies, SIGKILL included, so a crashed run never
leaves a stale lock. `.owner.json` names the run, so that processes of the same run (torchrun
ranks) join while any other run is refused with a message naming the holder.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson

from eagle3kit._argv import command_line
from eagle3kit.format._io import file_lock, write_json_atomic
from eagle3kit.format.errors import DatasetError
from eagle3kit.format.layout import GATE_LOCK, OWNER, RUN_LOCK


def new_run_id() -> str:
    """An id for this run: EAGLE3KIT_RUN_ID when the launcher shares one across ranks."""
    return os.environ.get("EAGLE3KIT_RUN_ID") or uuid.uuid4().hex


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
        return orjson.loads(path.read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return {}


def _describe(owner: dict) -> str:
    started = owner.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if started else "?"
    return (f"run {owner.get('run_id', '?')} (pid {owner.get('pid', '?')} on "
            f"{owner.get('host', '?')}, started {when}: {owner.get('command', '?')})")


def acquire(directory: Path, run_id: str, setup: Callable[[bool], None]) -> RunLock:
    """Join or start the run owning `directory`; refuse when another run holds it.

    `setup(same_run_before)` runs inside the gate in a process that found no live writer, so
    it may clean up, wipe or create the dataset before any other process of the run joins.
    """
    fd = os.open(directory / RUN_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        with file_lock(directory / GATE_LOCK):
            owner = _read_owner(directory / OWNER)
            same_run = owner.get("run_id") == run_id
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                first = True
            except BlockingIOError:
                first = False
                if not same_run:
                    raise DatasetError(
                        f"{directory} is in use by {_describe(owner)}. Wait for it to finish "
                        "or stop it; one run owns a dataset at a time."
                    ) from None
            if first and not same_run:
                write_json_atomic(directory / OWNER, {
                    "run_id": run_id, "pid": os.getpid(), "host": socket.gethostname(),
                    "started": time.time(), "command": command_line(),
                })
            if first:
                setup(same_run)
            # Every process holds the lock shared; conversion happens inside the gate, so no
            # other run can slip in while it is briefly released.
            fcntl.flock(fd, fcntl.LOCK_SH)
    except BaseException:
        os.close(fd)
        raise
    return RunLock(fd, run_id, first, same_run)

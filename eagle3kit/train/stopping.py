"""When a training run stops early: signals, and the checkpoint clock.

SIGTERM (schedulers, `kill`), SIGINT (Ctrl-C) and SIGUSR1 (what SLURM sends ahead of a
time limit with `--signal=USR1@SECONDS`) ask the run to stop: the current step finishes, a
checkpoint is written, the command that continues is printed, and the process exits 143
(SIGTERM, SIGUSR1) or 130 (SIGINT). SIGUSR1 exits as SIGTERM does: both mean "the
scheduler is taking the machine", and a job script can test for one status.

A second signal more than `DUPLICATE_S` after the first aborts at once (the signal's
default action: the checkpoint being written is left unfinished, the previous one stays).
One sooner is taken for the same request arriving twice: a scheduler signals the launcher
and the workers alike, and torchrun forwards what it got to its workers.
"""

from __future__ import annotations

import os
import signal
import time
from types import FrameType
from typing import Any

from eagle3kit._signals import DUPLICATE_S, STOP_SIGNALS, install, restore


class StopRequests:
    """Catches the stop signals while training (a context manager; main thread only)."""

    def __init__(self, on_first: Any = None) -> None:
        self.received: signal.Signals | None = None
        self.at = 0.0
        self.on_first = on_first
        self._before: dict[int, Any] = {}

    def __enter__(self) -> StopRequests:
        self._before = install(STOP_SIGNALS, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        restore(self._before)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        if self.received is None:
            self.received, self.at = sig, time.monotonic()
            if self.on_first is not None:
                self.on_first(sig)
            return
        if time.monotonic() - self.at < DUPLICATE_S:
            return
        # Abort: the signal's own default action (termination with its status).
        for s in STOP_SIGNALS:
            signal.signal(s, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


class CheckpointClock:
    """Whether --checkpoint-interval minutes have passed since the last checkpoint."""

    def __init__(self, minutes: float) -> None:
        self.seconds = minutes * 60
        self.last = time.monotonic()

    def due(self) -> bool:
        return self.seconds > 0 and time.monotonic() - self.last >= self.seconds

    def reset(self) -> None:
        self.last = time.monotonic()

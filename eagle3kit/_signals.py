"""Stop signals: what each one means, its exit status, and the line that says how to continue.

SIGTERM (schedulers, `kill`), SIGINT (Ctrl-C) and SIGUSR1 (what SLURM sends ahead of a time
limit with `--signal=USR1@SECONDS`) all ask a run to stop. A run exits 130 after SIGINT and
143 after SIGTERM or SIGUSR1 (both mean "the scheduler is taking the machine", so a job script
tests for one status). gen and train stop between requests or steps on their own
(`train/stopping.py`, the gen scheduler); every other stage stops where Ctrl-C stops it:
`StopAsInterrupt` raises `Stopped`, a KeyboardInterrupt, for SIGTERM and SIGUSR1 too, so the
cleanup Ctrl-C runs (a writer commits the samples it holds, a server's files already read are
deleted) runs for a scheduler's signal as well, where the signal's default action would end
the process at once with nothing committed and no word.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
EXIT_CODES = {signal.SIGTERM: 143, signal.SIGINT: 130, signal.SIGUSR1: 143}
DUPLICATE_S = 1.0
"""A second signal sooner than this after the first is the same request arriving twice (a
scheduler signals the launcher and the workers alike, and torchrun forwards what it got)."""


class Stopped(KeyboardInterrupt):
    """A stop signal other than Ctrl-C, raised where Ctrl-C raises KeyboardInterrupt."""

    def __init__(self, sig: signal.Signals) -> None:
        super().__init__(sig.name)
        self.signal = sig


def stop_signal(exc: KeyboardInterrupt) -> signal.Signals:
    """The signal behind an interrupt (SIGINT for a plain KeyboardInterrupt)."""
    return exc.signal if isinstance(exc, Stopped) else signal.SIGINT


def continue_command(argv: list[str] | None = None) -> str:
    """The command line that continues this run: this one without --overwrite."""
    from eagle3kit._argv import command_line

    return command_line([a for a in (sys.argv if argv is None else argv) if a != "--overwrite"])


def stopped_line(exc: KeyboardInterrupt) -> str:
    """The one line a run stopped by a signal ends with."""
    return (
        f"stopped by {stop_signal(exc).name}; what was committed is safe. Continue with: "
        f"{continue_command()}"
    )


def install(signals: tuple[signal.Signals, ...], handler: Any) -> dict[int, Any]:
    """Handle `signals` with `handler` (only the main thread may); the handlers they had."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, handler) for sig in signals}


def restore(before: dict[int, Any]) -> None:
    """Put back the handlers `install` replaced."""
    for sig, handler in before.items():
        signal.signal(sig, handler)


class StopAsInterrupt:
    """While active (main thread only), SIGTERM and SIGUSR1 raise `Stopped` as SIGINT raises
    KeyboardInterrupt. A repeat within DUPLICATE_S is ignored, so the cleanup it started is
    not cut short; a later one aborts with the signal's default action."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self) -> None:
        self.at: float | None = None
        self._before: dict[int, Any] = {}

    def __enter__(self) -> StopAsInterrupt:
        self._before = install(self.SIGNALS, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        restore(self._before)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        if self.at is None:
            self.at = time.monotonic()
            raise Stopped(sig)
        if time.monotonic() - self.at < DUPLICATE_S:
            return
        for s in self.SIGNALS:
            signal.signal(s, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def interrupt(exit_code: int) -> KeyboardInterrupt:
    """The interrupt to raise for a stage that stopped on its own with `exit_code` (gen's or
    train's 130 / 143), so a caller that chains stages ends as the CLI ends a stopped run."""
    return (
        Stopped(signal.SIGTERM)
        if exit_code == EXIT_CODES[signal.SIGTERM]
        else (KeyboardInterrupt())
    )

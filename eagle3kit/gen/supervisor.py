"""Every task of a gen run is watched, and the first failure ends the run.

An exception in any task (a commit that failed, an answer that could not be stored, a bug)
ends the run at once with that error, instead of leaving the others waiting on work that
will never come. `final_error` turns that failure into the one line the user sees.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from eagle3kit._signals import continue_command
from eagle3kit.errors import UserError
from eagle3kit.format import DatasetError


class WriteFailed(DatasetError):
    """Writing the dataset failed (a full disk, an I/O error): exit status 1."""

    exit_code = 1


class UnusableAnswer(UserError):
    """An answer that passed the checks but could not be stored: exit status 2."""


class WorkerFailed(UserError):
    """An unexpected error inside a worker (a bug): exit status 1."""

    exit_code = 1


def final_error(exc: BaseException) -> UserError:
    """The failure that ended a run as the one error to show, with the command that continues."""
    again = f" Continue with: {continue_command()}"
    if isinstance(exc, UserError):
        exc.args = (f"{str(exc).rstrip(' .')}.{again}",)
        return exc
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        return WriteFailed(
            f"{where}cannot write: {exc.strerror or exc}. Everything committed "
            f"before is intact.{again}"
        )
    return WorkerFailed(
        f"gen stopped by an unexpected error ({type(exc).__name__}: {exc}); "
        f"everything committed before is intact. Please report it.{again}"
    )


class Supervisor:
    """The run's tasks, whether it is stopping, and the failure that ended it."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task] = set()
        self.stopping = False
        self.failure: BaseException | None = None
        self.finished = asyncio.Event()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """Start a task whose failure ends the run (a dead task would leave the run hanging)."""
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        self._note_failure(task)

    def _note_failure(self, task: asyncio.Task) -> None:
        exc = None if task.cancelled() else task.exception()
        if isinstance(exc, DatasetError) and not isinstance(exc, WriteFailed):
            # Inside a run the dataset is only written, and a commit is what failed
            # (add() commits when one is due, and a commit's error surfaces on the next).
            exc = WriteFailed(str(exc))
        if exc is not None:
            self.fail(exc)

    def fail(self, exc: BaseException) -> None:
        self.failure = self.failure or exc
        self.stopping = True
        self.finished.set()

    async def cancel_all(self) -> None:
        """Cancel every task and wait for them; a failure whose callback had not run yet
        still counts."""
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for task in tasks:
            self._note_failure(task)

"""Retries and backoff: a failed request is tried again for up to --retry-for.

A server that went away is no fault of the prompt: the request goes back to the queue
without spending an attempt while the watch pauses the server. A request that runs out of
attempts (or of --retry-for) is recorded as skipped:failed.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import cast

import eagle3kit.gen.servers as servers
from eagle3kit import _ui
from eagle3kit.gen.backends import Backend
from eagle3kit.gen.config import GenConfig
from eagle3kit.gen.jobs import Job
from eagle3kit.gen.record import Recorder, strict_error
from eagle3kit.gen.supervisor import Supervisor
from eagle3kit.gen.watch import ServerWatch

BACKOFF_MAX = 60.0
RESTART_REASONS = frozenset({"refused", "connect", "reset", "model_changed"})
"""Failures after which a server is probed again before it gets more work."""


def backoff(attempts: int) -> float:
    """Seconds to wait before attempt `attempts + 1`: doubling, capped, jittered."""
    return min(BACKOFF_MAX, 0.25 * 2**attempts) * random.uniform(0.5, 1.5)


class Retries:
    """What happens to a request that failed or got an answer that cannot be stored."""

    def __init__(
        self,
        cfg: GenConfig,
        progress: _ui.Progress,
        stats: dict[str, int],
        watch: ServerWatch,
        recorder: Recorder,
        supervisor: Supervisor,
        resolve: Callable[[], None],
    ) -> None:
        """`resolve`: called when a job is done with (given up)."""
        self.cfg, self.progress, self.stats = cfg, progress, stats
        self.watch, self.recorder, self.supervisor = watch, recorder, supervisor
        self.resolve = resolve

    def bad_answer(self, backend: Backend, job: Job, exc: servers.BadAnswer) -> None:
        """An answer whose ids cannot be stored: a violation, never data."""
        self.stats["violations"] += 1
        self.progress.add(0, violations=1, rows=(f"server:{backend.name}",))
        job.violations = exc.violations
        if self.cfg.strict:
            self.supervisor.fail(strict_error(backend.name, job, exc.violations))

    async def retry(
        self, backend: Backend, job: Job, queue: asyncio.Queue, exc: servers.RetryableError
    ) -> None:
        self.stats["retries"] += 1
        self.progress.add(0, retries=1, rows=(f"server:{backend.name}",))
        if backend.name in self.watch.down or not await backend.healthy():
            # The server went away: not this prompt's fault, so no attempt is spent on it.
            # (Paused only to be probed again, it is up: the attempt counts.)
            self.watch.suspect(backend, down=True)
            queue.put_nowait(job)
            return
        if exc.reason in RESTART_REASONS:  # it may have restarted in between: probe it again
            self.watch.suspect(backend, down=False)
        job.attempts += 1
        job.last_error = str(exc)
        if self._spent(job):
            self._give_up(backend, job)
            return
        delay = backoff(job.attempts)
        job.retry_spent += delay
        asyncio.get_running_loop().call_later(delay, queue.put_nowait, job)

    def _spent(self, job: Job) -> bool:
        cfg = self.cfg
        return (
            cfg.max_attempts is not None and job.attempts >= cfg.max_attempts
        ) or job.retry_spent >= cast(float, cfg.retry_for)  # GenConfig parsed it to seconds

    def _give_up(self, backend: Backend, job: Job) -> None:
        self.stats["failed"] += 1
        self.progress.add(
            0, errors=1, rows=(f"partition:{job.chain.conv.partition}", f"server:{backend.name}")
        )
        extra: dict = {"retried_s": round(job.retry_spent, 1)}
        if job.violations:
            extra["violations"] = job.violations
        self.recorder.skip(
            job.chain,
            job.turn,
            job.request.prompt_ids,
            "skipped:failed",
            f"{job.attempts} attempts, last error: {job.last_error}",
            extra,
        )
        self.resolve()

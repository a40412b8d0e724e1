"""Requests in flight, and the warning for one with no answer for --stall-after (with no
--request-timeout nothing else would ever show it)."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import cast

from eagle3kit import _text, _ui
from eagle3kit.gen.config import GenConfig


@dataclass
class Running:
    """A request in flight, for the stall warning."""

    backend: str
    sample_id: str
    since: float
    warned: bool = False


class Stalls:
    """The requests in flight, each since when."""

    def __init__(self, cfg: GenConfig, progress: _ui.Progress) -> None:
        self.cfg, self.progress = cfg, progress
        self.running: dict[int, Running] = {}
        self._numbers = itertools.count()

    def start(self, backend: str, sample_id: str) -> int:
        """Note a request sent; the number `done` takes when it ends."""
        number = next(self._numbers)
        self.running[number] = Running(backend, sample_id, time.monotonic())
        return number

    def done(self, number: int) -> None:
        self.running.pop(number, None)

    def warn(self) -> None:
        """A request with no answer for --stall-after: warn once for it, count it in the
        status line."""
        # (cast: GenConfig parsed --stall-after to seconds)
        now, limit = time.monotonic(), cast(float, self.cfg.stall_after)
        stalled = [r for r in self.running.values() if now - r.since >= limit]
        self.progress.set(stalled=len(stalled))
        fresh: dict[str, list[Running]] = {}
        for r in stalled:
            if not r.warned:
                r.warned = True
                fresh.setdefault(r.backend, []).append(r)
        timeout = self.cfg.request_timeout
        then = (
            f"they are given up and retried after --request-timeout {timeout:g}s"
            if timeout
            else "gen waits for them (no --request-timeout is set)"
        )
        for server, found in fresh.items():
            oldest = max(now - r.since for r in found)
            _ui.warn(
                f"{server}: {len(found)} request(s) with no answer for over "
                f"{_text.duration(limit)} (the oldest for {_text.duration(oldest)}, sample "
                f"{found[0].sample_id}); {then}. Check the server"
            )

"""The server watch: servers that go away, restart or change what they serve.

A server that went away has its slots paused while /health is polled. A server that went
away, dropped a connection, or sat idle is probed again before it gets more work: one that
now serves another model (or tokenizes differently) stays paused, and when no server is left
the run ends. A server that is up is asked again every IDENTITY_CHECK_S.
"""

from __future__ import annotations

import asyncio
import time

import eagle3kit.gen.servers as servers
from eagle3kit import _ui
from eagle3kit.errors import UserError
from eagle3kit.gen.backends import Backend, HttpBackend
from eagle3kit.gen.config import GenConfig
from eagle3kit.gen.supervisor import Supervisor

HEALTH_POLL_MAX = 10.0
IDENTITY_CHECK_S = 30.0
"""How often a server that is up is asked again which model it serves."""
IDLE_REPROBE_S = 0.5
"""A server with nothing in flight and no exchange for this long is probed before the next
request: a restart that failed no request (none was in flight) leaves exactly such a gap,
and the next answer could otherwise come from whatever model it came back with."""


class ServerWatch:
    """Which servers may take work, and the probes that decide it."""

    def __init__(
        self,
        cfg: GenConfig,
        backends: list[Backend],
        supervisor: Supervisor,
        stats: dict[str, int],
        probe_ids: list[int] | None,
    ) -> None:
        """`probe_ids`: --tokenizer's ids for PROBE_TEXT, to check a restarted server's
        tokenizer against (None: --no-tokenizer-check)."""
        self.cfg, self.backends, self.supervisor = cfg, backends, supervisor
        self.stats, self.probe_ids = stats, probe_ids
        self.up = {b.name: asyncio.Event() for b in backends}
        for event in self.up.values():
            event.set()
        self.down: set[str] = set()
        """Servers paused because they stopped answering."""
        self.wrong: dict[str, str] = {}
        """Servers paused because they now serve something else, with what is wrong."""
        self.watching: set[str] = set()
        self.fatal_after_probe: dict[str, servers.ServerFatal] = {}
        self.answered = {b.name: 0 for b in backends}
        self.last_exchange = {b.name: time.monotonic() for b in backends}
        self.confirming = {b.name: asyncio.Lock() for b in backends}
        self.in_flight_by = {b.name: 0 for b in backends}

    def _idle(self, backend: Backend) -> bool:
        return (
            self.in_flight_by[backend.name] == 0
            and isinstance(backend, HttpBackend)
            and time.monotonic() - self.last_exchange[backend.name] > IDLE_REPROBE_S
        )

    async def still_same(self, backend: Backend) -> bool:
        """Before a request to a server that has been idle: is it still the one the run
        started with? False (and the server paused) when it is not, or not ready."""
        if not self._idle(backend):
            return True
        async with self.confirming[backend.name]:
            if not self._idle(backend):  # another slot just checked it
                return self.up[backend.name].is_set()
            problem = await self._changed(backend)
            self.last_exchange[backend.name] = time.monotonic()
        if problem is None:
            return True
        self.suspect(backend, down=False)
        return False

    def suspect(self, backend: Backend, *, down: bool) -> None:
        """Pause `backend` until it answers /health and the probe finds it unchanged."""
        event = self.up[backend.name]
        if event.is_set():
            event.clear()
            self.stats["paused"] += 1
        if down and backend.name not in self.down:
            self.down.add(backend.name)
            _ui.warn(f"{backend.name}: not answering; its slots pause while /health is polled")
        if backend.name not in self.watching:
            self.watching.add(backend.name)
            self.supervisor.spawn(self._watch(backend))

    async def _watch(self, backend: Backend) -> None:
        name = backend.name
        delay = 0.5
        try:
            while not self.supervisor.stopping:
                if await backend.healthy():
                    problem = await self._changed(backend)
                    if problem is None:
                        self._resume(backend)
                        return
                    if problem:
                        self._wrong(backend, problem)
                await asyncio.sleep(delay)
                delay = min(HEALTH_POLL_MAX, delay * 1.5)
        finally:
            self.watching.discard(name)

    async def _changed(self, backend: Backend) -> str | None:
        """What differs in a server since the run started: None when nothing does, "" when
        it cannot be told yet (the probe failed: still starting up)."""
        if not isinstance(backend, HttpBackend):
            return None
        self.stats["reprobes"] += 1
        was = backend.info
        try:
            now = await backend.identity()
            if now.model != was.model:
                return (
                    f"now serves {now.model!r}, not {was.model!r} (the model this run started with)"
                )
            if now.api != was.api:
                return f"now answers as {now.api}, not {was.api}"
            if self.probe_ids is not None:
                return await backend.tokenizer_disagreement(self.probe_ids)
        except (UserError, servers.ServerError):
            return ""
        return None

    def _resume(self, backend: Backend) -> None:
        name = backend.name
        fatal = self.fatal_after_probe.pop(name, None)
        if fatal is not None:
            self.supervisor.fail(UserError(str(fatal)))
            return
        if name in self.wrong:
            del self.wrong[name]
            assert isinstance(backend, HttpBackend)  # only a server's identity can change
            _ui.warn(f"{name}: serves {backend.info.model!r} again; resuming")
        elif name in self.down:
            _ui.info(f"{name}: back; resuming", self.cfg.output)
        self.down.discard(name)
        self.up[name].set()

    def _wrong(self, backend: Backend, problem: str) -> None:
        name = backend.name
        self.fatal_after_probe.pop(name, None)
        if self.wrong.get(name) != problem:
            self.wrong[name] = problem
            _ui.warn(
                f"{name}: {problem}; its slots stay paused (it is checked again every "
                f"{HEALTH_POLL_MAX:g}s) and nothing more of it is stored"
            )
        if len(self.wrong) == len(self.backends):
            names = "; ".join(f"{n}: {p}" for n, p in self.wrong.items())
            self.supervisor.fail(
                UserError(
                    f"no server left that serves this run's model ({names}). Restart them with "
                    "the model the dataset was started with, or give other --server URLs"
                )
            )

    async def check_identities(self, backend: Backend) -> None:
        """Every IDENTITY_CHECK_S, ask a server that is up which model it serves: a restart
        quick enough to fail no request is found this way."""
        while not self.supervisor.stopping:
            await asyncio.sleep(IDENTITY_CHECK_S)
            if self.up[backend.name].is_set() and await self._changed(backend):
                self.suspect(backend, down=False)

"""`train --online --server`: the target's states fetched from vLLM servers ahead of the step.

Each server runs the `extract_hidden_states` method (SERVER_APIS.md §7); the requests, the
file protocol, the checks and the refusals are extract's (eagle3kit.extract.vllm.VllmEngine),
one engine per server. This module only schedules them:

- The training order is the plan's (a pure function of the data and the seed), so the
  samples this rank will consume are known in advance: `order` yields them, and workers
  fetch them in that order while the trainer takes them in that order (`take`).
- A window of `depth` samples bounds what is fetched but not yet consumed: a worker takes
  the next sample only while fewer than `depth` are held. States are held as bf16, what
  extract stores, so training here sees the same numbers as training on extract's output.
- Every server gets `slots` worker threads pulling from one shared order, so a faster
  server takes more of the work (as gen balances its servers). A server that stops
  answering (connection errors or 5xx on every attempt) is paused: its sample goes back to
  the front for any server, its workers wait while /health is polled, and it resumes once
  it answers and still serves the same model with prefix caching off. With every server
  paused, the trainer waits: the run pauses, it does not fail.
- Anything else a server does wrong (wrong layer count, other token ids, a 4xx answer, a
  file that never appears) is the run's error, raised in the trainer within a second.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from eagle3kit import _text, _ui
from eagle3kit.errors import UserError
from eagle3kit.train.config import TrainConfig

HEALTH_POLL_MAX = 10.0
"""Longest wait between two /health polls of a paused server (as gen)."""
BAD_FILE_RETRIES = 2
"""Unreadable files tolerated per sample (a server killed mid-write) before it is an error."""
WAIT_TICK_S = 0.5
"""How often a waiting trainer wakes to redraw the progress and look for stop requests."""


@dataclass
class Job:
    key: int
    """Position in the training order, or a negative number for a held-out sample."""
    ids: np.ndarray
    bad_files: int = 0


@dataclass
class Slot:
    """One server and its state."""

    engine: Any
    up: bool = True
    samples: int = 0
    tokens: int = 0


@dataclass
class Stats:
    """Server side and trainer side, for the progress display and the result."""

    fetched: int = 0
    fetched_tokens: int = 0
    nonfinite: int = 0
    pauses: int = 0
    waited_s: float = 0.0
    """Trainer time spent waiting for a sample that was not fetched yet."""
    held_bytes: int = 0
    peak_bytes: int = 0
    bound_bytes: int = 0
    """What `peak_bytes` cannot exceed: the longest `depth` samples' states, in bf16."""
    started: float = field(default_factory=time.monotonic)

    def to_dict(self) -> dict:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        return {
            "fetched": self.fetched,
            "fetched_tokens": self.fetched_tokens,
            "served_tokens_per_s": round(self.fetched_tokens / elapsed, 1),
            "nonfinite": self.nonfinite,
            "pauses": self.pauses,
            "waited_s": round(self.waited_s, 3),
            "peak_bytes": self.peak_bytes,
            "bound_bytes": self.bound_bytes,
        }


def bytes_per_token(hidden_size: int, n_aux: int) -> int:
    """Host bytes one fetched token takes in the queue: bf16 aux and last states."""
    return 2 * (n_aux + 1) * hidden_size


class ServedStates:
    """This rank's samples, fetched ahead of training from one or more servers."""

    def __init__(
        self,
        engines: list[Any],
        slots: list[int],
        depth: int,
        order: Iterable[tuple[np.ndarray, int]],
        bound_bytes: int,
    ) -> None:
        self.servers = [Slot(e) for e in engines]
        self.depth, self.bound_bytes = depth, bound_bytes
        self._order: Iterator[tuple[np.ndarray, int]] = iter(order)
        self._next_key = 0  # the next position the order will hand out
        self._taken = 0  # the next position the trainer takes
        self._retry: deque[Job] = deque()
        self._urgent: deque[Job] = deque()
        self._ready: dict[int, tuple[Any, Any] | None] = {}
        self._urgent_key = -1
        self._held = 0  # fetched or in flight, not yet taken (training order only)
        self._failure: BaseException | None = None
        self._closed = False
        self._cond = threading.Condition()
        self.stats = Stats(bound_bytes=bound_bytes)
        self._threads = [
            threading.Thread(
                target=self._worker, args=(slot,), daemon=True, name=f"eagle3kit-fetch-{n}"
            )
            for slot, count in zip(self.servers, slots, strict=True)
            for n in range(count)
        ]
        for t in self._threads:
            t.start()

    # The trainer's side --------------------------------------------------------------------
    def take(
        self, tick: Callable[[], None] | None = None, give_up: Callable[[], bool] | None = None
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """The next sample of the order, as float32 (aux, last); None when its states are
        not finite. Waits while it is being fetched (calling `tick` every WAIT_TICK_S);
        raises the servers' error, or Interrupted when `give_up()` turns true."""
        key = self._taken
        began = time.monotonic()
        with self._cond:
            while key not in self._ready:
                self._raise_failure()
                if give_up is not None and give_up():
                    raise Interrupted
                self._cond.wait(WAIT_TICK_S)
                if tick is not None and key not in self._ready:
                    tick()
            states = self._ready.pop(key)
            self._taken += 1
            self._held -= 1
            if states is not None:
                self.stats.held_bytes -= _nbytes(states)
            self._cond.notify_all()
        self.stats.waited_s += time.monotonic() - began
        return _as_float(states)

    def fetch_now(self, samples: list[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray] | None]:
        """Samples outside the order (the held-out split), ahead of any queued work."""
        with self._cond:
            keys = []
            for ids in samples:
                self._urgent.append(Job(self._urgent_key, ids))
                keys.append(self._urgent_key)
                self._urgent_key -= 1
            self._cond.notify_all()
            while not all(k in self._ready for k in keys):
                self._raise_failure()
                self._cond.wait(WAIT_TICK_S)
            out = [self._ready.pop(k) for k in keys]
        return [_as_float(s) for s in out]

    def gauges(self) -> dict[str, float]:
        """What the progress display shows: server side and trainer side."""
        elapsed = max(time.monotonic() - self.stats.started, 1e-9)
        return {
            "served tok/s": round(self.stats.fetched_tokens / elapsed, 1),
            "queue": sum(1 for k in self._ready if k >= 0),
            "waiting %": round(100 * self.stats.waited_s / elapsed, 1),
            "servers down": sum(not s.up for s in self.servers),
        }

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for t in self._threads:
            t.join(timeout=5)
        for slot in self.servers:
            slot.engine.close()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    # The workers -----------------------------------------------------------------------------
    def _next_job(self, slot: Slot) -> Job | None:
        with self._cond:
            while True:
                if self._closed or self._failure is not None:
                    return None
                if slot.up and self._retry:
                    return self._retry.popleft()
                if slot.up and self._urgent:
                    return self._urgent.popleft()
                if slot.up and self._held < self.depth:
                    try:
                        ids, _length = next(self._order)
                    except StopIteration:
                        pass
                    else:
                        job = Job(self._next_key, ids)
                        self._next_key += 1
                        self._held += 1
                        return job
                self._cond.wait(WAIT_TICK_S)

    def _worker(self, slot: Slot) -> None:
        from eagle3kit.extract.vllm import BadFile, ServerUnreachable

        while (job := self._next_job(slot)) is not None:
            try:
                states = slot.engine.fetch(job.ids)
            except ServerUnreachable as exc:
                self._requeue(job)
                self._pause(slot, str(exc))
                continue
            except BadFile as exc:
                job.bad_files += 1
                if job.bad_files > BAD_FILE_RETRIES:
                    self._fail(exc)
                    return
                self._requeue(job)
                if not slot.engine.healthy():
                    self._pause(slot, str(exc))
                continue
            except Exception as exc:  # any worker error ends the run, in the trainer
                self._fail(
                    exc
                    if isinstance(exc, UserError)
                    else UserError(f"--server {slot.engine.url}: {type(exc).__name__}: {exc}")
                )
                return
            self._deliver(slot, job, states)

    def _deliver(self, slot: Slot, job: Job, states: Any) -> None:
        import torch

        n = len(job.ids)
        kept = None
        if states is not None:  # bf16, as extract stores them: half the memory of float32
            kept = (
                torch.from_numpy(states[0]).to(torch.bfloat16),
                torch.from_numpy(states[1]).to(torch.bfloat16),
            )
        with self._cond:
            self._ready[job.key] = kept
            slot.samples += 1
            slot.tokens += n
            self.stats.fetched += 1
            self.stats.fetched_tokens += n
            if kept is None:
                self.stats.nonfinite += 1
            elif job.key >= 0:
                self.stats.held_bytes += _nbytes(kept)
                self.stats.peak_bytes = max(self.stats.peak_bytes, self.stats.held_bytes)
            self._cond.notify_all()

    def _requeue(self, job: Job) -> None:
        with self._cond:
            self._retry.appendleft(job)  # first in line: the trainer waits for it
            self._cond.notify_all()

    def _fail(self, exc: BaseException) -> None:
        with self._cond:
            if self._failure is None:
                self._failure = exc
            self._cond.notify_all()

    def _pause(self, slot: Slot, why: str) -> None:
        """Pause `slot` until /health answers and the server is the one the run started
        with; one worker polls, the others of the slot wait in _next_job."""
        with self._cond:
            if not slot.up:
                return
            slot.up = False
            self.stats.pauses += 1
        _ui.warn(
            f"{slot.engine.url}: not answering ({why.split(': ', 1)[-1][:200]}); its "
            "requests pause while /health is polled"
        )
        delay = 0.5
        while not self._closed and self._failure is None:
            if slot.engine.healthy():
                try:
                    slot.engine.recheck()
                except UserError as exc:
                    if "cannot list its models" not in str(exc):  # still starting: poll on
                        self._fail(exc)
                        return
                else:
                    break
            time.sleep(delay)
            delay = min(HEALTH_POLL_MAX, delay * 1.5)
        with self._cond:
            slot.up = True
            self._cond.notify_all()
        if not self._closed:
            _ui.warn(f"{slot.engine.url}: back; resuming")


class Interrupted(Exception):
    """A stop was requested while the trainer waited for states."""


def _nbytes(states: tuple[Any, Any]) -> int:
    return sum(t.numel() * t.element_size() for t in states)


def _as_float(states: tuple[Any, Any] | None) -> tuple[np.ndarray, np.ndarray] | None:
    if states is None:
        return None
    return states[0].float().numpy(), states[1].float().numpy()


def connect(
    urls: list[tuple[str, int]],
    model: str | None,
    layers: list[int],
    hidden_size: int,
    timeout: float,
    storage: Any,
    api_key: str | None = None,
) -> list[Any]:
    """One extract engine per server (url, slots): each lists its model and is refused with
    extract's message when prefix caching is on. They share `storage` (a StorageDir), so a
    file one server named is refused when another names it too."""
    from eagle3kit.extract.vllm import VllmEngine

    engines: list[Any] = []
    try:
        for url, slots in urls:
            # One try: a failure pauses the server at once while /health tells whether it
            # is down (see ServedStates._pause), where extract would retry and then stop.
            engines.append(
                VllmEngine.open(
                    url,
                    model,
                    layers,
                    hidden_size,
                    slots,
                    timeout,
                    storage,
                    attempts=1,
                    api_key=api_key,
                )
            )
    except BaseException:
        for e in engines:
            e.close()
        raise
    models = {e.model for e in engines}
    if len(models) > 1:
        for e in engines:
            e.close()
        raise UserError(
            "--server: the servers serve different models ("
            + ", ".join(f"{e.url}: {e.model!r}" for e in engines)
            + "); every server must serve the same target"
        )
    return engines


def open_for(
    cfg: TrainConfig,
    world: int,
    hidden: int,
    layers: list[int],
    order: Iterable[tuple[np.ndarray, int]],
    lengths: list[int],
) -> ServedStates:
    """Connect to --server's servers and start fetching this rank's samples in `order`
    (their token ids and lengths; `lengths`: every length the order holds, for the bound)."""
    from eagle3kit._served_files import StorageDir

    assert cfg.hidden_states_dir is not None  # TrainConfig refuses --server without it
    engines = connect(
        cfg.server_slots,
        cfg.model,
        layers,
        hidden,
        cfg.request_timeout,
        StorageDir(cfg.hidden_states_dir),
        cfg.api_key,
    )
    depth = cfg.prefetch_depth
    longest = sorted(lengths, reverse=True)
    bound = sum(longest[:depth]) * bytes_per_token(hidden, len(layers))
    slots = [n for _, n in cfg.server_slots]
    _ui.info(
        f"train: states from {len(engines)} server(s), {sum(slots)} requests in flight"
        f"{' per rank' if world > 1 else ''}, up to {depth} samples "
        f"ahead: at most {_text.human_bytes(bound)} of states held in host memory",
        cfg.output,
    )
    return ServedStates(engines, slots, depth, order, bound)

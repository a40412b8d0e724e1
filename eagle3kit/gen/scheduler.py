"""Keeping every server slot busy until every sample is in the dataset.

Each backend runs one worker per slot; workers pull jobs from a shared queue (one for short
prompts, one for long ones when --long-threshold splits them), so load spreads by itself. A
feeder renders conversations just ahead of the workers. The parts each have their file:
the jobs (`jobs.py`), retries and backoff (`retry.py`), the server watch with its identity
re-probe (`watch.py`), recording samples (`record.py`), the stall warning (`stalls.py`),
signals (`signals.py`), and the supervisor that ends the run on the first failure in any
task (`supervisor.py`).
"""

from __future__ import annotations

import asyncio
import signal
import time

import eagle3kit.gen.servers as servers
import eagle3kit.gen.signals as signals
from eagle3kit import _ui
from eagle3kit.chat.render import Renderer
from eagle3kit.errors import UserError
from eagle3kit.format import DatasetWriter
from eagle3kit.gen.backends import Backend, HttpBackend
from eagle3kit.gen.config import GenConfig
from eagle3kit.gen.jobs import Chain, Job, Unsendable, build_job
from eagle3kit.gen.record import Recorder
from eagle3kit.gen.retry import Retries
from eagle3kit.gen.stalls import Stalls
from eagle3kit.gen.supervisor import Supervisor
from eagle3kit.gen.types import Completion
from eagle3kit.gen.watch import ServerWatch


class Scheduler:
    def __init__(
        self,
        cfg: GenConfig,
        renderer: Renderer,
        backends: list[Backend],
        writer: DatasetWriter,
        progress: _ui.Progress,
        context_len: int | None,
        probe_ids: list[int] | None = None,
    ) -> None:
        """`probe_ids`: --tokenizer's ids for PROBE_TEXT, to check a restarted server's
        tokenizer against (None: --no-tokenizer-check)."""
        self.cfg, self.renderer, self.backends = cfg, renderer, backends
        self.writer, self.progress = writer, progress
        self.context_len = context_len
        self.queues: dict[bool, asyncio.Queue[Job]] = {
            False: asyncio.Queue(),
            True: asyncio.Queue(),
        }
        self.outstanding = 0
        self.in_flight = 0
        self.feeding = True
        self.signals = 0
        self.first_signal: signal.Signals | None = None
        self.want_more = asyncio.Event()
        self.low_water = sum(b.slots for b in backends)
        self.stats = {
            "violations": 0,
            "retries": 0,
            "failed": 0,
            "truncated": 0,
            "paused": 0,
            "filtered": 0,
            "reprobes": 0,
        }
        self.supervisor = Supervisor()
        self.watch = ServerWatch(cfg, backends, self.supervisor, self.stats, probe_ids)
        self.recorder = Recorder(cfg, writer, progress, self.stats, self.supervisor)
        self.retries = Retries(
            cfg, progress, self.stats, self.watch, self.recorder, self.supervisor, self._resolve
        )
        self.stalls = Stalls(cfg, progress)

    @property
    def failure(self) -> BaseException | None:
        """The error that ended the run, if one did."""
        return self.supervisor.failure

    @property
    def stopping(self) -> bool:
        return self.supervisor.stopping

    # Jobs ---------------------------------------------------------------------------------
    def make_job(self, chain: Chain, turn: int) -> Job | None:
        """Render the prompt of `turn`; None (and a recorded skip) when it cannot be sent."""
        job = build_job(self.cfg, self.renderer, self.context_len, chain, turn)
        if isinstance(job, Unsendable):
            self.recorder.skip(chain, turn, [], job.finish, job.why)
            return None
        return job

    def _enqueue(self, job: Job) -> None:
        self.outstanding += 1
        self.queues[job.long].put_nowait(job)

    def _resolve(self) -> None:
        self.outstanding -= 1
        self._check_finished()

    def _check_finished(self) -> None:
        if (not self.feeding and self.outstanding == 0) or (self.stopping and not self.in_flight):
            self.supervisor.finished.set()

    def _advance(self, job: Job, finish: str, output_ids: list[int]) -> None:
        """After a recorded turn: the chain's next turn, or its skip when this one did not
        finish."""
        chain = job.chain
        chain.turn = job.turn + 1
        if chain.turn >= len(chain.ids):
            return
        if finish != "stop":
            self.recorder.skip_rest(chain, chain.turn, f"turn {job.turn}: {finish}")
            return
        chain.answers.append(self.renderer.answer_message(output_ids))
        next_job = self.make_job(chain, chain.turn)
        if next_job is not None:
            self._enqueue(next_job)

    # Workers ------------------------------------------------------------------------------
    async def worker(self, backend: Backend, long: bool) -> None:
        queue = self.queues[long]
        up = self.watch.up[backend.name]
        while not self.stopping:
            await up.wait()
            job = await queue.get()
            # Refill well before the queue runs dry, so no slot waits on rendering.
            if queue.qsize() < self.low_water:
                self.want_more.set()
            if self.stopping:  # left for the next run
                return
            if not up.is_set() or not await self.watch.still_same(backend):
                queue.put_nowait(job)  # paused while this worker waited: not this job's fault
                continue
            await self._attempt(backend, job, queue)

    def _count_in_flight(self, backend: Backend, delta: int) -> None:
        self.in_flight += delta
        self.watch.in_flight_by[backend.name] += delta
        self.progress.set(in_flight=self.in_flight)
        self.progress.set(
            (f"server:{backend.name}",), in_flight=self.watch.in_flight_by[backend.name]
        )

    async def _attempt(self, backend: Backend, job: Job, queue: asyncio.Queue) -> None:
        self._count_in_flight(backend, 1)
        number = self.stalls.start(backend.name, job.request.sample_id)
        try:
            completion = await backend.generate(job.request)
        except servers.BadAnswer as exc:
            self.retries.bad_answer(backend, job, exc)
            if not self.stopping:
                await self.retries.retry(backend, job, queue, exc)
            return
        except servers.RetryableError as exc:
            await self.retries.retry(backend, job, queue, exc)
            return
        except servers.RequestRejected as exc:
            self.recorder.skip(
                job.chain, job.turn, job.request.prompt_ids, f"skipped:{exc.reason}", str(exc)
            )
            self._resolve()
            return
        except servers.ServerFatal as exc:
            self._fatal(backend, job, queue, exc)
            return
        finally:
            self.stalls.done(number)
            self.watch.last_exchange[backend.name] = time.monotonic()
            self._count_in_flight(backend, -1)
            self._check_finished()
        self.watch.answered[backend.name] += 1
        self._record(job, completion)
        self._resolve()

    def _fatal(
        self, backend: Backend, job: Job, queue: asyncio.Queue, exc: servers.ServerFatal
    ) -> None:
        if exc.reason == "not_found" and self.watch.answered[backend.name]:
            # It served this model a moment ago: restarted with another one? The probe
            # tells; the same model again makes this error final.
            self.watch.fatal_after_probe[backend.name] = exc
            self.watch.suspect(backend, down=False)
            queue.put_nowait(job)
            return
        self.supervisor.fail(UserError(str(exc)))

    def _record(self, job: Job, completion: Completion) -> None:
        finish = self.recorder.record(job, completion)
        if finish is not None:
            self._advance(job, finish, completion.output_ids)

    # Feeding and the main loop -------------------------------------------------------------
    async def feed(self, starts: list[tuple[Chain, int]]) -> None:
        high = 2 * sum(b.slots for b in self.backends) + 16
        try:
            for chain, turn in starts:
                if self.stopping:
                    break
                if chain.blocked:
                    self.recorder.skip_rest(chain, turn, chain.blocked)
                    continue
                job = self.make_job(chain, turn)
                if job is not None:
                    self._enqueue(job)
                if sum(q.qsize() for q in self.queues.values()) >= high:
                    self.want_more.clear()
                    await self.want_more.wait()
                else:
                    # One rendering at a time: a burst of them holds up the answers waiting
                    # to be recorded, and their slots sit idle until the next request goes.
                    await asyncio.sleep(0)
        finally:
            self.feeding = False
            self._check_finished()

    async def committer(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self.writer.maybe_commit()
            self.progress.set(in_flight=self.in_flight)
            self.stalls.warn()

    def on_signal(self, sig: signal.Signals) -> None:
        self.signals += 1
        self.first_signal = self.first_signal or sig
        self.supervisor.stopping = True
        if self.signals == 1:
            _ui.warn(
                f"stopping: no new requests; {self.in_flight} in flight get "
                f"{self.cfg.grace:g}s to finish (press again to abort them)"
            )
            asyncio.get_running_loop().call_later(self.cfg.grace, self.supervisor.finished.set)
            self._check_finished()
        else:
            self.supervisor.finished.set()

    def _start_workers(self, backend: Backend) -> None:
        spawn = self.supervisor.spawn
        split = self.cfg.long_threshold is not None
        short = (self.cfg.short_concurrency or backend.slots) if split else backend.slots
        for _ in range(short):
            spawn(self.worker(backend, False))
        if split:
            for _ in range(self.cfg.long_concurrency or max(1, backend.slots // 4)):
                spawn(self.worker(backend, True))
        if isinstance(backend, HttpBackend):
            spawn(self.watch.check_identities(backend))

    async def run(self, starts: list[tuple[Chain, int]]) -> None:
        try:
            with signals.handled(self.on_signal):
                self.supervisor.spawn(self.feed(starts))
                self.supervisor.spawn(self.committer())
                for backend in self.backends:
                    self._start_workers(backend)
                await self.supervisor.finished.wait()
        finally:
            await self.supervisor.cancel_all()

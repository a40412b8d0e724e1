"""Keeping every server slot busy until every sample is in the dataset.

Each backend runs one worker per slot; workers pull jobs from a shared queue (one for short
prompts, one for long ones when --long-threshold splits them), so load spreads by itself. A
feeder renders conversations just ahead of the workers. A failed request is retried with
backoff unless the server itself went away: then its slots pause while /health is polled,
and the request goes back to the queue without counting as an attempt.
"""

from __future__ import annotations

import asyncio
import random
import signal
from dataclasses import dataclass, field

import xxhash

from eagle3kit import _ui
from eagle3kit.errors import UserError
from eagle3kit.format import DatasetWriter, TokenSample
from eagle3kit.gen import clients
from eagle3kit.gen.backends import Backend
from eagle3kit.gen.config import GenConfig
from eagle3kit.gen.render import Renderer
from eagle3kit.gen.types import Completion, Conversation, GenRequest

HEALTH_POLL_MAX = 10.0
BACKOFF_MAX = 60.0


@dataclass
class Chain:
    """The turns of one conversation for one sample index, generated in order."""

    conv: Conversation
    index: int
    ids: list[str]
    answers: list[dict] = field(default_factory=list)
    """The model's own answers to the turns done so far (for --history own)."""
    turn: int = 0
    blocked: str | None = None
    """Why the remaining turns cannot be generated (an earlier turn did not finish)."""


@dataclass
class Job:
    chain: Chain
    turn: int
    request: GenRequest
    long: bool
    messages: list[dict] = field(default_factory=list)
    """The history the prompt ids render, stored so validate can check the round trip."""
    attempts: int = 0
    last_error: str = ""


def sample_seed(sampling_seed: int | None, sample_id: str) -> int | None:
    """Each sample's own seed: n samples of one prompt differ, and a rerun reproduces them."""
    if sampling_seed is None:
        return None
    return xxhash.xxh64_intdigest(f"{sampling_seed}:{sample_id}".encode()) & 0x7FFFFFFF


class Scheduler:
    def __init__(
        self,
        cfg: GenConfig,
        renderer: Renderer,
        backends: list[Backend],
        writer: DatasetWriter,
        progress: _ui.Progress,
        context_len: int | None,
    ) -> None:
        self.cfg, self.renderer, self.backends = cfg, renderer, backends
        self.writer, self.progress = writer, progress
        self.context_len = context_len
        self.queues = {False: asyncio.Queue(), True: asyncio.Queue()}
        self.outstanding = 0
        self.in_flight = 0
        self.feeding = True
        self.stopping = False
        self.signals = 0
        self.failure: BaseException | None = None
        self.finished = asyncio.Event()
        self.want_more = asyncio.Event()
        self.up = {b.name: asyncio.Event() for b in backends}
        for event in self.up.values():
            event.set()
        self.low_water = sum(b.slots for b in backends)
        self.in_flight_by = {b.name: 0 for b in backends}
        self.stats = {"violations": 0, "retries": 0, "failed": 0, "truncated": 0, "paused": 0,
                      "filtered": 0}

    # Jobs ---------------------------------------------------------------------------------
    def _max_tokens(self, long: bool) -> int:
        cfg = self.cfg
        chosen = cfg.long_max_tokens if long else cfg.short_max_tokens
        return chosen or cfg.max_tokens

    def make_job(self, chain: Chain, turn: int) -> Job | None:
        """Render the prompt of `turn`; None (and a recorded skip) when it cannot be sent."""
        cfg = self.cfg
        answers = chain.answers if cfg.history == "own" else None
        try:
            history = self.renderer.history(chain.conv, turn, answers)
            prompt_ids = self.renderer.render(history, chain.conv.tools)
        except (ValueError, IndexError) as exc:  # one record the template refuses
            self._skip(chain, turn, [], "skipped:render_error", str(exc))
            return None
        long = cfg.long_threshold is not None and len(prompt_ids) >= cfg.long_threshold
        max_tokens = self._max_tokens(long)
        if self.context_len is not None:
            room = self.context_len - len(prompt_ids)
            if room < max(1, cfg.min_completion_tokens):
                self._skip(chain, turn, prompt_ids, "skipped:prompt_too_long",
                           f"{len(prompt_ids)} prompt tokens leave {room} of {self.context_len}")
                return None
            max_tokens = min(max_tokens, room)
        sample_id = chain.ids[turn]
        request = GenRequest(
            sample_id=sample_id, prompt_ids=prompt_ids, max_tokens=max_tokens,
            stop_token_ids=self.renderer.stop_token_ids, temperature=cfg.temperature,
            top_p=cfg.top_p, top_k=cfg.top_k, min_p=cfg.min_p,
            seed=sample_seed(cfg.sampling_seed, sample_id),
            messages=history if cfg.api == "openai-chat" else None, tools=chain.conv.tools,
        )
        return Job(chain, turn, request, long, history)

    def _enqueue(self, job: Job) -> None:
        self.outstanding += 1
        self.queues[job.long].put_nowait(job)

    def _resolve(self) -> None:
        self.outstanding -= 1
        self._check_finished()

    def _check_finished(self) -> None:
        if (not self.feeding and self.outstanding == 0) or (self.stopping and not self.in_flight):
            self.finished.set()

    # Recording ----------------------------------------------------------------------------
    def _sample(self, chain: Chain, turn: int, prompt_ids: list[int], completion_ids: list[int],
                finish: str, **extra) -> TokenSample:
        conv = chain.conv
        metadata = {**conv.extra, **extra.pop("metadata", {})}
        return TokenSample(
            sample_id=chain.ids[turn], prompt_ids=prompt_ids, completion_ids=completion_ids,
            finish_reason=finish, partition=conv.partition,
            source={"file": conv.source, "line": conv.line, "turn": turn, "index": chain.index},
            metadata=metadata, **extra,
        )

    def _skip(self, chain: Chain, turn: int, prompt_ids: list[int], finish: str,
              why: str) -> None:
        self.writer.add(self._sample(chain, turn, prompt_ids, [], finish,
                                     metadata={"reason": why}))
        self.progress.add(1, rows=(f"partition:{chain.conv.partition}",), skipped=1)
        self._skip_rest(chain, turn + 1, f"turn {turn}: {finish}")

    def record(self, job: Job, c: Completion) -> None:
        cfg, chain = self.cfg, job.chain
        if c.violations:
            self.stats["violations"] += 1
            if cfg.strict:
                self.fail(UserError(
                    f"{c.server.get('url', '?')}: response for sample {job.request.sample_id} "
                    f"breaks the server invariants ({'; '.join(c.violations)}); stopping "
                    "because of --strict"))
                return
        finish = c.finish_reason
        if finish == "stop" and len(c.output_ids) < cfg.min_completion_tokens:
            finish = "filtered:min_completion_tokens"
            # Filtered samples must be counted, not only stored (GenResult.filtered).
            self.stats["filtered"] += 1
        metadata: dict = {"sampling": {"temperature": cfg.temperature, "top_p": cfg.top_p,
                                       "top_k": cfg.top_k, "min_p": cfg.min_p,
                                       "seed": job.request.seed,
                                       "max_tokens": job.request.max_tokens}}
        if c.violations:
            metadata["violations"] = c.violations
        if c.reconstructed:
            metadata["reconstructed"] = True
        if job.attempts:
            metadata["attempts"] = job.attempts + 1
        metadata["messages"] = job.messages
        if chain.conv.tools:
            metadata["tools"] = chain.conv.tools
        sample = self._sample(
            chain, job.turn, job.request.prompt_ids, c.output_ids, finish, metadata=metadata,
            server=c.server, latency=round(c.latency, 4),
            counts={"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
                    **c.counts},
        )
        self.writer.add(sample)
        truncated = finish == "length"
        self.stats["truncated"] += truncated
        self.progress.add(1, rows=(f"partition:{chain.conv.partition}",
                                   f"server:{c.server.get('url', '?')}"),
                          tokens=len(c.output_ids), truncated=int(truncated),
                          violations=int(bool(c.violations)))
        self._advance(job, finish, c.output_ids)

    def _advance(self, job: Job, finish: str, output_ids: list[int]) -> None:
        chain = job.chain
        chain.turn = job.turn + 1
        if chain.turn >= len(chain.ids):
            return
        if finish != "stop":
            self._skip_rest(chain, chain.turn, f"turn {job.turn}: {finish}")
            return
        chain.answers.append(self.renderer.answer_message(output_ids))
        next_job = self.make_job(chain, chain.turn)
        if next_job is not None:
            self._enqueue(next_job)

    def _skip_rest(self, chain: Chain, first: int, why: str) -> None:
        """Later turns would build on a turn that did not finish: record them as skipped."""
        for later in range(first, len(chain.ids)):
            self.writer.add(self._sample(chain, later, [], [], "skipped:earlier_turn",
                                         metadata={"reason": why}))
            self.progress.add(1, rows=(f"partition:{chain.conv.partition}",), skipped=1)

    def fail(self, exc: BaseException) -> None:
        self.failure = self.failure or exc
        self.stopping = True
        self.finished.set()

    # Workers ------------------------------------------------------------------------------
    async def worker(self, backend: Backend, long: bool) -> None:
        queue = self.queues[long]
        while not self.stopping:
            await self.up[backend.name].wait()
            job = await queue.get()
            # Refill well before the queue runs dry, so no slot waits on rendering.
            if queue.qsize() < self.low_water:
                self.want_more.set()
            if self.stopping:  # left for the next run
                return
            await self._attempt(backend, job, queue)

    def _count_in_flight(self, backend: Backend, delta: int) -> None:
        self.in_flight += delta
        self.in_flight_by[backend.name] += delta
        self.progress.set(in_flight=self.in_flight)
        self.progress.set(in_flight=self.in_flight_by[backend.name],
                          rows=(f"server:{backend.name}",))

    async def _attempt(self, backend: Backend, job: Job, queue: asyncio.Queue) -> None:
        self._count_in_flight(backend, 1)
        try:
            completion = await backend.generate(job.request)
        except clients.RetryableError as exc:
            await self._retry(backend, job, queue, str(exc))
            return
        except clients.RequestRejected as exc:
            self._skip(job.chain, job.turn, job.request.prompt_ids,
                       f"skipped:{exc.reason}", str(exc))
            self._resolve()
            return
        except clients.ServerFatal as exc:
            self.fail(UserError(str(exc)))
            return
        finally:
            self._count_in_flight(backend, -1)
            self._check_finished()
        self.record(job, completion)
        self._resolve()

    async def _retry(self, backend: Backend, job: Job, queue: asyncio.Queue, error: str) -> None:
        self.stats["retries"] += 1
        self.progress.add(0, retries=1, rows=(f"server:{backend.name}",))
        if not self.up[backend.name].is_set() or not await backend.healthy():
            # The server went away: not this prompt's fault, so no attempt is spent on it.
            self._pause(backend)
            queue.put_nowait(job)
            return
        job.attempts += 1
        job.last_error = error
        if job.attempts >= self.cfg.max_attempts:
            self.stats["failed"] += 1
            self.progress.add(0, errors=1, rows=(f"partition:{job.chain.conv.partition}",
                                                 f"server:{backend.name}"))
            self._skip(job.chain, job.turn, job.request.prompt_ids, "skipped:failed",
                       f"{job.attempts} attempts, last error: {error}")
            self._resolve()
            return
        delay = min(BACKOFF_MAX, 0.25 * 2 ** job.attempts) * random.uniform(0.5, 1.5)
        asyncio.get_running_loop().call_later(delay, queue.put_nowait, job)

    def _pause(self, backend: Backend) -> None:
        event = self.up[backend.name]
        if not event.is_set():
            return
        event.clear()
        self.stats["paused"] += 1
        _ui.warn(f"{backend.name}: not answering; its slots pause while /health is polled")
        asyncio.get_running_loop().create_task(self._poll_health(backend))

    async def _poll_health(self, backend: Backend) -> None:
        delay = 0.5
        while not self.stopping:
            await asyncio.sleep(delay)
            if await backend.healthy():
                _ui.info(f"{backend.name}: back; resuming", self.cfg.output_options)
                self.up[backend.name].set()
                return
            delay = min(HEALTH_POLL_MAX, delay * 1.5)

    # Feeding and the main loop -------------------------------------------------------------
    async def feed(self, starts: list[tuple[Chain, int]]) -> None:
        high = 2 * sum(b.slots for b in self.backends) + 16
        try:
            for chain, turn in starts:
                if self.stopping:
                    break
                if chain.blocked:
                    self._skip_rest(chain, turn, chain.blocked)
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
        except asyncio.CancelledError:  # the run is ending (a signal): not a failure
            raise
        except Exception as exc:  # a rendering error must not leave the run hanging
            self.fail(exc)
        finally:
            self.feeding = False
            self._check_finished()

    async def committer(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self.writer.maybe_commit()
            self.progress.set(in_flight=self.in_flight)

    def on_signal(self) -> None:
        self.signals += 1
        self.stopping = True
        if self.signals == 1:
            _ui.warn(f"stopping: no new requests; {self.in_flight} in flight get "
                     f"{self.cfg.grace:g}s to finish (press again to abort them)")
            asyncio.get_running_loop().call_later(self.cfg.grace, self.finished.set)
            self._check_finished()
        else:
            self.finished.set()

    async def run(self, starts: list[tuple[Chain, int]]) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.on_signal)
        tasks = [loop.create_task(self.feed(starts)), loop.create_task(self.committer())]
        for backend in self.backends:
            split = self.cfg.long_threshold is not None
            short = (self.cfg.short_concurrency or backend.slots) if split else backend.slots
            tasks += [loop.create_task(self.worker(backend, False)) for _ in range(short)]
            if split:
                long_slots = self.cfg.long_concurrency or max(1, backend.slots // 4)
                tasks += [loop.create_task(self.worker(backend, True)) for _ in range(long_slots)]
        try:
            await self.finished.wait()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def resume_point(chain: Chain, done: set[str]) -> int:
    """The first turn of `chain` not yet in the dataset (len(ids) when all are)."""
    for turn, sample_id in enumerate(chain.ids):
        if sample_id not in done:
            return turn
    return len(chain.ids)


"""Keeping every server slot busy until every sample is in the dataset.

Each backend runs one worker per slot; workers pull jobs from a shared queue (one for short
prompts, one for long ones when --long-threshold splits them), so load spreads by itself. A
feeder renders conversations just ahead of the workers. A failed request is retried with
backoff for up to --retry-for, unless the server itself went away: then its slots pause while
/health is polled, and the request goes back to the queue without counting. A server that
went away, or dropped a connection, is probed again before it gets more work: one that now
serves another model (or tokenizes differently) stays paused, and when no server is left the
run ends.

Every task the scheduler starts is watched: an exception in any of them (a commit that
failed, an answer that could not be stored, a bug) ends the run at once with that error,
instead of leaving the others waiting on work that will never come.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import signal
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import xxhash

from eagle3kit import _ui
from eagle3kit._argv import command_line
from eagle3kit.errors import UserError
from eagle3kit.format import DatasetError, DatasetWriter, TokenSample
from eagle3kit.gen import servers
from eagle3kit.gen.backends import Backend, HttpBackend
from eagle3kit.gen.config import GenConfig
from eagle3kit.gen.render import Renderer
from eagle3kit.gen.types import Completion, Conversation, GenRequest

HEALTH_POLL_MAX = 10.0
BACKOFF_MAX = 60.0
IDENTITY_CHECK_S = 30.0
"""How often a server that is up is asked again which model it serves."""
IDLE_REPROBE_S = 0.5
"""A server with nothing in flight and no exchange for this long is probed before the next
request: a restart that failed no request (none was in flight) leaves exactly such a gap,
and the next answer could otherwise come from whatever model it came back with."""
RESTART_REASONS = frozenset({"refused", "connect", "reset", "model_changed"})
"""Failures after which a server is probed again before it gets more work."""
HEAD_CHARS_PER_TOKEN = 16
"""A prompt longer than this many characters per token of the context is measured on its
head first: tokenizing a 100 MB prompt whole takes gigabytes and minutes."""
HEAD_SLACK_TOKENS = 64
"""Tokens a cut can add at its edge: a head that is this much over the context proves the
whole prompt is."""


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
    again = f" Continue with: {command_line()}"
    if isinstance(exc, UserError):
        exc.args = (f"{str(exc).rstrip(' .')}.{again}",)
        return exc
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        return WriteFailed(f"{where}cannot write: {exc.strerror or exc}. Everything committed "
                           f"before is intact.{again}")
    return WorkerFailed(f"gen stopped by an unexpected error ({type(exc).__name__}: {exc}); "
                        f"everything committed before is intact. Please report it.{again}")


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
    retry_spent: float = 0.0
    """Seconds of backoff this request has waited so far (--retry-for bounds it)."""
    violations: list[str] = field(default_factory=list)
    """What the last unusable answer to it broke."""


@dataclass
class Running:
    """A request in flight, for the stall warning."""

    backend: str
    sample_id: str
    since: float
    warned: bool = False


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
        probe_ids: list[int] | None = None,
    ) -> None:
        """`probe_ids`: --tokenizer's ids for PROBE_TEXT, to check a restarted server's
        tokenizer against (None: --no-tokenizer-check)."""
        self.cfg, self.renderer, self.backends = cfg, renderer, backends
        self.writer, self.progress = writer, progress
        self.context_len = context_len
        self.probe_ids = probe_ids
        self.queues: dict[bool, asyncio.Queue[Job]] = {False: asyncio.Queue(),
                                                        True: asyncio.Queue()}
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
        self.down: set[str] = set()
        """Servers paused because they stopped answering."""
        self.wrong: dict[str, str] = {}
        """Servers paused because they now serve something else, with what is wrong."""
        self.watching: set[str] = set()
        self.fatal_after_probe: dict[str, servers.ServerFatal] = {}
        self.answered = {b.name: 0 for b in backends}
        self.last_exchange = {b.name: time.monotonic() for b in backends}
        self.confirming = {b.name: asyncio.Lock() for b in backends}
        self.low_water = sum(b.slots for b in backends)
        self.in_flight_by = {b.name: 0 for b in backends}
        self.running: dict[int, Running] = {}
        self._request_numbers = itertools.count()
        self.tasks: set[asyncio.Task] = set()
        self.stats = {"violations": 0, "retries": 0, "failed": 0, "truncated": 0, "paused": 0,
                      "filtered": 0, "reprobes": 0}

    # Tasks --------------------------------------------------------------------------------
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
            text = self.renderer.render_text(history, chain.conv.tools)
            too_long = self._surely_too_long(text)
            prompt_ids = [] if too_long else self.renderer.encode(text)
        except (ValueError, IndexError) as exc:  # one record the template refuses
            self._skip(chain, turn, [], "skipped:render_error", str(exc))
            return None
        if too_long:
            self._skip(chain, turn, [], "skipped:prompt_too_long", too_long)
            return None
        long = cfg.long_threshold is not None and len(prompt_ids) >= cfg.long_threshold
        max_tokens = self._max_tokens(long)
        if self.context_len is not None:
            room = self.context_len - len(prompt_ids)
            if room < max(1, cfg.min_completion_tokens):
                # The ids are not kept: a sample that cannot be sent is no training data,
                # and an enormous prompt would be stored whole.
                self._skip(chain, turn, [], "skipped:prompt_too_long",
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

    def _surely_too_long(self, text: str) -> str | None:
        """Why a huge prompt cannot fit, found from its head alone; None when it may fit."""
        if self.context_len is None:
            return None
        cut = self.context_len * HEAD_CHARS_PER_TOKEN
        if len(text) <= cut:
            return None
        head = len(self.renderer.encode(text[:cut]))
        if head <= self.context_len + HEAD_SLACK_TOKENS:
            return None
        return (f"{len(text):,} characters, the first {cut:,} of them already {head:,} tokens: "
                f"more than the {self.context_len} of the context (not tokenized whole)")

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

    def _store(self, sample: TokenSample, server: str | None = None) -> None:
        """Add a sample to the dataset; a failure becomes the error that ends the run."""
        try:
            self.writer.add(sample)
        except (ValueError, TypeError, OverflowError) as exc:
            raise UnusableAnswer(
                f"{server or 'gen'}: the answer for sample {sample.sample_id} cannot be stored "
                f"({exc}); everything committed before is intact") from None

    def _skip(self, chain: Chain, turn: int, prompt_ids: list[int], finish: str,
              why: str, metadata: dict | None = None) -> None:
        self._store(self._sample(chain, turn, prompt_ids, [], finish,
                                 metadata={"reason": why, **(metadata or {})}))
        self.progress.add(1, rows=(f"partition:{chain.conv.partition}",), skipped=1)
        self._skip_rest(chain, turn + 1, f"turn {turn}: {finish}")

    def record(self, job: Job, c: Completion) -> None:
        cfg, chain = self.cfg, job.chain
        if c.violations:
            self.stats["violations"] += 1
            if cfg.strict:
                self.fail(self._strict_error(c.server.get("url", "?"), job, c.violations))
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
        self._store(sample, c.server.get("url"))
        truncated = finish == "length"
        self.stats["truncated"] += truncated
        self.progress.add(1, rows=(f"partition:{chain.conv.partition}",
                                   f"server:{c.server.get('url', '?')}"),
                          tokens=len(c.output_ids), truncated=int(truncated),
                          violations=int(bool(c.violations)))
        self._advance(job, finish, c.output_ids)

    def _strict_error(self, url: str, job: Job, violations: list[str]) -> UserError:
        return UserError(
            f"{url}: response for sample {job.request.sample_id} breaks the server invariants "
            f"({'; '.join(violations)}); stopping because of --strict")

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
            self._store(self._sample(chain, later, [], [], "skipped:earlier_turn",
                                     metadata={"reason": why}))
            self.progress.add(1, rows=(f"partition:{chain.conv.partition}",), skipped=1)

    # Workers ------------------------------------------------------------------------------
    async def worker(self, backend: Backend, long: bool) -> None:
        queue = self.queues[long]
        up = self.up[backend.name]
        while not self.stopping:
            await up.wait()
            job = await queue.get()
            # Refill well before the queue runs dry, so no slot waits on rendering.
            if queue.qsize() < self.low_water:
                self.want_more.set()
            if self.stopping:  # left for the next run
                return
            if not up.is_set() or not await self._still_same(backend):
                queue.put_nowait(job)  # paused while this worker waited: not this job's fault
                continue
            await self._attempt(backend, job, queue)

    def _count_in_flight(self, backend: Backend, delta: int) -> None:
        self.in_flight += delta
        self.in_flight_by[backend.name] += delta
        self.progress.set(in_flight=self.in_flight)
        self.progress.set(in_flight=self.in_flight_by[backend.name],
                          rows=(f"server:{backend.name}",))

    async def _attempt(self, backend: Backend, job: Job, queue: asyncio.Queue) -> None:
        self._count_in_flight(backend, 1)
        number = next(self._request_numbers)
        self.running[number] = Running(backend.name, job.request.sample_id, time.monotonic())
        try:
            completion = await backend.generate(job.request)
        except servers.BadAnswer as exc:
            self._bad_answer(backend, job, exc)
            if not self.stopping:
                await self._retry(backend, job, queue, exc)
            return
        except servers.RetryableError as exc:
            await self._retry(backend, job, queue, exc)
            return
        except servers.RequestRejected as exc:
            self._skip(job.chain, job.turn, job.request.prompt_ids,
                       f"skipped:{exc.reason}", str(exc))
            self._resolve()
            return
        except servers.ServerFatal as exc:
            if exc.reason == "not_found" and self.answered[backend.name]:
                # It served this model a moment ago: restarted with another one? The probe
                # tells; the same model again makes this error final.
                self.fatal_after_probe[backend.name] = exc
                self._suspect(backend, down=False)
                queue.put_nowait(job)
                return
            self.fail(UserError(str(exc)))
            return
        finally:
            self.running.pop(number, None)
            self.last_exchange[backend.name] = time.monotonic()
            self._count_in_flight(backend, -1)
            self._check_finished()
        self.answered[backend.name] += 1
        self.record(job, completion)
        self._resolve()

    def _bad_answer(self, backend: Backend, job: Job, exc: servers.BadAnswer) -> None:
        """An answer whose ids cannot be stored: a violation, never data."""
        self.stats["violations"] += 1
        self.progress.add(0, violations=1, rows=(f"server:{backend.name}",))
        job.violations = exc.violations
        if self.cfg.strict:
            self.fail(self._strict_error(backend.name, job, exc.violations))

    async def _retry(self, backend: Backend, job: Job, queue: asyncio.Queue,
                     exc: servers.RetryableError) -> None:
        self.stats["retries"] += 1
        self.progress.add(0, retries=1, rows=(f"server:{backend.name}",))
        if backend.name in self.down or not await backend.healthy():
            # The server went away: not this prompt's fault, so no attempt is spent on it.
            # (Paused only to be probed again, it is up: the attempt counts.)
            self._suspect(backend, down=True)
            queue.put_nowait(job)
            return
        if exc.reason in RESTART_REASONS:  # it may have restarted in between: probe it again
            self._suspect(backend, down=False)
        job.attempts += 1
        job.last_error = str(exc)
        cfg = self.cfg
        spent = (cfg.max_attempts is not None and job.attempts >= cfg.max_attempts) or \
            job.retry_spent >= cfg.retry_for
        if spent:
            self._give_up(backend, job)
            return
        delay = min(BACKOFF_MAX, 0.25 * 2 ** job.attempts) * random.uniform(0.5, 1.5)
        job.retry_spent += delay
        asyncio.get_running_loop().call_later(delay, queue.put_nowait, job)

    def _give_up(self, backend: Backend, job: Job) -> None:
        self.stats["failed"] += 1
        self.progress.add(0, errors=1, rows=(f"partition:{job.chain.conv.partition}",
                                             f"server:{backend.name}"))
        extra: dict = {"retried_s": round(job.retry_spent, 1)}
        if job.violations:
            extra["violations"] = job.violations
        self._skip(job.chain, job.turn, job.request.prompt_ids, "skipped:failed",
                   f"{job.attempts} attempts, last error: {job.last_error}", extra)
        self._resolve()

    # Servers that go away, restart or change ----------------------------------------------
    def _idle(self, backend: Backend) -> bool:
        return (self.in_flight_by[backend.name] == 0 and isinstance(backend, HttpBackend)
                and time.monotonic() - self.last_exchange[backend.name] > IDLE_REPROBE_S)

    async def _still_same(self, backend: Backend) -> bool:
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
        self._suspect(backend, down=False)
        return False

    def _suspect(self, backend: Backend, *, down: bool) -> None:
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
            self.spawn(self._watch(backend))

    async def _watch(self, backend: Backend) -> None:
        name = backend.name
        delay = 0.5
        try:
            while not self.stopping:
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
                return (f"now serves {now.model!r}, not {was.model!r} (the model this run "
                        "started with)")
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
            self.fail(UserError(str(fatal)))
            return
        if name in self.wrong:
            del self.wrong[name]
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
            _ui.warn(f"{name}: {problem}; its slots stay paused (it is checked again every "
                     f"{HEALTH_POLL_MAX:g}s) and nothing more of it is stored")
        if len(self.wrong) == len(self.backends):
            names = "; ".join(f"{n}: {p}" for n, p in self.wrong.items())
            self.fail(UserError(
                f"no server left that serves this run's model ({names}). Restart them with "
                "the model the dataset was started with, or give other --server URLs"))

    async def check_identities(self, backend: Backend) -> None:
        """Every IDENTITY_CHECK_S, ask a server that is up which model it serves: a restart
        quick enough to fail no request is found this way."""
        while not self.stopping:
            await asyncio.sleep(IDENTITY_CHECK_S)
            if self.up[backend.name].is_set() and await self._changed(backend):
                self._suspect(backend, down=False)

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
        finally:
            self.feeding = False
            self._check_finished()

    async def committer(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self.writer.maybe_commit()
            self.progress.set(in_flight=self.in_flight)
            self._warn_stalled()

    def _warn_stalled(self) -> None:
        """A request with no answer for --stall-after: warn once for it, count it in the
        status line (with no --request-timeout nothing else would ever show it)."""
        now, limit = time.monotonic(), self.cfg.stall_after
        stalled = [r for r in self.running.values() if now - r.since >= limit]
        self.progress.set(stalled=len(stalled))
        fresh: dict[str, list[Running]] = {}
        for r in stalled:
            if not r.warned:
                r.warned = True
                fresh.setdefault(r.backend, []).append(r)
        timeout = self.cfg.request_timeout
        then = (f"they are given up and retried after --request-timeout {timeout:g}s"
                if timeout else "gen waits for them (no --request-timeout is set)")
        for server, found in fresh.items():
            oldest = max(now - r.since for r in found)
            _ui.warn(f"{server}: {len(found)} request(s) with no answer for over "
                     f"{_ui.duration(limit)} (the oldest for {_ui.duration(oldest)}, sample "
                     f"{found[0].sample_id}); {then}. Check the server")

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
        self.spawn(self.feed(starts))
        self.spawn(self.committer())
        for backend in self.backends:
            split = self.cfg.long_threshold is not None
            short = (self.cfg.short_concurrency or backend.slots) if split else backend.slots
            for _ in range(short):
                self.spawn(self.worker(backend, False))
            if split:
                for _ in range(self.cfg.long_concurrency or max(1, backend.slots // 4)):
                    self.spawn(self.worker(backend, True))
            if isinstance(backend, HttpBackend):
                self.spawn(self.check_identities(backend))
        try:
            await self.finished.wait()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            tasks = list(self.tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for task in tasks:  # a failure whose callback had not run yet still counts
                self._note_failure(task)


def resume_point(chain: Chain, done: set[str]) -> int:
    """The first turn of `chain` not yet in the dataset (len(ids) when all are)."""
    for turn, sample_id in enumerate(chain.ids):
        if sample_id not in done:
            return turn
    return len(chain.ids)


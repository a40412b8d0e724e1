"""A loopback SGLang / vLLM server with a deterministic model and switchable faults.

The "model" is a pure function of (prompt ids, seed, max tokens, stop ids, vocab size and the
length settings): `expected()` gives the exact ids and finish reason any request must get, so
a test can check every sample a client stored. Faults (5xx bursts, connection resets, hangs,
a server that dies and comes back, or comes back serving another model, 503 storms that
last a while, long-tail latencies, SGLang's prompt-prefix bug, wrong completion counts,
malformed token ids) are switched at runtime, by Python methods in-thread or by the control API
under `/_fake/` when the server runs as a subprocess. Every request received is recorded.

In a test::

    with FakeServer("sglang", slots=8) as srv:
        ...  # talk to srv.url
        srv.set_faults(fail_next=3, fail_status=503)
        ids, finish = srv.expected(prompt_ids, max_tokens=64, stop_token_ids=[258], seed=1)

As a process, the stand-in SGLang server the README's gen example talks to (its answers are
random tokens; `--tokenizer` is the tokenizer gen renders prompts with, which
`python examples/make_tiny.py --save-tokenizer qwen3-tokenizer` makes: without it the server
counts bytes and gen's tokenizer check refuses it). It says where it listens once it does::

    python testkit/fakeserver.py --api sglang --port 30000 --tokenizer qwen3-tokenizer

For crash tests and benchmarks, port 0 picks a free port and --port-file tells it (and keeps
the announcement out of their output)::

    python testkit/fakeserver.py --api vllm --port 0 --port-file /tmp/port --slots 64
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import math
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from aiohttp import web

APIS = ("sglang", "vllm")
GEN_PATHS = frozenset({"/generate", "/v1/completions", "/v1/chat/completions"})
DEFAULT_VOCAB = 1024
SGLANG_SAMPLING_KEYS = frozenset(
    {
        "max_new_tokens",
        "stop",
        "stop_token_ids",
        "stop_regex",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "min_new_tokens",
        "n",
        "json_schema",
        "regex",
        "ebnf",
        "structural_tag",
        "ignore_eos",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "no_stop_trim",
        "custom_params",
        "stream_interval",
        "logit_bias",
        "sampling_seed",
    }
)
_CHAT_ALPHABET = "abcdefghijklmnopqrstuvwxyz "


# Tokenizers -------------------------------------------------------------------------------
class ByteTokenizer:
    """Ids 0-255 are bytes, 256-260 five specials; higher ids decode to `<|tN|>`."""

    SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>")

    def __init__(self) -> None:
        self.special_ids = {s: 256 + i for i, s in enumerate(self.SPECIALS)}
        self.eos_token_id = self.special_ids["<|im_end|>"]
        self._split = re.compile("(" + "|".join(map(re.escape, self.SPECIALS)) + ")")
        self._names = [""] * 256 + list(self.SPECIALS) + [f"<|t{t}|>" for t in range(261, 4096)]

    def __len__(self) -> int:
        return 256 + len(self.SPECIALS)

    def token_id(self, token: str) -> int | None:
        return self.special_ids.get(token)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids: list[int] = []
        for part in self._split.split(text):
            if part in self.special_ids:
                ids.append(self.special_ids[part])
            elif part:
                ids.extend(part.encode())
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        out, buf, names = [], bytearray(), self._names
        for t in ids:
            if t < 256:
                buf.append(t)
                continue
            if buf:
                out.append(buf.decode(errors="replace"))
                buf.clear()
            out.append(names[t] if t < len(names) else f"<|t{t}|>")
        if buf:
            out.append(buf.decode(errors="replace"))
        return "".join(out)


class HFTokenizer:
    """A `tokenizers.Tokenizer` or a transformers tokenizer behind ByteTokenizer's methods."""

    EOS_NAMES = ("<|im_end|>", "<|end|>", "<|eot_id|>", "</s>", "<|endoftext|>")

    def __init__(self, tok: Any) -> None:
        self.tok = tok
        self._fast = hasattr(tok, "get_vocab_size")  # a bare `tokenizers.Tokenizer`
        eos = None if self._fast else getattr(tok, "eos_token_id", None)
        for name in self.EOS_NAMES:
            if eos is not None:
                break
            eos = self.token_id(name)
        self.eos_token_id = eos

    def __len__(self) -> int:
        return self.tok.get_vocab_size(with_added_tokens=True) if self._fast else len(self.tok)

    def token_id(self, token: str) -> int | None:
        if self._fast:
            return self.tok.token_to_id(token)
        tid = self.tok.convert_tokens_to_ids(token)
        return None if tid == getattr(self.tok, "unk_token_id", None) else tid

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if self._fast:
            return self.tok.encode(text, add_special_tokens=add_special_tokens).ids
        return self.tok.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids: Iterable[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=False)


def load_tokenizer(spec: Any) -> ByteTokenizer | HFTokenizer:
    """None: the byte tokenizer; a tokenizer.json file or an HF directory: that; or an object."""
    if spec is None:
        return ByteTokenizer()
    if isinstance(spec, (ByteTokenizer, HFTokenizer)):
        return spec
    if not isinstance(spec, (str, os.PathLike)):
        return HFTokenizer(spec)
    path = Path(spec)
    tok_file = path if path.is_file() else path / "tokenizer.json"
    if tok_file.is_file():
        from tokenizers import Tokenizer

        return HFTokenizer(Tokenizer.from_file(str(tok_file)))
    from transformers import AutoTokenizer

    return HFTokenizer(AutoTokenizer.from_pretrained(str(path)))


# The model --------------------------------------------------------------------------------
@dataclass(frozen=True)
class FakeModel:
    """Deterministic completions: lengths exponential around mean_tokens, with a long tail."""

    vocab_size: int = DEFAULT_VOCAB
    eos_token_id: int | None = ByteTokenizer().eos_token_id
    """Always stops generation, like a real EOS; None: only the requested stop ids do."""
    mean_tokens: float = 32.0
    long_tail: float = 0.0
    """Share of completions whose length is drawn around long_tokens instead."""
    long_tokens: float = 2048.0
    variant: str = ""
    """Another model: the same requests get other completions (empty: the default model)."""

    def natural_length(self, prompt_ids: Sequence[int], seed: int | None = None) -> int:
        """Tokens the model wants to produce, stop token included, before any max_tokens cut."""
        u, v = self._rng(prompt_ids, seed).random(2)
        mean = self.long_tokens if u < self.long_tail else self.mean_tokens
        return 1 + int(-math.log1p(-v) * mean)

    def generate(
        self,
        prompt_ids: Sequence[int],
        *,
        max_tokens: int,
        stop_token_ids: Iterable[int] = (),
        seed: int | None = None,
    ) -> tuple[list[int], str]:
        """(completion ids, "stop" | "length"): ids end in a stop token iff finish is stop."""
        stops = sorted(
            {*stop_token_ids, *(() if self.eos_token_id is None else (self.eos_token_id,))}
        )
        rng = self._rng(prompt_ids, seed)
        u, v, pick = rng.random(3)
        natural = 1 + int(
            -math.log1p(-v) * (self.long_tokens if u < self.long_tail else self.mean_tokens)
        )
        body_len = max(0, min(natural - 1, max_tokens) if stops else max_tokens)
        body = rng.integers(0, self.vocab_size, body_len, dtype=np.int64)
        if stops:
            clash = np.isin(body, stops)
            while clash.any():
                body[clash] = (body[clash] + 1) % self.vocab_size
                clash = np.isin(body, stops)
        ids = body.tolist()
        if stops and natural <= max_tokens:
            ids.append(stops[int(pick * len(stops))])
            return ids, "stop"
        return ids, "length"

    def _rng(self, prompt_ids: Sequence[int], seed: int | None) -> np.random.Generator:
        h = hashlib.blake2b(digest_size=16)
        h.update(np.asarray(prompt_ids, dtype="<i8").tobytes())
        h.update(f"|seed={seed}|vocab={self.vocab_size}".encode())
        if self.variant:
            h.update(f"|model={self.variant}".encode())
        return np.random.Generator(np.random.PCG64(int.from_bytes(h.digest(), "little")))


def expected(
    prompt_ids: Sequence[int],
    *,
    max_tokens: int,
    stop_token_ids: Iterable[int] = (),
    seed: int | None = None,
    **model: Any,
) -> tuple[list[int], str]:
    """What a server built with the same model settings answers: (ids, finish_reason)."""
    return FakeModel(**model).generate(
        prompt_ids, max_tokens=max_tokens, stop_token_ids=stop_token_ids, seed=seed
    )


def render_chat(messages: Sequence[dict[str, Any]]) -> str:
    """The fake's chat template: ChatML with a generation prompt."""
    parts = []
    for m in messages:
        content = m.get("content") or ""
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        parts.append(f"<|im_start|>{m.get('role', 'user')}\n{content}<|im_end|>\n")
    return "".join(parts) + "<|im_start|>assistant\n"


def chat_texts(ids: Sequence[int], finish: str) -> tuple[str, str]:
    """Split a completion into (reasoning, content) text, as a reasoning parser would."""
    body = ids[:-1] if finish == "stop" else ids
    letters = "".join(_CHAT_ALPHABET[t % len(_CHAT_ALPHABET)] for t in body)
    cut = len(letters) // 2
    return letters[:cut], letters[cut:]


# Faults -----------------------------------------------------------------------------------
@dataclass
class Faults:
    """Switches for misbehaviour; `*_next` counts down per generation request, `*_rate` draws."""

    fail_next: int = 0
    fail_rate: float = 0.0
    fail_status: int = 503
    fail_message: str = "fake server fault"
    reset_next: int = 0
    """Close the connection with a TCP reset instead of answering."""
    reset_rate: float = 0.0
    reset_mid_body: bool = False
    """Reset after sending the headers and half the body, instead of before any answer."""
    hang_next: int = 0
    """Accept, then say nothing for hang_s seconds (then answer normally)."""
    hang_rate: float = 0.0
    hang_s: float = 30.0
    latency_s: float = 0.0
    """Added to every generation, before it takes a slot."""
    slow_rate: float = 0.0
    """Long-tail latency: this share of generations waits slow_s more."""
    slow_s: float = 0.0
    prefix_bug: int = 0
    """SGLang 0.5.x bug: prepend this many trailing prompt ids to output_ids."""
    prefix_bug_rate: float = 1.0
    count_delta: int = 0
    """Added to the reported completion_tokens."""
    count_delta_rate: float = 1.0
    abort_next: int = 0
    """200 with a server-side failure: SGLang abort with status 503, vLLM finish_reason error."""
    abort_rate: float = 0.0
    storm_s: float = 0.0
    """Setting it starts a storm: every generation fails with fail_status for this many
    seconds from then on, while /health keeps answering health_status."""
    bad_ids_next: int = 0
    """Put one malformed id into the answer's ids (kind bad_ids_kind)."""
    bad_ids_rate: float = 0.0
    bad_ids_kind: str = "negative"
    """negative, huge (past int32), float, string, null, or mix (each of those in turn,
    starting at the seed's)."""
    health_status: int = 200
    seed: int = 0


BAD_ID_KINDS = ("negative", "huge", "float", "string", "null")


def bad_id(kind: str, n: int) -> tuple[str, Any]:
    """(kind, a malformed token id of that kind) for the n-th one; "mix" takes each of
    BAD_ID_KINDS in turn."""
    if kind == "mix":
        kind = BAD_ID_KINDS[n % len(BAD_ID_KINDS)]
    return kind, {
        "negative": -7,
        "huge": (1 << 31) + 5,
        "float": 17.0,
        "string": "17",
        "null": None,
    }[kind]


# The server -------------------------------------------------------------------------------
class _Live:
    """One generation in progress; /abort_request sets its event."""

    def __init__(self) -> None:
        self.aborted = asyncio.Event()


class FakeServer:
    """Loopback SGLang or vLLM server; a context manager runs it in a background thread.

        api: "sglang" or "vllm" (the endpoints each serves are in `_routes`). port 0 picks a free
        one; `die()` / `revive()` keep it. context_length: prompt + max tokens beyond it is a 400
        in the server's own wording (vllm_wording "new" or "old"). slots: generations decoding at
        once (the rest wait); decode_tps: tokens/s per generation, 0 = instant. vocab_size,
        eos_token_id (-1: the tokenizer's; None: no implicit stop), mean_tokens, long_tail,
        long_tokens: the model (see FakeModel). tokenizer: None (ByteTokenizer), a tokenizer.json
        or HF directory, or a tokenizer object; used by /tokenize, `text` and chat.
        reasoning_field: where chat puts reasoning ("reasoning", "reasoning_content", "both",
        anything else: nowhere). api_key: required as a bearer token except on /health (there too
    with health_needs_key). A model_name other than the default gives other completions.
        speculative: SGLang reports EAGLE3 and spec_* counters. sglang_info_paths: "both", "old"
        (/get_model_info, /get_server_info) or "new" (/model_info, /server_info). keepalive_timeout:
        idle connections closed after it (5 s, as both servers do). record_bodies, record_file:
        what `requests` keeps, and a JSON-lines copy that survives the process. faults: a Faults.
    """

    def __init__(
        self,
        api: str = "sglang",
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        model_name: str = "fake/model",
        context_length: int = 4096,
        slots: int = 256,
        decode_tps: float = 0.0,
        vocab_size: int | None = None,
        eos_token_id: int | None = -1,
        mean_tokens: float = 32.0,
        long_tail: float = 0.0,
        long_tokens: float = 2048.0,
        tokenizer: Any = None,
        reasoning_field: str | None = None,
        api_key: str | None = None,
        health_needs_key: bool = False,
        speculative: bool = False,
        version: str | None = None,
        vllm_wording: str = "new",
        sglang_info_paths: str = "both",
        keepalive_timeout: float = 5.0,
        record_bodies: bool = True,
        record_file: str | os.PathLike | None = None,
        faults: Faults | dict | None = None,
    ) -> None:
        if api not in APIS:
            raise ValueError(f"api must be one of {APIS}, not {api!r}")
        self.api = api
        self.host = host
        self.port = port
        self.model_name = model_name
        self.context_length = context_length
        self.slots = slots
        self.decode_tps = decode_tps
        self.tokenizer = load_tokenizer(tokenizer)
        self.model = FakeModel(
            vocab_size=vocab_size
            or max(len(self.tokenizer), DEFAULT_VOCAB if tokenizer is None else 0),
            eos_token_id=self.tokenizer.eos_token_id if eos_token_id == -1 else eos_token_id,
            mean_tokens=mean_tokens,
            long_tail=long_tail,
            long_tokens=long_tokens,
            variant=_variant(model_name),
        )
        self.reasoning_field = reasoning_field or (
            "reasoning_content" if api == "sglang" else "reasoning"
        )
        self.api_key = api_key
        self.health_needs_key = health_needs_key
        self.speculative = speculative
        self.version = version or ("0.5.4" if api == "sglang" else "0.11.0")
        self.vllm_wording = vllm_wording
        self.sglang_info_paths = sglang_info_paths
        self.keepalive_timeout = keepalive_timeout
        self.record_bodies = record_bodies
        self.record_file = Path(record_file) if record_file else None
        self.faults = Faults(**faults) if isinstance(faults, dict) else (faults or Faults())
        self._fault_rng = random.Random(self.faults.seed)
        self._storm_end = time.monotonic() + self.faults.storm_s
        self._bad_ids_sent = self.faults.seed  # where "mix" starts its round of kinds
        self._lock = threading.Lock()
        self._records: list[dict[str, Any]] = []
        self._live: dict[str, _Live] = {}
        self._inflight: set[asyncio.Task] = set()
        self._in_slot = 0
        self._waiting = 0
        self.max_in_flight = 0
        self.generated_tokens = 0
        self.restarts = 0
        self.down = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self._stop_requested = False
        self._stop_event: asyncio.Event | None = None

    # Public, synchronous API (safe from any thread) ---------------------------------------
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def expected(
        self,
        prompt_ids: Sequence[int],
        *,
        max_tokens: int,
        stop_token_ids: Iterable[int] = (),
        seed: int | None = None,
    ) -> tuple[list[int], str]:
        """The ids and finish reason this server's model gives for a request."""
        return self.model.generate(
            prompt_ids, max_tokens=max_tokens, stop_token_ids=stop_token_ids, seed=seed
        )

    def expected_chat(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        max_tokens: int,
        stop_token_ids: Iterable[int] = (),
        seed: int | None = None,
    ) -> tuple[str, str, str]:
        """(reasoning, content, finish_reason) of /v1/chat/completions for these messages."""
        prompt = self.tokenizer.encode(render_chat(messages))
        ids, finish = self.expected(
            prompt, max_tokens=max(0, max_tokens - 2), stop_token_ids=stop_token_ids, seed=seed
        )
        return (*chat_texts(ids, finish), finish)

    def set_faults(self, **changes: Any) -> Faults:
        """Change some fault switches (others keep their values); returns the new set."""
        with self._lock:
            self.faults = replace(self.faults, **changes)
            if "seed" in changes:
                self._fault_rng = random.Random(self.faults.seed)
            if "storm_s" in changes:
                self._storm_end = time.monotonic() + self.faults.storm_s
            return self.faults

    def clear_faults(self) -> None:
        with self._lock:
            self.faults = Faults()
            self._fault_rng = random.Random(self.faults.seed)
            self._storm_end = 0.0

    @property
    def requests(self) -> list[dict[str, Any]]:
        """Every request received so far (control API excluded), oldest first."""
        with self._lock:
            return [dict(r) for r in self._records]

    def clear_requests(self) -> None:
        with self._lock:
            self._records.clear()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            outcomes: dict[str, int] = {}
            for r in self._records:
                outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
            return {
                "received": len(self._records),
                "outcomes": outcomes,
                "in_flight": self._in_slot,
                "waiting": self._waiting,
                "max_in_flight": self.max_in_flight,
                "generated_tokens": self.generated_tokens,
                "restarts": self.restarts,
                "down": self.down,
            }

    def die(self, down_s: float | None = None) -> None:
        """Stop listening and drop every connection; listen again after down_s (None: revive())."""
        self._call(self._adie(down_s))

    def revive(self) -> None:
        self._call(self._alisten())

    def restart(self, down_s: float = 0.5, *, model_name: str | None = None) -> None:
        """Die and listen again after down_s, as a restarted server does; with model_name,
        serving that model (other completions, another name in /v1/models)."""
        self._call(self._adie(None))
        if model_name is not None:
            self.model_name = model_name
            self.model = replace(self.model, variant=_variant(model_name))
        time.sleep(down_s)
        self.revive()

    def start(self, timeout: float = 30.0) -> FakeServer:
        self._thread = threading.Thread(target=lambda: asyncio.run(self.serve()), daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError("fake server did not start")
        if self._start_error is not None:
            raise self._start_error
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self.request_stop)
            self._thread.join(10)

    def request_stop(self) -> None:
        """From inside the server's loop (signal handlers): make serve() return."""
        self._stop_requested = True
        if self._stop_event is not None:
            self._stop_event.set()

    def __enter__(self) -> FakeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _call(self, coro: Any) -> Any:
        assert self._loop is not None, "server not started"
        with contextlib.suppress(RuntimeError):
            if asyncio.get_running_loop() is self._loop:
                return self._loop.create_task(coro)
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    # Lifecycle (inside the loop) ----------------------------------------------------------
    async def serve(self, port_file: str | os.PathLike | None = None, on_ready: Any = None) -> None:
        """Run until stop(): listen, write the port to port_file (atomically), call
        on_ready(), serve."""
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        self._slot_sem = asyncio.Semaphore(self.slots)
        try:
            app = web.Application(client_max_size=1 << 30)
            app.router.add_route("*", "/{tail:.*}", self._dispatch)
            self._runner = web.AppRunner(
                app,
                handler_cancellation=True,
                access_log=None,
                shutdown_timeout=0.2,
                keepalive_timeout=self.keepalive_timeout,
            )
            await self._runner.setup()
            await self._alisten()
        except BaseException as e:
            self._start_error = e
            self._ready.set()
            raise
        if port_file is not None:
            tmp = Path(f"{port_file}.tmp")
            tmp.write_text(str(self.port))
            tmp.replace(port_file)
        self._ready.set()
        if on_ready is not None:
            on_ready()
        if not self._stop_requested:
            await self._stop_event.wait()
        for task in list(self._inflight):
            task.cancel()
        await self._runner.cleanup()

    async def _alisten(self) -> None:
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        if self.port == 0:
            self.port = self._runner.addresses[0][1]
        elif self.down:
            self.restarts += 1
        self.down = False

    async def _adie(self, down_s: float | None) -> None:
        self.down = True
        for site in list(self._runner.sites):
            await site.stop()
        for handler in self._runner.server.connections:
            if handler.transport is not None:
                _hard_close(handler.transport)
        for task in list(self._inflight):
            task.cancel()
        if down_s is not None:
            self._loop.call_later(down_s, lambda: self._loop.create_task(self._alisten()))

    # Request handling ---------------------------------------------------------------------
    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if path.startswith("/_fake/"):
            return await self._control(request, path)
        raw = await request.read() if request.can_read_body else b""
        try:
            body = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            body = None
        rec = self._record(request, body)
        task = asyncio.current_task()
        self._inflight.add(task)
        try:
            resp = await self._handle(request, path, body, rec)
            rec["status"] = resp.status
            if rec["outcome"] == "pending":
                rec["outcome"] = "ok" if resp.status < 400 else f"http_{resp.status}"
            return resp
        except asyncio.CancelledError:
            if rec["outcome"] == "pending":
                rec["outcome"] = "cancelled"
            raise
        finally:
            rec["t_finished"] = time.monotonic()
            self._inflight.discard(task)
            self._log(rec)

    async def _handle(
        self, request: web.Request, path: str, body: Any, rec: dict
    ) -> web.StreamResponse:
        authorized = self.api_key is None or (
            request.headers.get("Authorization") == f"Bearer {self.api_key}"
        )
        if path == "/health":
            if self.health_needs_key and not authorized:
                return _json({"error": "Unauthorized"}, 401)
            return web.Response(status=self.faults.health_status)
        if not authorized:
            return _json({"error": "Unauthorized"}, 401)
        route = self._routes().get((request.method, path))
        if route is None:
            return _json({"detail": "Not Found"}, 404)
        if request.method == "POST" and not isinstance(body, dict):
            return self._error(400, "request body is not a JSON object")
        if path in GEN_PATHS:
            fault = await self._faults_before(request, rec)
            if fault is not None:
                return fault
        return await route(request, body, rec)

    def _routes(self) -> dict[tuple[str, str], Any]:
        common = {
            ("GET", "/v1/models"): self._models,
            ("POST", "/tokenize"): self._tokenize,
            ("POST", "/v1/chat/completions"): self._chat,
        }
        if self.api == "vllm":
            return {
                **common,
                ("POST", "/v1/completions"): self._vllm_completions,
                ("GET", "/version"): self._version,
            }
        routes = {
            **common,
            ("POST", "/generate"): self._sglang_generate,
            ("POST", "/abort_request"): self._abort_request,
        }
        if self.sglang_info_paths in ("both", "old"):
            routes[("GET", "/get_model_info")] = self._model_info
            routes[("GET", "/get_server_info")] = self._server_info
        if self.sglang_info_paths in ("both", "new"):
            routes[("GET", "/model_info")] = self._model_info
            routes[("GET", "/server_info")] = self._server_info
        return routes

    def _record(self, request: web.Request, body: Any) -> dict[str, Any]:
        rec = {
            "i": 0,
            "method": request.method,
            "path": request.path,
            "body": body if self.record_bodies else None,
            "authorization": request.headers.get("Authorization"),
            "request_id": request.headers.get("X-Request-Id"),
            "rid": body.get("rid") if isinstance(body, dict) else None,
            "t_received": time.monotonic(),
            "t_started": None,
            "t_finished": None,
            "status": None,
            "outcome": "pending",
        }
        with self._lock:
            rec["i"] = len(self._records)
            self._records.append(rec)
        return rec

    def _log(self, rec: dict[str, Any]) -> None:
        if self.record_file is not None:
            with open(self.record_file, "ab") as f:
                f.write(orjson.dumps(rec) + b"\n")

    def _draw(self, name: str) -> bool:
        with self._lock:
            f = self.faults
            left = getattr(f, f"{name}_next")
            if left > 0:
                setattr(f, f"{name}_next", left - 1)
                return True
            rate = getattr(f, f"{name}_rate")
            return rate > 0 and self._fault_rng.random() < rate

    def _rate(self, rate: float) -> bool:
        with self._lock:
            return rate >= 1 or (rate > 0 and self._fault_rng.random() < rate)

    async def _faults_before(self, request: web.Request, rec: dict) -> web.StreamResponse | None:
        f = self.faults
        if time.monotonic() < self._storm_end:
            rec["outcome"] = "fault_storm"
            return self._error(f.fail_status, f"{f.fail_message} (storm)")
        if self._draw("fail"):
            rec["outcome"] = f"fault_{f.fail_status}"
            return self._error(f.fail_status, f.fail_message)
        if not f.reset_mid_body and self._draw("reset"):
            rec["outcome"] = "reset"
            _hard_close(request.transport)
            await asyncio.sleep(3600)  # the lost connection cancels this handler
        if self._draw("hang"):
            rec["outcome"] = "hang"
            await asyncio.sleep(f.hang_s)
        delay = f.latency_s + (f.slow_s if self._rate(f.slow_rate) else 0.0)
        if delay > 0:
            await asyncio.sleep(delay)
        return None

    async def _decode(self, rec: dict, n_tokens: int, live: _Live | None = None) -> int:
        """Hold a slot for n_tokens at decode_tps; returns the tokens produced (less if aborted)."""
        self._waiting += 1
        try:
            await self._slot_sem.acquire()
        finally:
            self._waiting -= 1
        try:
            self._in_slot += 1
            self.max_in_flight = max(self.max_in_flight, self._in_slot)
            rec["t_started"] = time.monotonic()
            done = n_tokens
            if live is not None and live.aborted.is_set():
                done = 0
            elif self.decode_tps > 0 and n_tokens:
                t0 = time.monotonic()
                if live is None:
                    await asyncio.sleep(n_tokens / self.decode_tps)
                else:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(live.aborted.wait(), n_tokens / self.decode_tps)
                    if live.aborted.is_set():
                        done = min(n_tokens, int((time.monotonic() - t0) * self.decode_tps))
            self.generated_tokens += done
            return done
        finally:
            self._in_slot -= 1
            self._slot_sem.release()

    async def _send(self, request: web.Request, payload: Any, rec: dict) -> web.StreamResponse:
        body = orjson.dumps(payload)
        if not (self.faults.reset_mid_body and self._draw("reset")):
            return web.Response(body=body, content_type="application/json")
        rec["outcome"] = "reset"
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        resp.content_length = len(body)
        await resp.prepare(request)
        await resp.write(body[: len(body) // 2])
        _hard_close(request.transport)
        await asyncio.sleep(3600)
        return resp

    def _error(self, status: int, message: str) -> web.Response:
        if self.api == "sglang":
            return _json({"error": {"message": message}}, status)
        kind = {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")
        return _json(
            {"object": "error", "message": message, "type": kind, "param": None, "code": status},
            status,
        )

    def _context_error(self, n_prompt: int, max_tokens: int) -> web.Response | None:
        """The 400 SGLang or vLLM sends when prompt + max tokens exceed the context length."""
        ctx, total = self.context_length, n_prompt + max_tokens
        if total <= ctx and n_prompt < ctx:
            return None
        if self.api == "sglang" and n_prompt >= ctx:
            msg = (
                f"The input ({n_prompt} tokens) is longer than the model's context length "
                f"({ctx} tokens)."
            )
        elif self.api == "sglang":
            msg = (
                "Requested token count exceeds the model's maximum context length of "
                f"{ctx} tokens. You requested a total of {total} tokens: {n_prompt} tokens "
                f"from the input messages and {max_tokens} tokens for the completion. Please "
                "reduce the number of tokens in the input messages or the completion to fit "
                "within the limit."
            )
        elif self.vllm_wording == "old":
            msg = (
                f"This model's maximum context length is {ctx} tokens. However, you requested "
                f"{total} tokens ({n_prompt} in the messages, {max_tokens} in the completion). "
                "Please reduce the length of the messages or completion."
            )
        elif n_prompt >= ctx:
            msg = (
                f"This model's maximum context length is {ctx} tokens. However, your request "
                f"has {n_prompt} input tokens. Please reduce the length of the input messages."
            )
        else:
            msg = (
                f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This "
                f"model's maximum context length is {ctx} tokens and your request has "
                f"{n_prompt} input tokens ({max_tokens} > {ctx} - {n_prompt})."
            )
        return self._error(400, msg)

    def _bad_ids(self, ids: Any) -> str | None:
        if not isinstance(ids, list) or not ids or not all(type(t) is int for t in ids):
            return "input_ids must be a non-empty list of token ids"
        if min(ids) < 0 or max(ids) >= self.model.vocab_size:
            return f"input_ids out of vocabulary range [0, {self.model.vocab_size})"
        return None

    def _maybe_bad_ids(self, ids: list[int], rec: dict) -> list[Any]:
        """The answer's ids, one of them malformed when the bad_ids fault draws."""
        if not ids or not self._draw("bad_ids"):
            return ids
        with self._lock:
            at = self._fault_rng.randrange(len(ids))
            kind, value = bad_id(self.faults.bad_ids_kind, self._bad_ids_sent)
            self._bad_ids_sent += 1
        rec["outcome"], rec["bad_id"] = "fault_bad_ids", kind
        return [*ids[:at], value, *ids[at + 1 :]]

    def _spec(self, n: int) -> dict[str, Any]:
        if not self.speculative or n == 0:
            return {}
        verify = math.ceil(n / 3)
        return {"spec_verify_ct": verify, "spec_accept_length": n / verify}

    # SGLang -------------------------------------------------------------------------------
    async def _sglang_generate(
        self, request: web.Request, body: dict, rec: dict
    ) -> web.StreamResponse:
        ids = body.get("input_ids")
        if (err := self._bad_ids(ids)) is not None:
            return self._error(400, err)
        sp = body.get("sampling_params") or {}
        unknown = sorted(set(sp) - SGLANG_SAMPLING_KEYS)
        if unknown:
            return self._error(
                400, f"SamplingParams.__init__() got an unexpected keyword argument '{unknown[0]}'"
            )
        max_new = sp.get("max_new_tokens", 128)
        if (err := self._context_error(len(ids), max_new)) is not None:
            return err
        rid = body.get("rid") or uuid.uuid4().hex
        if rid in self._live:
            return self._error(400, f"Duplicate request ID: {rid}")
        t0 = time.monotonic()
        out, finish = self.model.generate(
            ids,
            max_tokens=max_new,
            stop_token_ids=sp.get("stop_token_ids") or (),
            seed=sp.get("sampling_seed"),
        )
        live = self._live[rid] = _Live()
        try:
            done = await self._decode(rec, len(out), live)
        finally:
            del self._live[rid]
        if done < len(out):
            out = out[:done]
            reason: dict[str, Any] = {
                "type": "abort",
                "message": "Abort in waiting queue" if not done else "Abort",
            }
            rec["outcome"] = "aborted"
        elif finish == "stop":
            reason = {"type": "stop", "matched": out[-1]}
        else:
            reason = {"type": "length", "length": max_new}
        n = len(out)
        if self._draw("abort"):
            reason = {
                "type": "abort",
                "message": "fake abort",
                "status_code": 503,
                "err_type": None,
            }
            rec["outcome"] = "fault_abort"
        output_ids = out
        if self.faults.prefix_bug and self._rate(self.faults.prefix_bug_rate):
            output_ids = ids[-self.faults.prefix_bug :] + out
        output_ids = self._maybe_bad_ids(output_ids, rec)
        meta = {
            "id": rid,
            "finish_reason": reason,
            "prompt_tokens": len(ids),
            "completion_tokens": n
            + (self.faults.count_delta if self._rate(self.faults.count_delta_rate) else 0),
            "cached_tokens": 0,
            "e2e_latency": time.monotonic() - t0,
            **self._spec(n),
        }
        return await self._send(
            request,
            {"text": self.tokenizer.decode(out), "output_ids": output_ids, "meta_info": meta},
            rec,
        )

    async def _abort_request(self, request: web.Request, body: dict, rec: dict) -> web.Response:
        rids = list(self._live) if body.get("abort_all") else [body.get("rid")]
        for rid in rids:
            if rid in self._live:
                self._live[rid].aborted.set()
        return web.Response()

    async def _model_info(self, request: web.Request, body: Any, rec: dict) -> web.Response:
        return _json(
            {
                "model_path": self.model_name,
                "tokenizer_path": self.model_name,
                "is_generation": True,
                "weight_version": "default",
            }
        )

    async def _server_info(self, request: web.Request, body: Any, rec: dict) -> web.Response:
        spec = "EAGLE3" if self.speculative else None
        return _json(
            {
                "model_path": self.model_name,
                "context_length": None,
                "speculative_algorithm": spec,
                "speculative_num_steps": 3 if spec else None,
                "speculative_eagle_topk": 1 if spec else None,
                "speculative_num_draft_tokens": 4 if spec else None,
                "reasoning_parser": None,
                "max_req_input_len": self.context_length - 1,
                "internal_states": [{"avg_spec_accept_length": 3.0} if spec else {}],
                "version": self.version,
            }
        )

    # vLLM ---------------------------------------------------------------------------------
    def _model_error(self, body: dict) -> web.Response | None:
        model = body.get("model")
        if model is None or model == self.model_name:
            return None
        return self._error(404, f"The model `{model}` does not exist.")

    async def _vllm_completions(
        self, request: web.Request, body: dict, rec: dict
    ) -> web.StreamResponse:
        if (err := self._model_error(body)) is not None:
            return err
        prompt = body.get("prompt")
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
        if (err := self._bad_ids(ids)) is not None:
            return self._error(400, err)
        max_tokens = body.get("max_tokens", 16)
        if max_tokens is None:
            max_tokens = self.context_length - len(ids)
        if (err := self._context_error(len(ids), max_tokens)) is not None:
            return err
        out, finish = self.model.generate(
            ids,
            max_tokens=max_tokens,
            stop_token_ids=body.get("stop_token_ids") or (),
            seed=body.get("seed"),
        )
        await self._decode(rec, len(out))
        stop_reason = out[-1] if finish == "stop" and out[-1] != self.model.eos_token_id else None
        if self._draw("abort"):
            finish, stop_reason = "error", None
            rec["outcome"] = "fault_error"
        choice: dict[str, Any] = {
            "index": 0,
            "text": self.tokenizer.decode(out),
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": stop_reason,
            "prompt_logprobs": None,
        }
        if body.get("return_token_ids"):
            choice["token_ids"] = self._maybe_bad_ids(out, rec)
            choice["prompt_token_ids"] = ids
        n = len(out) + (self.faults.count_delta if self._rate(self.faults.count_delta_rate) else 0)
        return await self._send(
            request,
            {
                "id": f"cmpl-{uuid.uuid4().hex}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": self.model_name,
                "choices": [choice],
                "usage": {
                    "prompt_tokens": len(ids),
                    "completion_tokens": n,
                    "total_tokens": len(ids) + n,
                    "prompt_tokens_details": None,
                },
            },
            rec,
        )

    async def _version(self, request: web.Request, body: Any, rec: dict) -> web.Response:
        return _json({"version": self.version})

    # Both ---------------------------------------------------------------------------------
    async def _models(self, request: web.Request, body: Any, rec: dict) -> web.Response:
        card = {
            "id": self.model_name,
            "object": "model",
            "created": 0,
            "owned_by": self.api,
            "root": self.model_name,
            "max_model_len": self.context_length,
        }
        if self.api == "vllm":
            card.update(parent=None, permission=[])
        return _json({"object": "list", "data": [card]})

    async def _tokenize(self, request: web.Request, body: dict, rec: dict) -> web.Response:
        if self.api == "vllm" and (err := self._model_error(body)) is not None:
            return err
        if "messages" in body:
            text, default_special = render_chat(body["messages"]), False
        else:
            text, default_special = body.get("prompt", ""), True
        tokens = self.tokenizer.encode(
            text, add_special_tokens=body.get("add_special_tokens", default_special)
        )
        return _json({"tokens": tokens, "count": len(tokens), "max_model_len": self.context_length})

    async def _chat(self, request: web.Request, body: dict, rec: dict) -> web.StreamResponse:
        if self.api == "vllm" and (err := self._model_error(body)) is not None:
            return err
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return self._error(400, "messages must be a non-empty list")
        ids = self.tokenizer.encode(render_chat(messages))
        max_tokens = (
            body.get("max_completion_tokens")
            or body.get("max_tokens")
            or self.context_length - len(ids)
        )
        if (err := self._context_error(len(ids), max_tokens)) is not None:
            return err
        # The two think tokens count against max_tokens, so a cut answer has exactly that many.
        out, finish = self.model.generate(
            ids,
            max_tokens=max(0, max_tokens - 2),
            stop_token_ids=body.get("stop_token_ids") or (),
            seed=body.get("seed"),
        )
        await self._decode(rec, len(out))
        reasoning, content = chat_texts(out, finish)
        n = len(self.tokenizer.encode(f"<think>{reasoning}</think>{content}")) + (finish == "stop")
        n += self.faults.count_delta if self._rate(self.faults.count_delta_rate) else 0
        message: dict[str, Any] = {"role": "assistant", "content": content, "tool_calls": []}
        for name in ("reasoning", "reasoning_content"):
            if self.reasoning_field in (name, "both"):
                message[name] = reasoning
        stop_reason = out[-1] if finish == "stop" and out[-1] != self.model.eos_token_id else None
        return await self._send(
            request,
            {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.model_name,
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "logprobs": None,
                        "finish_reason": finish,
                        "stop_reason": stop_reason,
                    }
                ],
                "usage": {
                    "prompt_tokens": len(ids),
                    "completion_tokens": n,
                    "total_tokens": len(ids) + n,
                },
            },
            rec,
        )

    # Control API (for a server in another process) ----------------------------------------
    async def _control(self, request: web.Request, path: str) -> web.Response:
        body = orjson.loads(await request.read() or b"{}")
        if path == "/_fake/faults":
            if request.method == "POST":
                self.set_faults(**body)
            return _json(asdict(self.faults))
        if path == "/_fake/faults/clear":
            self.clear_faults()
            return _json(asdict(self.faults))
        if path == "/_fake/requests":
            if request.method == "DELETE":
                self.clear_requests()
            return _json(self.requests)
        if path == "/_fake/stats":
            return _json(self.stats())
        if path == "/_fake/die":
            self._loop.call_soon(lambda: self._loop.create_task(self._adie(body.get("down_s"))))
            return _json({"down_s": body.get("down_s")})
        return _json({"detail": "Not Found"}, 404)


def _variant(model_name: str) -> str:
    return "" if model_name == "fake/model" else model_name


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type="application/json")


def _hard_close(transport: Any) -> None:
    """Close a connection with a TCP reset (SO_LINGER 0), as a crashing server would."""
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


# Subprocess mode --------------------------------------------------------------------------
class FakeServerProcess:
    """The fake server in a child process: start, SIGKILL, restart on the same port, control."""

    def __init__(
        self, api: str = "sglang", *, port: int = 0, faults: dict | None = None, **options: Any
    ):
        self.api = api
        self.port = port
        self.faults = faults
        self.options = options
        self.proc: subprocess.Popen | None = None
        self._dir = tempfile.mkdtemp(prefix="fakeserver-")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> FakeServerProcess:
        port_file = Path(self._dir, "port")
        port_file.unlink(missing_ok=True)
        argv = [
            sys.executable,
            __file__,
            "--api",
            self.api,
            "--port",
            str(self.port),
            "--port-file",
            str(port_file),
        ]
        for key, value in self.options.items():
            if key == "eos_token_id" and value is None:
                value = "none"
            if value is None or value is False:
                continue
            argv.append("--" + key.replace("_", "-"))
            if value is not True:
                argv.append(str(value))
        if self.faults:
            argv += ["--faults", orjson.dumps(self.faults).decode()]
        self.proc = subprocess.Popen(argv)
        deadline = time.monotonic() + timeout
        while not port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"fake server process did not start: {argv}")
            time.sleep(0.02)
        self.port = int(port_file.read_text())
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def restart(self, **options: Any) -> FakeServerProcess:
        """SIGKILL and start again on the same port; options change the new server's
        (model_name="other" makes it serve another model)."""
        self.kill()
        self.options.update(options)
        return self.start()

    def control(self, path: str, payload: Any = None, method: str | None = None) -> Any:
        data = None if payload is None else orjson.dumps(payload)
        req = urllib.request.Request(f"{self.url}/_fake/{path}", data=data, method=method)
        with urllib.request.urlopen(req, timeout=10) as resp:
            return orjson.loads(resp.read())

    def set_faults(self, **changes: Any) -> dict:
        return self.control("faults", changes)

    def requests(self) -> list[dict]:
        return self.control("requests")

    def die(self, down_s: float | None = None) -> None:
        self.control("die", {"down_s": down_s})

    def __enter__(self) -> FakeServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.terminate()
        shutil.rmtree(self._dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--api", choices=APIS, default="sglang")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--port-file")
    p.add_argument("--model-name", default="fake/model")
    p.add_argument("--context-length", type=int, default=4096)
    p.add_argument("--slots", type=int, default=256)
    p.add_argument("--decode-tps", type=float, default=0.0)
    p.add_argument("--vocab-size", type=int)
    p.add_argument(
        "--eos-token-id",
        type=lambda v: None if v == "none" else int(v),
        default=-1,
        help="-1: the tokenizer's EOS; none: stop only on the requested ids",
    )
    p.add_argument("--mean-tokens", type=float, default=32.0)
    p.add_argument("--long-tail", type=float, default=0.0)
    p.add_argument("--long-tokens", type=float, default=2048.0)
    p.add_argument("--tokenizer")
    p.add_argument("--reasoning-field", choices=("reasoning", "reasoning_content", "both", "none"))
    p.add_argument("--api-key")
    p.add_argument("--health-needs-key", action="store_true")
    p.add_argument("--speculative", action="store_true")
    p.add_argument("--version")
    p.add_argument("--vllm-wording", choices=("new", "old"), default="new")
    p.add_argument("--keepalive-timeout", type=float, default=5.0)
    p.add_argument("--no-record-bodies", dest="record_bodies", action="store_false")
    p.add_argument("--record-file")
    p.add_argument("--faults", type=orjson.loads, default=None, help="JSON object of Faults fields")
    args = vars(p.parse_args(argv))
    port_file = args.pop("port_file")
    api = args.pop("api")
    srv = FakeServer(api, **args)

    def announce() -> None:
        # For the person who started it (README): where gen should point. Scripts that pass
        # --port-file read the port from there instead.
        tokenizer = args["tokenizer"] or "none: byte ids, for tests that need no real one"
        print(
            f"fakeserver: {api} API on http://{srv.host}:{srv.port} (random tokens; "
            f"tokenizer {tokenizer}); Ctrl-C stops it",
            file=sys.stderr,
            flush=True,
        )

    async def run() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, srv.request_stop)
        await srv.serve(port_file, on_ready=None if port_file else announce)

    try:
        asyncio.run(run())
    except OSError as exc:  # the port is taken, or the address is not this machine's
        sys.exit(
            f"fakeserver: cannot listen on {args['host']}:{args['port']} ({exc.strerror or exc})"
        )


if __name__ == "__main__":
    main()

"""The loopback server of testkit/fakeserver.py, with the timing of a real one: for plan's tests.

`TimedServer` is a `FakeServer` whose completion lengths depend on what the prompt asks for
and whose decoding takes time the way a serving engine's does:

- **lengths per kind of prompt**: `lengths` maps a marker text to a `Lengths` (lognormal
  around a median, plus an optional share of much longer answers); a prompt whose decoded text
  contains the marker gets those lengths, others get `default`. With one marker per prompt
  file, each partition has its own length distribution (a "long" partition of essays, say).
- **a fixed number of slots** (`slots`, FakeServer's): generations beyond it wait in a queue.
- **a finite decode speed** (`decode_tps`, tokens/s per generation) that, with
  `batch_slowdown` k > 0, falls as more generations decode at once: each token takes
  (1 + k (n - 1)) / decode_tps seconds with n in the batch, so a full server is slower per
  request than a draining one, as in SGLang and vLLM.
- `prefill_s`: seconds before a generation decodes its first token, holding its slot.

Lengths stay a pure function of the prompt ids and seed (`expected()` still answers what any
request gets). `TimedServerProcess` runs one in a child process, so the server's event loop
does not share the test's interpreter (and its GIL) with the client being timed.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

# testkit/ (pytest's pythonpath) also in the child process TimedServerProcess runs this file in
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "testkit"))
from fakeserver import FakeModel, FakeServer, FakeServerProcess


@dataclass(frozen=True)
class Lengths:
    """Completion lengths (stop token included): lognormal around `median` with log-spread
    `sigma`; a `tail` share is `tail_factor` times longer."""

    median: float
    sigma: float = 0.5
    tail: float = 0.0
    tail_factor: float = 8.0

    def draw(self, u: float, z: float) -> int:
        scale = self.tail_factor if u < self.tail else 1.0
        return max(1, int(self.median * scale * math.exp(self.sigma * z)))

    def mean(self) -> float:
        """The mean length before any max-tokens cut."""
        body = self.median * math.exp(self.sigma**2 / 2)
        return body * (1 - self.tail + self.tail * self.tail_factor)


@dataclass(frozen=True)
class TimedModel(FakeModel):
    """FakeModel with lengths chosen by a marker in the prompt's text."""

    lengths: tuple[tuple[str, Lengths], ...] = ()
    default: Lengths = Lengths(40.0)
    decode: Callable[[Sequence[int]], str] | None = field(default=None, compare=False)

    def lengths_for(self, prompt_ids: Sequence[int]) -> Lengths:
        if self.lengths and self.decode is not None:
            text = self.decode(prompt_ids)
            for marker, lengths in self.lengths:
                if marker in text:
                    return lengths
        return self.default

    def natural_length(self, prompt_ids: Sequence[int], seed: int | None = None) -> int:
        rng = self._rng(prompt_ids, seed)
        u, z = rng.random(), rng.standard_normal()
        return self.lengths_for(prompt_ids).draw(u, z)

    def generate(
        self,
        prompt_ids: Sequence[int],
        *,
        max_tokens: int,
        stop_token_ids: Iterable[int] = (),
        seed: int | None = None,
    ) -> tuple[list[int], str]:
        stops = sorted(
            {*stop_token_ids, *(() if self.eos_token_id is None else (self.eos_token_id,))}
        )
        natural = self.natural_length(prompt_ids, seed)
        # The body's ids come from a stream of their own: only their count matters here.
        rng = self._rng([*prompt_ids, natural], seed)
        body_len = max(0, min(natural - 1, max_tokens) if stops else max_tokens)
        body = rng.integers(0, self.vocab_size, body_len, dtype=np.int64)
        if stops:
            clash = np.isin(body, stops)
            while clash.any():
                body[clash] = (body[clash] + 1) % self.vocab_size
                clash = np.isin(body, stops)
        ids = body.tolist()
        if stops and natural <= max_tokens:
            ids.append(stops[0])
            return ids, "stop"
        return ids, "length"


class TimedServer(FakeServer):
    """FakeServer with per-marker lengths and batch-dependent decode speed (module doc)."""

    def __init__(
        self,
        api: str = "sglang",
        *,
        lengths: dict[str, Lengths] | None = None,
        default_lengths: Lengths = Lengths(40.0),
        batch_slowdown: float = 0.0,
        prefill_s: float = 0.0,
        **options: Any,
    ) -> None:
        super().__init__(api, **options)
        self.batch_slowdown = batch_slowdown
        self.prefill_s = prefill_s
        self.model = TimedModel(
            vocab_size=self.model.vocab_size,
            eos_token_id=self.model.eos_token_id,
            lengths=tuple((lengths or {}).items()),
            default=default_lengths,
            decode=self.tokenizer.decode,
        )

    async def _decode(self, rec: dict, n_tokens: int, live: Any = None) -> int:
        if not (self.batch_slowdown or self.prefill_s) or self.decode_tps <= 0:
            return await super()._decode(rec, n_tokens, live)
        self._waiting += 1
        try:
            await self._slot_sem.acquire()
        finally:
            self._waiting -= 1
        try:
            self._in_slot += 1
            self.max_in_flight = max(self.max_in_flight, self._in_slot)
            rec["t_started"] = time.monotonic()
            if self.prefill_s:
                await asyncio.sleep(self.prefill_s)
            left = n_tokens
            while left > 0:
                # The batch changes as generations come and go: advance in ~10 ms steps.
                per_token = (1 + self.batch_slowdown * (self._in_slot - 1)) / self.decode_tps
                step = max(1, min(left, int(0.01 / per_token)))
                await asyncio.sleep(step * per_token)
                left -= step
            self.generated_tokens += n_tokens
            return n_tokens
        finally:
            self._in_slot -= 1
            self._slot_sem.release()


def _to_json(options: dict[str, Any]) -> str:
    out = dict(options)
    if "lengths" in out:
        out["lengths"] = {k: asdict(v) for k, v in out["lengths"].items()}
    if "default_lengths" in out:
        out["default_lengths"] = asdict(out["default_lengths"])
    return orjson.dumps(out).decode()


def _from_json(text: str) -> dict[str, Any]:
    options = orjson.loads(text)
    if "lengths" in options:
        options["lengths"] = {k: Lengths(**v) for k, v in options["lengths"].items()}
    if "default_lengths" in options:
        options["default_lengths"] = Lengths(**options["default_lengths"])
    return options


class TimedServerProcess(FakeServerProcess):
    """A TimedServer in a child process; `requests()`, `control()` as FakeServerProcess."""

    def __init__(self, api: str = "sglang", *, port: int = 0, **options: Any) -> None:
        super().__init__(api, port=port)
        self.timed_options = options

    def start(self, timeout: float = 60.0) -> TimedServerProcess:
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
            "--options",
            _to_json(self.timed_options),
        ]
        self.proc = subprocess.Popen(argv)
        deadline = time.monotonic() + timeout
        while not port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"timed fake server did not start: {argv}")
            time.sleep(0.02)
        self.port = int(port_file.read_text())
        return self

    def generate_requests(self) -> list[dict]:
        """The generation requests received so far (bodies included)."""
        return [r for r in self.requests() if r["path"] in ("/generate", "/v1/completions")]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--api", default="sglang")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--port-file")
    p.add_argument(
        "--options", type=_from_json, default={}, help="TimedServer keyword arguments as JSON"
    )
    args = p.parse_args(argv)
    srv = TimedServer(args.api, port=args.port, **args.options)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, srv.request_stop)
        await srv.serve(args.port_file)

    asyncio.run(run())


if __name__ == "__main__":
    main()

"""Benchmark `eagle3kit gen` against the OpenAI SDK client, both measured in the same run.

What it measures
----------------
1. Throughput. N chat prompts (default 20,000, OpenAI ``messages`` JSONL, distinct so
   nothing is deduplicated) go to a loopback fake vLLM server that answers every request
   at once with a 1,000-token completion (``--max-tokens``; finish ``length``, so every
   answer has exactly that many ids). Two clients, each a whole separate process, timed
   from spawn to exit:

   * baseline: the OpenAI SDK (``AsyncOpenAI`` as a user would build it, its default
     connection pool included) with an ``asyncio.Semaphore(--concurrency)``; each task
     renders its prompt with the same Qwen3 tokenizer and chat template
     (``apply_chat_template`` + ``encode``, as gen does), sends the ids with
     ``completions.create(prompt=ids, extra_body=...)`` asking for what gen asks for
     (``return_token_ids``, the stop ids, ...), and writes one ``json.dumps`` line per
     answer; the file is fsynced at the end.
   * ours: ``python -m eagle3kit gen PROMPTS OUT --server URL --api vllm --concurrency C
     --tokenizer TOK -q``: loading, rendering, the tokenizer probe, every invariant check,
     shard writes and manifest commits (fsyncs included) are all in the figure.

   Each client gets a fresh server. Figures: req/s over the whole process (the target:
   gen >= 5x the SDK), req/s from the first request to exit, CPU seconds per 1,000
   requests and peak RSS (``os.wait4`` on the child: that process alone), the server's own
   CPU per request and how busy it was (its share of one core while requests flowed: near
   100% means the server, not the client, set the pace). The two outputs are compared:
   the same prompt ids and the same completion ids for a spread of up to 1,000 prompts.

   Server modes (``--servers``): ``cheap`` answers from a small pool of precomputed
   completions (the response bytes are the same size and shape), so the server costs little
   more than aiohttp's own handling; ``model`` is the stock ``testkit/fakeserver.py`` path,
   which draws every completion from its deterministic model and decodes its text with the
   Qwen3 tokenizer per request. On a 2-core machine the server and the client share the
   CPUs; the stock path costs enough CPU per request to cap a fast client, hence both.

2. Idle slots. A server with ``--idle-slots`` (64) slots, a finite decode speed
   (``--decode-tps`` tokens/s per request) and long-tailed lengths (exponential around
   ``--idle-mean-tokens``, ``--idle-long-tail`` of them around ``--idle-long-tokens``).
   gen runs twice: with ``--concurrency`` equal to the slots, and with ``--idle-extra``
   (16, a quarter) more, as docs/running-at-scale.md advises. With exactly as many requests
   as slots, every answer leaves its slot idle for gen's turnaround (the answer travels
   back, is recorded, the next request travels out): that run shows how much that costs.
   With more requests than slots the server queues the extra ones, and a freed slot goes
   straight to the next; the target is that no slot then starves. While prompts remain
   unsent (the server has received fewer generation requests than there are prompts), the
   server's in-slot and queued counts are sampled every 50 ms; after the first second
   (warm-up) no sample may show a free slot with no request queued for it. The server also
   records when each request arrived, took its slot and released it, which gives the exact
   starved and idle slot-time in that window (idle: free; starved: free with nothing queued,
   the client's share of it).

3. Resume. A token dataset of ``--resume-samples`` (1,000,000) committed samples, whose
   sample ids are those gen derives for the first R prompts of a prompt file of R + 10,
   is built quickly (gen itself starts it on the first 10 prompts, so its manifest holds
   gen's own settings; ``DatasetWriter`` then adds tiny samples with the ids gen computes:
   ``make_sample_id`` as ``eagle3kit.gen.make_chains`` calls it, checked against
   ``make_chains`` on the first 1,000). gen then runs over all R + 10 prompts. Reported: the
   time from the dataset being opened (the ``started`` time gen's writer records in the
   manifest's ``runs`` when it takes the dataset) to the server receiving the first new
   generation request (target <= 2 s), and the time from process start to the opening
   (loading and rendering setup, not part of the target).

Conditions
----------
* 2 CPU cores (or whatever ``os.cpu_count()`` says) are shared by the server process, the
  client process and this script; the table says how many there were.
* The work directory is a fresh temporary directory under ``--dir`` (default ``bench-out/``
  in the repository, a real disk), removed afterwards unless ``--keep``.
* The Qwen3 tokenizer is rebuilt offline by ``testkit/real_tokenizers.py`` (cached under
  ``--dir``). An untimed process imports everything first, so every timed process reads
  its modules and the tokenizer from the page cache.
* The load average before and after is printed: on a machine where other work shares the
  cores, wall-clock figures mean little and CPU seconds per request are the steadier ones.
* ``--gen-wrapper FILE`` runs gen as ``python FILE gen ...`` (a script that patches a
  candidate change in, then calls ``eagle3kit.cli.main``), to measure a change against
  the same baseline.

Usage: ``python benchmarks/gen_bench.py [--quick] [--prompts N] [--concurrency C]
[--checks throughput,idle,resume] [--servers cheap,model] [--json]``. The baseline needs
the OpenAI SDK: ``pip install openai``. The human table goes to stderr; ``--json`` prints
the figures as JSON on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson
from _common import DATA, REPO, with_testkit

with_testkit()

from fakeserver import GEN_PATHS, FakeServer, _json  # noqa: E402
from real_tokenizers import qwen3_tokenizer_dir  # noqa: E402

from eagle3kit.chat import Renderer  # noqa: E402
from eagle3kit.format import Dataset, DatasetWriter, TokenSample, make_sample_id  # noqa: E402
from eagle3kit.gen import GenConfig, ServerSpec, load, make_chains  # noqa: E402

TARGET_RATIO = 5.0
RESUME_TARGET_S = 2.0
IDLE_WARMUP_S = 1.0
IDLE_SAMPLE_S = 0.05
NEW_PROMPTS = 10
"""Prompts beyond the committed ones in the resume check."""
SAMPLING = {"temperature": 0.7, "top_p": 1.0, "top_k": -1, "min_p": 0.0}
"""gen's defaults; the SDK baseline sends the same."""
PROMPT_FILE = "prompts.jsonl"


# The server -------------------------------------------------------------------------------
class BenchServer(FakeServer):
    """The fake server, plus what the benchmark reads: generation requests received (and when
    the first came), each request's slot time, the process's own CPU time; and, with
    `cheap`, vLLM completions from a pool of precomputed answers instead of the model."""

    def __init__(
        self, api: str = "vllm", *, cheap: bool = False, pool: int = 64, **options: Any
    ) -> None:
        super().__init__(api, **options)
        self.cheap = cheap
        self.pool = pool
        self._canned: dict[tuple, list[tuple[list[int], str]]] = {}
        self.gen_received = 0
        self.first_gen_wall: float | None = None
        self.first_gen_mono: float | None = None
        self.spans: list[tuple[float, float, float]] = []

    def _record(self, request: Any, body: Any) -> dict[str, Any]:
        rec = super()._record(request, body)
        if request.path in GEN_PATHS:
            self.gen_received += 1
            if self.first_gen_wall is None:
                self.first_gen_wall, self.first_gen_mono = time.time(), time.monotonic()
        return rec

    async def _decode(self, rec: dict, n_tokens: int, live: Any = None) -> int:
        try:
            return await super()._decode(rec, n_tokens, live)
        finally:
            if rec.get("t_started") is not None:
                self.spans.append((rec["t_received"], rec["t_started"], time.monotonic()))

    def _answers(self, max_tokens: int, stops: tuple[int, ...]) -> list[tuple[list[int], str]]:
        """`pool` completions of exactly max_tokens ids, none a stop id, with their text."""
        key = (max_tokens, stops)
        if key not in self._canned:
            endless = dataclasses.replace(self.model, mean_tokens=1e12, long_tail=0.0)
            answers = []
            for k in range(self.pool):
                ids, _ = endless.generate([k + 1], max_tokens=max_tokens, stop_token_ids=stops)
                answers.append((ids, self.tokenizer.decode(ids)))
            self._canned[key] = answers
        return self._canned[key]

    async def _vllm_completions(self, request: Any, body: dict, rec: dict) -> Any:
        ids, max_tokens = body.get("prompt"), body.get("max_tokens")
        if (
            not self.cheap
            or not isinstance(ids, list)
            or not ids
            or type(max_tokens) is not int
            or body.get("model") != self.model_name
            or self._context_error(len(ids), max_tokens) is not None
        ):
            return await super()._vllm_completions(request, body, rec)
        stops = tuple(
            sorted({*(body.get("stop_token_ids") or ()), self.model.eos_token_id} - {None})
        )
        answers = self._answers(max_tokens, stops)
        out, text = answers[(len(ids) + ids[-1]) % len(answers)]
        await self._decode(rec, len(out))
        choice: dict[str, Any] = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": "length",
            "stop_reason": None,
            "prompt_logprobs": None,
        }
        if body.get("return_token_ids"):
            choice["token_ids"] = out
            choice["prompt_token_ids"] = ids
        n = len(out)
        return await self._send(
            request,
            {
                "id": f"cmpl-{os.urandom(16).hex()}",
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

    async def _control(self, request: Any, path: str) -> Any:
        if path == "/_fake/bench":
            t = os.times()
            return _json(
                {
                    "gen_received": self.gen_received,
                    "first_gen_wall": self.first_gen_wall,
                    "first_gen_mono": self.first_gen_mono,
                    "in_flight": self._in_slot,
                    "waiting": self._waiting,
                    "max_in_flight": self.max_in_flight,
                    "cpu_s": t.user + t.system,
                }
            )
        if path == "/_fake/spans":
            return _json(self.spans)
        return await super()._control(request, path)


def serve_main(argv: list[str]) -> None:
    """`gen_bench.py _serve CONFIG_JSON PORT_FILE`: run a BenchServer until SIGTERM."""
    import signal

    config, port_file = json.loads(argv[0]), argv[1]
    srv = BenchServer(**config)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, srv.request_stop)
        await srv.serve(port_file)

    asyncio.run(run())


class ServerProc:
    """A BenchServer in its own process (its own GIL and event loop)."""

    def __init__(self, work: Path, **config: Any) -> None:
        self.config = {"api": "vllm", "record_bodies": False, **config}
        self.dir = Path(tempfile.mkdtemp(prefix="server-", dir=work))
        self.proc: subprocess.Popen | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ServerProc:
        port_file = self.dir / "port"
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "_serve", json.dumps(self.config), str(port_file)],
            stdout=subprocess.DEVNULL,
            stderr=open(self.dir / "stderr", "wb"),
        )
        deadline = time.monotonic() + 60
        while not port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise SystemExit(
                    "the fake server did not start: " + (self.dir / "stderr").read_text()[-2000:]
                )
            time.sleep(0.02)
        self.port = int(port_file.read_text())
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def get(self, what: str) -> Any:
        with urllib.request.urlopen(f"{self.url}/_fake/{what}", timeout=30) as resp:
            return orjson.loads(resp.read())


# The SDK baseline -------------------------------------------------------------------------
def sdk_main(argv: list[str]) -> None:
    """`gen_bench.py _sdk CONFIG_JSON`: the OpenAI SDK client (one process, timed whole)."""
    cfg = json.loads(argv[0])
    import openai
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(cfg["tokenizer"], local_files_only=True)
    with open(cfg["prompts"], "rb") as f:
        records = [json.loads(line) for line in f if line.strip()]

    async def main() -> None:
        client = openai.AsyncOpenAI(base_url=cfg["url"] + "/v1", api_key="EMPTY")
        sem = asyncio.Semaphore(cfg["concurrency"])
        extra = {
            "top_k": SAMPLING["top_k"],
            "min_p": SAMPLING["min_p"],
            "stop_token_ids": cfg["stop_token_ids"],
            "skip_special_tokens": False,
            "include_stop_str_in_output": True,
            "return_token_ids": True,
        }
        with open(cfg["out"], "w") as out:

            async def one(line: int, record: dict) -> None:
                async with sem:
                    text = tok.apply_chat_template(
                        record["messages"], tokenize=False, add_generation_prompt=True
                    )
                    ids = tok.encode(text, add_special_tokens=False)
                    resp = await client.completions.create(
                        model=cfg["model"],
                        prompt=ids,
                        max_tokens=cfg["max_tokens"],
                        temperature=SAMPLING["temperature"],
                        top_p=SAMPLING["top_p"],
                        extra_body=extra,
                    )
                    choice = resp.choices[0]
                    out.write(
                        json.dumps(
                            {
                                "line": line,
                                "prompt_ids": ids,
                                "completion_ids": (choice.model_extra or {}).get("token_ids"),
                                "finish_reason": choice.finish_reason,
                                "usage": resp.usage.model_dump() if resp.usage else None,
                            }
                        )
                        + "\n"
                    )

            await asyncio.gather(*(one(i + 1, r) for i, r in enumerate(records)))
            out.flush()
            os.fsync(out.fileno())
        await client.close()

    asyncio.run(main())


# Prompts ----------------------------------------------------------------------------------
def seed_texts() -> list[str]:
    """First-turn questions of the real prompt sets in tests/data/prompts."""
    texts = []
    for path in sorted((DATA / "prompts").rglob("question.jsonl")):
        for line in path.read_text().splitlines():
            turns = json.loads(line).get("turns") if line.strip() else None
            if turns and isinstance(turns[0], str) and turns[0].strip():
                texts.append(turns[0].strip())
    return texts


def prompt_text(texts: list[str], i: int, short: bool) -> str:
    base = texts[i % len(texts)]
    if short:
        return f"Question {i}: {base[:160]}"
    return f"{base}\n\n(Request {i}: please answer in detail.)"


def write_prompts(path: Path, start: int, stop: int, texts: list[str], short: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        for i in range(start, stop):
            f.write(
                orjson.dumps(
                    {"messages": [{"role": "user", "content": prompt_text(texts, i, short)}]}
                )
                + b"\n"
            )


# Running a client -------------------------------------------------------------------------
@dataclasses.dataclass
class Run:
    rc: int
    wall_s: float
    cpu_s: float
    peak_rss_mb: float
    started_wall: float
    stdout: str
    stderr: str


def child_env() -> dict[str, str]:
    """This environment, with the repository first on PYTHONPATH."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }


def run_child(argv: list[str], work: Path, name: str, during: Any = None) -> Run:
    """Spawn argv, wait with os.wait4: wall, CPU and peak RSS of that process alone."""
    out, err = work / f"{name}.stdout", work / f"{name}.stderr"
    env = child_env()
    with open(out, "wb") as fo, open(err, "wb") as fe:
        started_wall, t0 = time.time(), time.perf_counter()
        proc = subprocess.Popen(argv, stdout=fo, stderr=fe, env=env, cwd=REPO)
        stop = threading.Event()
        watcher = None
        if during is not None:
            watcher = threading.Thread(target=during, args=(stop,), daemon=True)
            watcher.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        stop.set()
        if watcher is not None:
            watcher.join()
    return Run(
        proc.returncode,
        wall,
        usage.ru_utime + usage.ru_stime,
        usage.ru_maxrss / 1024,
        started_wall,
        out.read_text(),
        err.read_text(),
    )


def check_rc(run: Run, what: str) -> None:
    if run.rc != 0:
        raise SystemExit(f"{what} failed (exit {run.rc}):\n{run.stderr[-4000:]}")


GEN_COMMAND = [sys.executable, "-m", "eagle3kit"]
"""How gen is started; --gen-wrapper replaces it (to measure a patched gen)."""


def gen_argv(
    prompts: Path, out: Path, url: str, tokenizer: Path, concurrency: int, max_tokens: int
) -> list[str]:
    return [
        *GEN_COMMAND,
        "gen",
        str(prompts),
        str(out),
        "--server",
        url,
        "--api",
        "vllm",
        "--concurrency",
        str(concurrency),
        "--tokenizer",
        str(tokenizer),
        "--max-tokens",
        str(max_tokens),
        "-q",
        "--no-progress",
        "--json",
    ]


def client_figures(run: Run, n: int, before: dict, after: dict) -> dict:
    first = (after["first_gen_wall"] - run.started_wall) if after["first_gen_wall"] else None
    sending = run.wall_s - first if first is not None else None
    server_cpu = after["cpu_s"] - before["cpu_s"]
    return {
        "requests": n,
        "wall_s": run.wall_s,
        "req_per_s": n / run.wall_s,
        "first_request_s": first,
        "sending_req_per_s": n / sending if sending else None,
        "cpu_s": run.cpu_s,
        "cpu_s_per_1k": run.cpu_s / n * 1000,
        "peak_rss_mb": run.peak_rss_mb,
        "server_cpu_s": server_cpu,
        "server_cpu_ms_per_req": server_cpu / n * 1000,
        "server_busy": server_cpu / sending if sending else None,
        "server_received": after["gen_received"] - before["gen_received"],
    }


# 1. Throughput ----------------------------------------------------------------------------
def compare_outputs(jsonl: Path, dataset: Path, n: int, limit: int = 1000) -> dict:
    """The same prompt ids and completion ids on both sides, for up to `limit` prompts."""
    step = max(1, n // limit)
    wanted = set(range(1, n + 1, step))
    sdk = {}
    lines = 0
    with open(jsonl, "rb") as f:
        for raw in f:
            lines += 1
            rec = orjson.loads(raw)
            if rec["line"] in wanted:
                sdk[rec["line"]] = rec
    ds = Dataset(dataset)
    mismatched = checked = 0
    for sample in ds.iter_samples():
        line = sample.source["line"]
        if line in sdk:
            checked += 1
            rec = sdk[line]
            if (
                rec["prompt_ids"] != sample.prompt_ids.tolist()
                or rec["completion_ids"] != sample.completion_ids.tolist()
            ):
                mismatched += 1
    return {
        "sdk_lines": lines,
        "gen_samples": len(ds),
        "checked": checked,
        "mismatched": mismatched,
    }


def bench_throughput(
    work: Path, args: argparse.Namespace, tokenizer: Path, stop_ids: list[int], mode: str
) -> dict:
    n = args.prompts
    prompts = work / "chat" / PROMPT_FILE
    if not prompts.exists():
        write_prompts(prompts, 0, n, seed_texts())
    server_cfg = {
        "cheap": mode == "cheap",
        "tokenizer": str(tokenizer),
        "slots": 100_000,
        "mean_tokens": 1e12,
        "context_length": 8192,
    }
    fig: dict[str, Any] = {"server": mode}
    if not args.no_sdk:
        jsonl = work / f"sdk-{mode}.jsonl"
        with ServerProc(work, **server_cfg) as srv:
            before = srv.get("bench")
            cfg = {
                "prompts": str(prompts),
                "out": str(jsonl),
                "url": srv.url,
                "model": "fake/model",
                "tokenizer": str(tokenizer),
                "concurrency": args.concurrency,
                "max_tokens": args.max_tokens,
                "stop_token_ids": stop_ids,
            }
            print(f"[{mode}] SDK baseline: {n:,} requests...", file=sys.stderr)
            run = run_child(
                [sys.executable, __file__, "_sdk", json.dumps(cfg)], work, f"sdk-{mode}"
            )
            check_rc(run, "the SDK baseline")
            fig["sdk"] = client_figures(run, n, before, srv.get("bench"))
    out = work / f"gen-{mode}"
    with ServerProc(work, **server_cfg) as srv:
        before = srv.get("bench")
        print(f"[{mode}] gen: {n:,} requests...", file=sys.stderr)
        run = run_child(
            gen_argv(prompts, out, srv.url, tokenizer, args.concurrency, args.max_tokens),
            work,
            f"gen-{mode}",
        )
        check_rc(run, "gen")
        fig["gen"] = client_figures(run, n, before, srv.get("bench"))
    result = json.loads(run.stdout)
    fig["gen"]["written"] = result["written"]
    fig["gen"]["violations"] = result["violations"]
    if result["written"] != n or result["violations"] or result["failed"]:
        raise SystemExit(f"gen did not write every sample cleanly: {result}")
    if "sdk" in fig:
        fig["same_output"] = compare_outputs(work / f"sdk-{mode}.jsonl", out, n)
        s, g = fig["sdk"], fig["gen"]
        fig["ratio"] = g["req_per_s"] / s["req_per_s"]
        fig["sending_ratio"] = g["sending_req_per_s"] / s["sending_req_per_s"]
        fig["cpu_ratio"] = s["cpu_s_per_1k"] / g["cpu_s_per_1k"]
        fig["target"] = TARGET_RATIO
    shutil.rmtree(out, ignore_errors=True)
    return fig


# 2. Idle slots ------------------------------------------------------------------------------
def occupancy(spans: list[list[float]], start: float, end: float, slots: int) -> dict:
    """Exact slot use in [start, end] from each request's (received, took slot, released).

    A slot is *idle* while no request holds it, and *starved* while it is idle and no
    request waits at the server to take it: the client's fault, not the server's hand-over
    of a freed slot to the next request in its queue."""
    # (time, change in requests waiting, change in slots held)
    steps = sorted(
        [(r, 1, 0) for r, _, _ in spans]
        + [(s, -1, 1) for _, s, _ in spans]
        + [(e, 0, -1) for _, _, e in spans]
    )
    occ = waiting = 0
    last, idle, starved, t_idle, t_starved, lowest = start, 0.0, 0.0, 0.0, 0.0, slots

    def advance(t: float) -> None:
        nonlocal last, idle, starved, t_idle, t_starved, lowest
        dt = t - last
        free, hungry = slots - occ, max(0, slots - occ - waiting)
        idle += free * dt
        starved += hungry * dt
        t_idle += dt if free > 0 else 0.0
        t_starved += dt if hungry > 0 else 0.0
        lowest = min(lowest, occ)
        last = t

    for t, d_waiting, d_held in steps:
        if t > last and last < end:
            advance(min(t, end))
        waiting += d_waiting
        occ += d_held
    if end > last:
        advance(end)
    window = end - start
    if window <= 0:
        return {
            "window_s": window,
            "idle_slot_share": None,
            "starved_slot_share": None,
            "time_below_share": None,
            "time_starved_share": None,
            "lowest": lowest,
        }
    return {
        "window_s": window,
        "idle_slot_share": idle / (slots * window),
        "starved_slot_share": starved / (slots * window),
        "time_below_share": t_idle / window,
        "time_starved_share": t_starved / window,
        "lowest": lowest,
    }


def bench_idle(work: Path, args: argparse.Namespace, tokenizer: Path) -> list[dict]:
    prompts = work / "idle" / PROMPT_FILE
    write_prompts(prompts, 0, args.idle_prompts, seed_texts())
    levels = [args.idle_slots] + ([args.idle_slots + args.idle_extra] if args.idle_extra else [])
    return [idle_run(work, args, tokenizer, prompts, c) for c in levels]


def idle_run(
    work: Path, args: argparse.Namespace, tokenizer: Path, prompts: Path, concurrency: int
) -> dict:
    n, slots = args.idle_prompts, args.idle_slots
    server_cfg = {
        "tokenizer": str(tokenizer),
        "slots": slots,
        "decode_tps": args.decode_tps,
        "mean_tokens": args.idle_mean_tokens,
        "long_tail": args.idle_long_tail,
        "long_tokens": args.idle_long_tokens,
        "context_length": 16384,
    }
    samples: list[tuple[float, int, int, int]] = []
    with ServerProc(work, **server_cfg) as srv:
        before = srv.get("bench")

        def sample(stop: threading.Event) -> None:
            while not stop.is_set():
                t = time.monotonic()
                with urllib.request.urlopen(f"{srv.url}/_fake/bench", timeout=30) as resp:
                    b = orjson.loads(resp.read())
                samples.append((t, b["gen_received"], b["in_flight"], b["waiting"]))
                stop.wait(max(0.0, IDLE_SAMPLE_S - (time.monotonic() - t)))

        print(
            f"[idle] gen: {n:,} requests, concurrency {concurrency}, {slots} slots, "
            f"{args.decode_tps:g} tok/s...",
            file=sys.stderr,
        )
        run = run_child(
            gen_argv(
                prompts, work / "gen-idle", srv.url, tokenizer, concurrency, args.idle_max_tokens
            ),
            work,
            "gen-idle",
            during=sample,
        )
        check_rc(run, "gen (idle check)")
        bench = srv.get("bench")
        spans = srv.get("spans")
    first = bench["first_gen_mono"]
    last_received = max(r for r, _, _ in spans)
    warm = [s for s in samples if s[0] >= first + IDLE_WARMUP_S and s[1] < n]
    below = [s for s in warm if s[2] < slots]
    starved = [s for s in below if s[2] + s[3] < slots]
    exact = occupancy(spans, first + IDLE_WARMUP_S, last_received, slots)
    shutil.rmtree(work / "gen-idle", ignore_errors=True)
    return {
        "prompts": n,
        "slots": slots,
        "concurrency": concurrency,
        "decode_tps": args.decode_tps,
        "mean_tokens": args.idle_mean_tokens,
        "long_tail": args.idle_long_tail,
        "long_tokens": args.idle_long_tokens,
        "wall_s": run.wall_s,
        "cpu_s": run.cpu_s,
        "server_cpu_s": bench["cpu_s"] - before["cpu_s"],
        "samples": len(warm),
        "samples_below": len(below),
        "samples_starved": len(starved),
        "share_below": len(below) / len(warm) if warm else None,
        "share_starved": len(starved) / len(warm) if warm else None,
        "mean_in_flight": sum(s[2] for s in warm) / len(warm) if warm else None,
        "min_in_flight": min((s[2] for s in warm), default=None),
        "max_waiting": max((s[3] for s in samples), default=None),
        "sending_window_s": last_received - first,
        "sending_req_per_s": len(spans) / (last_received - first)
        if last_received > first
        else None,
        "exact": exact,
        "target_share": 0.0 if concurrency > slots else None,
    }


# 3. Resume ------------------------------------------------------------------------------------
def bench_resume(work: Path, args: argparse.Namespace, tokenizer: Path) -> dict:
    done = args.resume_samples
    total = done + NEW_PROMPTS
    texts = seed_texts()
    base = work / "resume"
    prompts, seed, check = (
        base / "all" / PROMPT_FILE,
        base / "seed" / PROMPT_FILE,
        base / "check" / PROMPT_FILE,
    )
    out = base / "dataset"
    t0 = time.perf_counter()
    write_prompts(prompts, 0, total, texts, short=True)
    write_prompts(seed, 0, NEW_PROMPTS, texts, short=True)
    write_prompts(check, 0, min(1000, done), texts, short=True)
    prompts_s = time.perf_counter() - t0

    def sample_id(i: int) -> str:  # as eagle3kit.gen.make_chains computes it
        messages = [{"role": "user", "content": prompt_text(texts, i, True)}]
        return make_sample_id(PROMPT_FILE, {"messages": messages, "tools": None}, 0, 0)

    cfg = GenConfig(
        [check], base / "unused", servers=[ServerSpec("http://127.0.0.1:9")], tokenizer=tokenizer
    )
    expected = [c.ids[0] for c in make_chains(load(cfg)[0], 1)]
    if expected != [sample_id(i) for i in range(len(expected))]:
        raise SystemExit("the benchmark's sample ids differ from eagle3kit.gen.make_chains'")

    server_cfg = {
        "cheap": True,
        "tokenizer": str(tokenizer),
        "slots": 100_000,
        "mean_tokens": 1e12,
        "context_length": 8192,
    }
    print(f"[resume] building a dataset of {done:,} committed samples...", file=sys.stderr)
    t0 = time.perf_counter()
    with ServerProc(work, **server_cfg) as srv:
        run = run_child(
            gen_argv(seed, out, srv.url, tokenizer, args.concurrency, args.max_tokens),
            work,
            "gen-resume-seed",
        )
    check_rc(run, "gen (resume seed)")
    ds = Dataset(out)
    if sorted(ds.sample_ids()) != sorted(sample_id(i) for i in range(NEW_PROMPTS)):
        raise SystemExit("gen's sample ids differ from the benchmark's")
    config = ds.manifest["config"]
    del ds
    with DatasetWriter(
        out, mode="resume", config=config, commit_every=100_000, commit_interval=1e9
    ) as writer:
        for i in range(NEW_PROMPTS, done):
            writer.add(
                TokenSample(
                    sample_id=sample_id(i),
                    prompt_ids=[1, 2, 3],
                    completion_ids=[4, 5],
                    finish_reason="stop",
                    partition="prompts",
                )
            )
    build_s = time.perf_counter() - t0
    print(f"[resume] built in {build_s:.1f} s; gen over {total:,} prompts...", file=sys.stderr)
    with ServerProc(work, **server_cfg) as srv:  # a fresh one: its first request is gen's
        before = srv.get("bench")
        run = run_child(
            gen_argv(prompts, out, srv.url, tokenizer, args.concurrency, args.max_tokens),
            work,
            "gen-resume",
        )
        check_rc(run, "gen (resume)")
        after = srv.get("bench")
    result = json.loads(run.stdout)
    manifest = json.loads((out / "manifest.json").read_text())
    opened = manifest["runs"][-1]["started"]
    first = after["first_gen_wall"] if after["gen_received"] > before["gen_received"] else None
    if result["previously_done"] != done or result["written"] != NEW_PROMPTS:
        raise SystemExit(f"the resumed run did not find {done:,} done: {result}")
    return {
        "committed": done,
        "prompts": total,
        "new": NEW_PROMPTS,
        "prompt_file_mb": prompts.stat().st_size / 2**20,
        "prompts_write_s": prompts_s,
        "build_s": build_s,
        "start_to_open_s": opened - run.started_wall,
        "open_to_first_request_s": first - opened if first else None,
        "start_to_first_request_s": first - run.started_wall if first else None,
        "wall_s": run.wall_s,
        "cpu_s": run.cpu_s,
        "peak_rss_mb": run.peak_rss_mb,
        "target_s": RESUME_TARGET_S,
    }


# Report -------------------------------------------------------------------------------------
def _f(value: Any, fmt: str, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:{width}{fmt}}"


def render(fig: dict) -> str:
    lines = [
        f"eagle3kit gen vs the OpenAI SDK ({fig['openai']}): {fig['prompts']:,} chat prompts "
        f"(Qwen3 template), {fig['max_tokens']:,}-token completions, concurrency "
        f"{fig['concurrency']}; {fig['cpus']} CPUs shared by the fake server, the client and "
        f"this script; load average {fig['loadavg_before']:.1f} before, "
        f"{fig.get('loadavg_after', 0):.1f} after (above 0 means other work shared the CPUs)",
    ]
    servers = {"cheap": "precomputed completions", "model": "stock FakeServer model + text decode"}
    for t in fig.get("throughput", []):
        s, g = t.get("sdk") or {}, t["gen"]
        lines += [
            f"server: {t['server']} ({servers[t['server']]}), zero latency, its own process",
            f"{'':34}{'SDK':>10}{'gen':>10}{'ratio':>9}",
        ]

        def row(
            label: str,
            key: str,
            fmt: str,
            inverse: bool = False,
            note: str = "",
            s: dict = s,
            g: dict = g,
        ) -> str:
            sv, gv = s.get(key), g.get(key)
            ratio = None
            if sv and gv:
                ratio = sv / gv if inverse else gv / sv
            return (
                f"  {label:32}{_f(sv, fmt, 10)}{_f(gv, fmt, 10)}"
                f"{_f(ratio, '.1f', 8)}{'x' if ratio is not None else ' '}  {note}"
            )

        verdict = ""
        if s:
            verdict = (
                f"target >= {t['target']:.0f}x  {'MET' if t['ratio'] >= t['target'] else 'MISSED'}"
            )
        lines += [
            row("req/s, whole process", "req_per_s", ".0f", note=verdict),
            row("req/s, first request to exit", "sending_req_per_s", ".0f"),
            row("wall s", "wall_s", ".1f", inverse=True),
            row("start to first request s", "first_request_s", ".2f", inverse=True),
            row("CPU s per 1,000 requests", "cpu_s_per_1k", ".2f", inverse=True),
            row("peak RSS MB", "peak_rss_mb", ".0f", inverse=True),
            row("server CPU ms per request", "server_cpu_ms_per_req", ".3f"),
            row("server busy (share of 1 core)", "server_busy", ".0%"),
        ]
        if "same_output" in t:
            o = t["same_output"]
            lines.append(
                f"  outputs: {o['sdk_lines']:,} SDK lines, {o['gen_samples']:,} gen "
                f"samples; {o['checked']:,} compared, {o['mismatched']} differ"
            )
    for i in fig.get("idle", []):
        e = i["exact"]
        share = i["share_starved"]
        verdict = "MET" if share == 0 else "MISSED"
        if i["concurrency"] <= i["slots"]:  # the turnaround idles each slot: no target
            verdict = "(no requests queued at the server: no target)"
        lines += [
            f"idle slots: {i['slots']} slots, gen --concurrency {i['concurrency']}, "
            f"{i['decode_tps']:g} tok/s per request, lengths exp({i['mean_tokens']:g}) with "
            f"{i['long_tail']:.0%} exp({i['long_tokens']:g}); {i['prompts']:,} prompts, "
            f"{i['sending_window_s']:.1f} s of sending ({_f(i['sending_req_per_s'], '.0f', 0)}"
            " req/s)",
            f"  50 ms samples while prompts unsent (after {IDLE_WARMUP_S:g} s), a slot free "
            f"and no request waiting for it: {i['samples_starved']}/{i['samples']} = "
            f"{_f(share, '.1%', 0)}  "
            + (verdict if i["concurrency"] <= i["slots"] else f"target 0  {verdict}"),
            f"  samples with a slot free at all (the server handing a freed slot to a queued "
            f"request included): {i['samples_below']}/{i['samples']}; mean in slots "
            f"{_f(i['mean_in_flight'], '.2f', 0)}, lowest {i['min_in_flight']}; most queued "
            f"at the server {i['max_waiting']}",
            f"  exact, from each request's slot time: starved slot-time "
            f"{_f(e['starved_slot_share'], '.2%', 0)} (time with a slot starved "
            f"{_f(e['time_starved_share'], '.1%', 0)}), idle slot-time "
            f"{_f(e['idle_slot_share'], '.2%', 0)}, lowest in slots {e['lowest']}",
        ]
    if "resume" in fig:
        r = fig["resume"]
        ok = (
            r["open_to_first_request_s"] is not None
            and r["open_to_first_request_s"] <= r["target_s"]
        )
        lines += [
            f"resume: {r['committed']:,} committed samples, {r['prompts']:,} prompts "
            f"({r['prompt_file_mb']:.0f} MB), {r['new']} new",
            f"  dataset opened -> first new request: "
            f"{_f(r['open_to_first_request_s'], '.2f', 0)} s  target <= {r['target_s']:g} s  "
            f"{'MET' if ok else 'MISSED'}",
            f"  process start -> dataset opened {r['start_to_open_s']:.2f} s; start -> first "
            f"request {_f(r['start_to_first_request_s'], '.2f', 0)} s; whole run "
            f"{r['wall_s']:.1f} s, {r['cpu_s']:.1f} CPU s, peak RSS {r['peak_rss_mb']:.0f} MB; "
            f"building the dataset took {r['build_s']:.1f} s",
        ]
    lines.append(
        "req/s ratio: gen / SDK; wall, CPU, RSS ratio: SDK / gen (higher is better "
        "for gen); server busy near 100% means the server set the pace"
    )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=int, default=20_000, help="chat prompts (throughput)")
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=1000, help="tokens per completion")
    p.add_argument(
        "--checks",
        default="throughput,idle,resume",
        help="comma-separated: throughput, idle, resume",
    )
    p.add_argument(
        "--servers",
        default="cheap,model",
        help="throughput server modes: cheap (precomputed answers), model (stock)",
    )
    p.add_argument("--no-sdk", action="store_true", help="skip the SDK baseline (no ratio)")
    p.add_argument("--idle-prompts", type=int, default=4000)
    p.add_argument("--idle-slots", type=int, default=64)
    p.add_argument(
        "--idle-extra",
        type=int,
        default=16,
        help="also run the idle check with --concurrency slots + this (0: no)",
    )
    p.add_argument(
        "--decode-tps", type=float, default=1000.0, help="idle check: tokens/s per request"
    )
    p.add_argument("--idle-mean-tokens", type=float, default=150.0)
    p.add_argument("--idle-long-tail", type=float, default=0.05)
    p.add_argument("--idle-long-tokens", type=float, default=1500.0)
    p.add_argument("--idle-max-tokens", type=int, default=4096)
    p.add_argument("--resume-samples", type=int, default=1_000_000)
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 2,000 prompts, 1,000 idle prompts, 50,000 committed",
    )
    p.add_argument(
        "--dir",
        type=Path,
        default=REPO / "bench-out",
        help="parent of the temporary work directory (default: bench-out/)",
    )
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument(
        "--gen-wrapper",
        type=Path,
        help="run gen as `python WRAPPER gen ...` instead of `python -m eagle3kit gen "
        "...`, e.g. a script that patches a candidate change in before calling "
        "eagle3kit.cli.main (the SDK baseline is unaffected)",
    )
    p.add_argument("--json", action="store_true", help="figures as JSON on stdout")
    args = p.parse_args(argv)
    if args.quick:
        args.prompts, args.idle_prompts, args.resume_samples = 2000, 1000, 50_000
    return args


def partial(result: Any) -> None:
    """Each check's figures as soon as it ends, so a run cut short still tells something."""
    print(f"[result] {json.dumps(result)}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.gen_wrapper is not None:
        GEN_COMMAND[:] = [sys.executable, str(args.gen_wrapper.resolve())]
    checks = {c.strip() for c in args.checks.split(",") if c.strip()}
    if "throughput" in checks and not args.no_sdk and importlib.util.find_spec("openai") is None:
        print(
            "the SDK baseline needs the OpenAI SDK: pip install openai "
            "(or pass --no-sdk, or --checks idle,resume)",
            file=sys.stderr,
        )
        return 2
    args.dir.mkdir(parents=True, exist_ok=True)
    tokenizer = qwen3_tokenizer_dir(args.dir / "tokenizer-cache").resolve()
    stop_ids = Renderer.load(tokenizer).stop_token_ids
    work = Path(tempfile.mkdtemp(prefix="gen_bench-", dir=args.dir))
    openai_version = None
    if importlib.util.find_spec("openai") is not None:
        from importlib.metadata import version

        openai_version = f"openai {version('openai')}"
    fig: dict[str, Any] = {
        "prompts": args.prompts,
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
        "cpus": len(os.sched_getaffinity(0)),
        "openai": openai_version,
        "python": platform.python_version(),
        "dir": str(work),
        "loadavg_before": os.getloadavg()[0],
    }
    # Imports and the tokenizer come from the page cache for every timed process alike.
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from transformers import AutoTokenizer; "
            "AutoTokenizer.from_pretrained(sys.argv[1]); import eagle3kit.cli, aiohttp; "
            "import importlib.util as u; u.find_spec('openai') and __import__('openai')",
            str(tokenizer),
        ],
        check=True,
        capture_output=True,
        env=child_env(),
    )
    try:
        if "throughput" in checks:
            fig["throughput"] = []
            for mode in filter(None, map(str.strip, args.servers.split(","))):
                fig["throughput"].append(bench_throughput(work, args, tokenizer, stop_ids, mode))
                partial(fig["throughput"][-1])
        if "idle" in checks:
            fig["idle"] = bench_idle(work, args, tokenizer)
            partial(fig["idle"])
        if "resume" in checks:
            fig["resume"] = bench_resume(work, args, tokenizer)
            partial(fig["resume"])
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    fig["loadavg_after"] = os.getloadavg()[0]
    print(render(fig), file=sys.stderr)
    if args.json:
        print(json.dumps(fig, indent=2))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_serve":
        serve_main(sys.argv[2:])
    elif len(sys.argv) > 1 and sys.argv[1] == "_sdk":
        sdk_main(sys.argv[2:])
    else:
        raise SystemExit(main())

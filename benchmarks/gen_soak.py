"""Fault soak for `eagle3kit gen`: every fault at once, then reruns until the dataset is whole.

What it does
------------
A prompt set that calls for ``--requests`` samples (default 20,000; one conversation in ten
has two turns) goes to ``--servers`` stand-in servers (``testkit/fakeserver.py``, each its own
process; SGLang and vLLM in turn), each with a random mix of faults switched on:

* standing rates: 503s, connection resets (one server resets halfway through the answer's
  body), hangs of 60 s (gen runs with ``--request-timeout``), server-side aborts, and
  malformed token ids in answers (negative, past int32, float, string, null in turn);
* events, every ``--event-every`` seconds or so once generation runs: a 503 storm of 5-20 s
  on one server while its /health answers 200; a restart (SIGKILL, the same port, the same
  model); a restart serving another model, put back after 3-8 s; a burst of hangs;
* a full disk: the first runs go under RLIMIT_FSIZE (as tests/test_disk_full.py does) at a
  size the manifest outgrows partway through; once a run has ended on it, the disk is
  "grown" (no limit) for the reruns.

gen (the real CLI, a subprocess) is run, and run again with the same command after each
run that ends early, until one exits 0. A watchdog fails the soak when no server receives a
request for ``--stall-s`` while gen runs (a hang). Then the dataset is checked:

* it holds exactly the samples the prompts call for, each once (duplicates = 0);
* every prompt is exactly the template's rendering (later turns with the stored answer of
  the turn before), every completion exactly what the stand-in's deterministic model answers
  for it (so nothing from the other model, nothing malformed, nothing cut), and nothing is
  left recorded as failed;
* every request the servers hung (60 s) was given up by gen at ``--request-timeout``: the
  server saw it end within that plus HANG_SLACK_S (its own loop's lag on a loaded machine).

It prints the faults injected by kind, retries, reruns needed, samples, duplicates, the
longest request and quiet gap, and the wall time; ``--json`` puts the figures on stdout.
Exit status 0 when every check holds, 1 otherwise.

Usage: ``python benchmarks/gen_soak.py [--requests N] [--servers K] [--seed S] [--json]``;
``--requests 1500`` is a quick run (the slow test's, tests/test_gen_soak.py).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from _common import REPO, with_testkit

with_testkit()

from fakeserver import GEN_PATHS, FakeServer, FakeServerProcess  # noqa: E402
from file_limits import limit_file_size  # noqa: E402

from eagle3kit.chat import Renderer  # noqa: E402
from eagle3kit.format import Dataset  # noqa: E402
from eagle3kit.gen import GenConfig, ServerSpec, load, make_chains  # noqa: E402
from eagle3kit.tiny import make_tokenizer, stdlib_docstrings  # noqa: E402

MODEL = {"mean_tokens": 24.0}
"""The stand-ins' model settings; completions depend on these, the prompt ids and the seed."""
OTHER_MODEL = "other/model"
MAX_TOKENS = 64
CONTEXT = 4096
MAX_RUNS = 12
HANG_SLACK_S = 5.0
"""A hung request's time is taken at the server, from receiving it to noticing that gen
closed the connection: on a loaded machine the server's own loop adds seconds to it. Left
alone, a hung request lasts 60 s."""
MANIFEST_ENTRY_BYTES = 330
"""About what one commit adds to the manifest: sizes the full disk to hit partway through."""


@dataclass
class Soak:
    args: argparse.Namespace
    work: Path
    tokenizer: Path
    prompts: Path
    out: Path
    servers: list[FakeServerProcess] = field(default_factory=list)
    records: list[Path] = field(default_factory=list)
    events: Counter = field(default_factory=Counter)
    rng: random.Random = field(default_factory=random.Random)
    lock: threading.Lock = field(default_factory=threading.Lock)
    restores: list[threading.Timer] = field(default_factory=list)


# Set-up -------------------------------------------------------------------------------------
def make_prompts(path: Path, requests: int, rng: random.Random) -> int:
    """Conversations that call for `requests` samples (one in ten with two turns)."""
    lines, samples, i = [], 0, 0
    while samples < requests:
        turns = 2 if rng.random() < 0.1 and samples + 2 <= requests else 1
        question = [
            f"Question {i}: what is {i} times {rng.randint(2, 99)}?",
            f"And {i} plus {rng.randint(2, 99)}?",
        ][:turns]
        lines.append(orjson.dumps({"question_id": i, "category": "soak", "turns": question}))
        samples += turns
        i += 1
    path.write_bytes(b"\n".join(lines) + b"\n")
    return samples


def standing_faults(k: int, rng: random.Random) -> dict[str, Any]:
    return {
        "fail_rate": rng.uniform(0.005, 0.02),
        "fail_status": 503,
        "reset_rate": rng.uniform(0.003, 0.01),
        "reset_mid_body": k % 3 == 1,
        "hang_rate": rng.uniform(0.002, 0.005),
        "hang_s": 60.0,
        "abort_rate": rng.uniform(0.002, 0.006),
        "bad_ids_rate": rng.uniform(0.003, 0.01),
        "bad_ids_kind": "mix",
        "seed": rng.randrange(1 << 30),
    }


def start_servers(soak: Soak) -> None:
    for k in range(soak.args.servers):
        record = soak.work / f"server{k}.jsonl"
        srv = FakeServerProcess(
            "sglang" if k % 2 == 0 else "vllm",
            tokenizer=str(soak.tokenizer),
            record_file=str(record),
            no_record_bodies=True,
            context_length=CONTEXT,
            faults=standing_faults(k, soak.rng),
            **MODEL,
        )
        soak.servers.append(srv.start())
        soak.records.append(record)


def gen_argv(soak: Soak) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "eagle3kit",
        "gen",
        str(soak.prompts),
        str(soak.out),
        "--tokenizer",
        str(soak.tokenizer),
        "--max-tokens",
        str(MAX_TOKENS),
        "--request-timeout",
        str(soak.args.request_timeout),
        "--commit-every",
        str(soak.args.commit_every),
        "--no-progress",
        "--log-every",
        "5",
        "--json",
    ]
    for srv in soak.servers:
        argv += ["--server", f"{srv.url}@{soak.args.concurrency}"]
    return argv


# Faults while gen runs ----------------------------------------------------------------------
def received(soak: Soak) -> int:
    """Bytes of request records so far: grows with every request any server finished."""
    return sum(p.stat().st_size for p in soak.records if p.exists())


def runs_recorded(soak: Soak) -> int:
    """Runs the dataset's manifest lists: a run adds itself once its servers are probed and
    the dataset is open, that is when generation begins."""
    try:
        return len(orjson.loads((soak.out / "manifest.json").read_bytes())["runs"])
    except (OSError, orjson.JSONDecodeError, KeyError):
        return 0


def restart(soak: Soak, srv: FakeServerProcess, model: str) -> None:
    """SIGKILL, down for 1-2 s (a real server takes minutes to load), up on the same port."""
    with soak.lock:
        srv.kill()
        time.sleep(soak.rng.uniform(1.0, 2.0))
        srv.faults = {**(srv.faults or {}), "seed": soak.rng.randrange(1 << 30)}
        srv.restart(model_name=model)


def fire_event(soak: Soak) -> None:
    rng, srv = soak.rng, soak.rng.choice(soak.servers)
    kind = rng.choices(["storm", "restart", "other_model", "hangs"], [3, 2, 2, 1])[0]
    try:
        if kind == "storm":
            srv.set_faults(storm_s=rng.uniform(5, 20))
        elif kind == "hangs":
            srv.set_faults(hang_next=rng.randint(2, 6))
        elif kind == "restart":
            restart(soak, srv, srv.options.get("model_name", "fake/model"))
        else:
            restart(soak, srv, OTHER_MODEL)
            timer = threading.Timer(rng.uniform(3, 8), restart, (soak, srv, "fake/model"))
            timer.start()
            soak.restores.append(timer)
    except (OSError, RuntimeError):  # a server mid-restart: the event did not happen
        return
    soak.events[kind] += 1


def restore_all(soak: Soak) -> None:
    """Between runs: every server up and serving the run's model."""
    for timer in soak.restores:
        timer.cancel()
    soak.restores.clear()
    for srv in soak.servers:
        if (
            srv.options.get("model_name", "fake/model") != "fake/model"
            or srv.proc is None
            or srv.proc.poll() is not None
        ):
            restart(soak, srv, "fake/model")


@dataclass
class RunResult:
    rc: int
    wall: float
    stdout: str
    stderr: str
    longest_quiet: float
    hung: bool


def run_gen(soak: Soak, limit: int | None, faults: bool) -> RunResult:
    """One gen run, with events fired while it generates and a watchdog for hangs."""
    log = soak.work / f"gen-{len(list(soak.work.glob('gen-*.stderr')))}"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    with open(f"{log}.stdout", "wb") as fo, open(f"{log}.stderr", "wb") as fe:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            gen_argv(soak),
            stdout=fo,
            stderr=fe,
            env=env,
            cwd=soak.work,
            preexec_fn=None if limit is None else limit_file_size(limit),
        )
        size, last_change, runs_before = received(soak), time.monotonic(), runs_recorded(soak)
        started = False
        next_event = time.monotonic() + soak.rng.uniform(0.5, 1.5) * soak.args.event_every
        longest, hung = 0.0, False
        while proc.poll() is None:
            time.sleep(0.1)
            now, grown = time.monotonic(), received(soak)
            if grown != size:
                size, last_change = grown, now
            # Events wait for generation: a server down while gen starts is refused at once
            # (its probe), which tells nothing about riding out faults.
            started = started or runs_recorded(soak) > runs_before
            longest = max(longest, now - last_change)
            if now - last_change > soak.args.stall_s:
                hung = True
                proc.kill()
                break
            if faults and started and now >= next_event:
                fire_event(soak)
                next_event = now + soak.rng.uniform(0.5, 1.5) * soak.args.event_every
        proc.wait()
        wall = time.monotonic() - t0
    return RunResult(
        proc.returncode,
        wall,
        Path(f"{log}.stdout").read_text(),
        Path(f"{log}.stderr").read_text(),
        longest,
        hung,
    )


def retries_of(run: RunResult) -> int:
    """The run's retries: from its JSON when it finished, else its last status line."""
    if run.rc == 0 and run.stdout.strip():
        return int(orjson.loads(run.stdout)["retries"])
    found = re.findall(r"^gen .* retries ([\d,]+)", run.stderr, re.M)
    return int(found[-1].replace(",", "")) if found else 0


# Checking the dataset ------------------------------------------------------------------------
def check_dataset(soak: Soak) -> dict[str, Any]:
    cfg = GenConfig(
        [soak.prompts],
        soak.out,
        servers=[ServerSpec("http://127.0.0.1:1")],
        tokenizer=soak.tokenizer,
    )
    convs, _, _ = load(cfg)
    chains = make_chains(convs, 1)
    renderer = Renderer.load(soak.tokenizer)
    model = FakeServer("sglang", tokenizer=str(soak.tokenizer), **MODEL)  # not started
    ds = Dataset(soak.out)
    stored_ids = list(ds.sample_ids())
    stored = {s.sample_id: s for s in ds}
    wrong: list[str] = []
    finishes: Counter = Counter()
    for chain in chains:
        answers: list[dict] = []
        for turn, sample_id in enumerate(chain.ids):
            s = stored.get(sample_id)
            if s is None:
                wrong.append(f"{sample_id}: missing")
                break
            finishes[s.finish_reason] += 1
            if s.finish_reason == "skipped:earlier_turn":
                continue
            prompt = renderer.render(renderer.history(chain.conv, turn, answers))
            ids = [int(t) for t in s.prompt_ids]
            completion = [int(t) for t in s.completion_ids]
            max_tokens = min(MAX_TOKENS, CONTEXT - len(prompt))
            want, finish = model.expected(
                prompt, max_tokens=max_tokens, stop_token_ids=renderer.stop_token_ids, seed=None
            )
            if ids != prompt:
                wrong.append(f"{sample_id}: prompt ids differ from the rendering")
            elif (completion, s.finish_reason) != (want, finish):
                wrong.append(
                    f"{sample_id}: {s.finish_reason} completion differs from the "
                    f"model's ({s.server.get('model') if s.server else None})"
                )
            answers.append(renderer.answer_message(completion))
    extra = set(stored) - {i for c in chains for i in c.ids}
    return {
        "samples": len(stored_ids),
        "expected": sum(len(c.ids) for c in chains),
        "duplicates": len(stored_ids) - len(set(stored_ids)),
        "unexpected": len(extra),
        "wrong": len(wrong),
        "wrong_examples": wrong[:5],
        "finish": dict(finishes),
        "verify": ds.verify(),
    }


def server_figures(soak: Soak) -> dict[str, Any]:
    outcomes: Counter = Counter()
    bad_kinds: Counter = Counter()
    longest = longest_hang = 0.0
    for path in soak.records:
        for line in path.read_bytes().splitlines():
            rec = orjson.loads(line)
            if rec["path"] not in GEN_PATHS:
                continue
            outcomes[rec["outcome"]] += 1
            if rec.get("bad_id"):
                bad_kinds[rec["bad_id"]] += 1
            if rec["t_finished"] is not None:
                took = rec["t_finished"] - rec["t_received"]
                longest = max(longest, took)
                if rec["outcome"] == "hang":
                    longest_hang = max(longest_hang, took)
    return {
        "outcomes": dict(outcomes),
        "bad_id_kinds": dict(bad_kinds),
        "longest_request_s": round(longest, 2),
        "longest_hang_s": round(longest_hang, 2),
        "generation_requests": sum(outcomes.values()),
    }


# Main ---------------------------------------------------------------------------------------
def soak_run(args: argparse.Namespace) -> dict[str, Any]:
    t_start = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="gen-soak-", dir=args.dir))
    rng = random.Random(args.seed)
    tokenizer = make_tokenizer(work / "tokenizer", vocab_size=400, corpus=stdlib_docstrings(60_000))
    soak = Soak(args, work, tokenizer, work / "prompts.jsonl", work / "ds", rng=rng)
    requests = make_prompts(soak.prompts, args.requests, rng)
    tokenizer_bytes = max(p.stat().st_size for p in tokenizer.iterdir())
    commits = requests / args.commit_every
    limit = args.disk_limit or int(tokenizer_bytes + 0.45 * commits * MANIFEST_ENTRY_BYTES)
    runs: list[dict[str, Any]] = []
    retries = 0
    try:
        start_servers(soak)
        disk_full = False
        while len(runs) < MAX_RUNS:
            run = run_gen(soak, None if disk_full else limit, faults=True)
            full = run.rc == 1 and "no space left" in run.stderr
            disk_full = disk_full or full
            if full:
                soak.events["disk_full"] += 1
            retries += retries_of(run)
            errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
            runs.append(
                {
                    "rc": run.rc,
                    "wall_s": round(run.wall, 1),
                    "hung": run.hung,
                    "longest_quiet_s": round(run.longest_quiet, 1),
                    "error": errors[-1][:200] if errors else None,
                    "traceback": "Traceback" in run.stderr,
                }
            )
            restore_all(soak)
            if run.rc == 0 or run.hung:
                break
        checked = check_dataset(soak)
        served = server_figures(soak)
    finally:
        for timer in soak.restores:
            timer.cancel()
        for srv in soak.servers:
            srv.terminate()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    out = served["outcomes"]
    faults = {
        "503": out.get("fault_503", 0),
        "503_storm": out.get("fault_storm", 0),
        "reset": out.get("reset", 0),
        "hang": out.get("hang", 0),
        "abort": out.get("fault_abort", 0) + out.get("fault_error", 0),
        "malformed_ids": out.get("fault_bad_ids", 0),
        "storms": soak.events["storm"],
        "hang_bursts": soak.events["hangs"],
        "restarts_same_model": soak.events["restart"],
        "restarts_other_model": soak.events["other_model"],
        "disk_full": soak.events["disk_full"],
    }
    figures = {
        "requests": requests,
        "servers": args.servers,
        "seed": args.seed,
        "faults": faults,
        "malformed_id_kinds": served["bad_id_kinds"],
        "generation_requests": served["generation_requests"],
        "retries": retries,
        "runs": runs,
        "reruns": len(runs) - 1,
        **checked,
        "longest_request_s": served["longest_request_s"],
        "longest_hang_s": served["longest_hang_s"],
        "request_timeout_s": args.request_timeout,
        "longest_quiet_s": max(r["longest_quiet_s"] for r in runs),
        "disk_limit_bytes": limit,
        "wall_s": round(time.monotonic() - t_start, 1),
    }
    figures["problems"] = problems(figures)
    return figures


def problems(f: dict[str, Any]) -> list[str]:
    found = []
    if f["runs"][-1]["rc"] != 0:
        found.append(f"the last run exited {f['runs'][-1]['rc']} (after {len(f['runs'])} runs)")
    if any(r["hung"] for r in f["runs"]):
        found.append("a run made no progress for the watchdog's limit: a hang")
    if any(r["traceback"] for r in f["runs"]):
        found.append("a run printed a traceback")
    if f["samples"] != f["expected"] or f["unexpected"]:
        found.append(f"{f['samples']} samples stored, {f['expected']} expected")
    if f["duplicates"]:
        found.append(f"{f['duplicates']} duplicates")
    if f["wrong"]:
        found.append(f"{f['wrong']} samples differ: {f['wrong_examples']}")
    if f["finish"].get("skipped:failed"):
        found.append(f"{f['finish']['skipped:failed']} samples left as failed")
    if f["verify"]:
        found.append(f"verify: {f['verify'][:3]}")
    if f["longest_hang_s"] > f["request_timeout_s"] + HANG_SLACK_S:
        found.append(
            f"a hung request was held {f['longest_hang_s']}s, past --request-timeout "
            f"{f['request_timeout_s']}s (+{HANG_SLACK_S:g}s)"
        )
    return found


def render(f: dict[str, Any]) -> str:
    rows = [
        ("samples (stored / expected)", f"{f['samples']:,} / {f['expected']:,}"),
        ("duplicates", f"{f['duplicates']}"),
        ("samples that differ from the model", f"{f['wrong']}"),
        ("generation requests sent", f"{f['generation_requests']:,}"),
        ("retries (gen's count)", f"{f['retries']:,}"),
        ("reruns needed", f"{f['reruns']} (exits: {', '.join(str(r['rc']) for r in f['runs'])})"),
        *((f"faults: {k}", f"{v:,}") for k, v in f["faults"].items()),
        (
            "malformed ids by kind",
            ", ".join(f"{k} {v}" for k, v in sorted(f["malformed_id_kinds"].items())),
        ),
        (
            "longest hung request (server's view)",
            f"{f['longest_hang_s']}s of a 60 s hang (--request-timeout {f['request_timeout_s']}s)",
        ),
        ("longest request at a server", f"{f['longest_request_s']}s"),
        ("longest gap with no request", f"{f['longest_quiet_s']}s"),
        ("finish reasons", ", ".join(f"{k} {v:,}" for k, v in sorted(f["finish"].items()))),
        ("wall time", f"{f['wall_s']}s"),
        ("result", "PASS" if not f["problems"] else "FAIL: " + "; ".join(f["problems"])),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=20_000, help="samples the prompts call for")
    p.add_argument("--servers", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=32, help="slots per server")
    p.add_argument("--commit-every", type=int, default=100)
    p.add_argument("--request-timeout", type=float, default=2.0)
    p.add_argument("--event-every", type=float, default=4.0, help="seconds between events")
    p.add_argument(
        "--stall-s",
        type=float,
        default=90.0,
        help="no request at any server for this long while gen runs: a hang",
    )
    p.add_argument(
        "--disk-limit",
        type=int,
        default=None,
        help="RLIMIT_FSIZE bytes of the first runs (default: sized to fill halfway)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dir", type=Path, default=None, help="parent of the work directory")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--json", action="store_true", help="the figures as JSON on stdout")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    figures = soak_run(args)
    print(render(figures), file=sys.stderr)
    if args.json:
        print(orjson.dumps(figures, option=orjson.OPT_INDENT_2).decode())
    return 1 if figures["problems"] else 0


if __name__ == "__main__":
    raise SystemExit(main())

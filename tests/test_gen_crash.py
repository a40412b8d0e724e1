"""`eagle3kit gen` killed and interrupted for real: nothing lost, nothing twice, nothing wrong.

gen runs as a subprocess (the real CLI) against the fake server in another process, with a
finite decode speed so that requests are in flight and commits happen while it works. The
runs that are killed or interrupted are subprocesses (those killed with SIGKILL forked from
the worker's pre-warmed interpreter, testkit/prewarmed.py); a final run to the end may go
through the same CLI entry point in the test's own process.

- SIGKILL at random moments (no handler can run), then the same command again: after every
  kill the committed samples are each stored once and equal to what an uninterrupted run
  stores for the same sample id; the final rerun completes the set. Two-turn MT-bench
  questions are used, and kills are aimed between the turns of a conversation too, so a
  resumed second turn must rebuild its prompt from the first answer committed by the killed
  run: its prompt ids must equal those of the uninterrupted run.
- One SIGINT: no new request is sent, those in flight finish and are committed, gen exits 130
  and prints the command that continues; that command completes the set, sending only what
  is missing. A second SIGINT aborts hanging requests at once.
"""

from __future__ import annotations

import random
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import prewarmed
import pytest
from fakeserver import FakeServer, FakeServerProcess
from gen_harness import (
    MT_BENCH,
    check_exact,
    cli,
    ints,
    prompt_file,
    run_gen,
    sample_of,
    served,
)
from real_tokenizers import qwen3_tokenizer_dir

from eagle3kit.format import Dataset, is_dataset
from eagle3kit.gen.config import ServerSpec

# The fake model: outputs depend on these (and the prompt ids and seed) only.
MODEL = {"mean_tokens": 24}
DECODE_TPS = 150  # ~0.2 s per request: several in flight at any time
GEN_FLAGS = (
    "--commit-every",
    "3",
    "--commit-interval",
    "0.2",
    "--max-tokens",
    "48",
    "--concurrency",
    "4",
    "--sampling-seed",
    "9",
    "--temperature",
    "0.7",
)
RUN_TIMEOUT_S = 180.0


def gen_argv(prompts: Path, out: Path, url: str, tokenizer: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "eagle3kit",
        "gen",
        str(prompts),
        str(out),
        "--server",
        url,
        "--tokenizer",
        str(tokenizer),
        *GEN_FLAGS,
        *extra,
    ]


@pytest.fixture(scope="session")
def qwen3(tmp_path_factory) -> Path:
    return qwen3_tokenizer_dir(tmp_path_factory.getbasetemp())


class Reference:
    """An uninterrupted run of the same prompts with the same settings (in this process).

    Sample ids hash the prompt file's name, not its directory, so a run of a copy of the
    file elsewhere has the same ids.
    """

    def __init__(self, tmp_path: Path, n_prompts: int, tokenizer: Path) -> None:
        self.prompts = prompt_file(tmp_path, n_prompts, MT_BENCH)
        out = tmp_path / "reference"
        with FakeServer("sglang", tokenizer=served(tokenizer), **MODEL) as srv:
            run_gen(
                self.prompts,
                out,
                [ServerSpec(srv.url, 4)],
                tokenizer,
                max_tokens=48,
                sampling_seed=9,
                temperature=0.7,
            )
        self.model = srv
        """Its `expected()` is the fake model's output: the same after the server stopped."""
        self.stops = [served(tokenizer).token_id("<|im_end|>")]
        self.samples = {
            s.sample_id: (ints(s.prompt_ids), ints(s.completion_ids), s.finish_reason)
            for s in Dataset(out)
        }
        first: dict[int, str] = {}
        second: dict[int, str] = {}
        for s in Dataset(out):
            (first if s.source["turn"] == 0 else second)[s.source["line"]] = s.sample_id
        self.pairs = {second[line]: first[line] for line in second if self.samples[second[line]][0]}
        """turn-1 sample id -> the turn-0 sample id of the same conversation, for the
        conversations whose second turn is generated (not skipped after a cut first one)."""
        assert len(self.samples) == 2 * n_prompts


@pytest.fixture(scope="module")
def ref10(tmp_path_factory, qwen3) -> Reference:
    return Reference(tmp_path_factory.mktemp("ref10"), 10, qwen3)


def committed(out: Path, ref: dict[str, tuple]) -> set[str]:
    """The ids the dataset holds, after checking each is stored once and as the reference."""
    if not is_dataset(out):
        return set()
    ids = set()
    for s in Dataset(out):
        assert s.sample_id not in ids, f"{s.sample_id} stored twice"
        ids.add(s.sample_id)
        got = (ints(s.prompt_ids), ints(s.completion_ids), s.finish_reason)
        assert got == ref[s.sample_id], f"{s.sample_id} differs from an uninterrupted run"
    return ids


def gen_requests(srv: FakeServerProcess) -> list[dict]:
    return [r for r in srv.requests() if r["path"] == "/generate"]


def wait_for(
    predicate, proc: subprocess.Popen, timeout: float = RUN_TIMEOUT_S, poll: float = 0.02
) -> bool:
    """True once predicate() holds; False when the process ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(poll)
    proc.kill()
    raise AssertionError("gen did not get there in time")


def split_chains(ids: set[str], pairs: dict[str, str]) -> set[str]:
    """Second turns whose first turn is committed while they are not."""
    return {second for second, first in pairs.items() if first in ids and second not in ids}


# SIGKILL ------------------------------------------------------------------------------------
def crash_and_resume(
    tmp_path: Path, ref: Reference, tokenizer: Path, kills: int, seed: int, rerun
) -> None:
    """Kill gen `kills` times, then `rerun(argv)` the same command to the end."""
    rng = random.Random(seed)
    out = tmp_path / "ds"
    done: set[str] = set()
    splits: set[str] = set()
    landed = 0
    with FakeServerProcess(
        "sglang", tokenizer=str(tokenizer), decode_tps=DECODE_TPS, record_bodies=False, **MODEL
    ) as srv:
        argv = gen_argv(ref.prompts, out, srv.url, tokenizer, "-q", "--no-progress")

        def requests_since(before: int, need: int):
            return lambda: len(gen_requests(srv)) - before >= need

        def between_turns():
            return bool(split_chains(committed(out, ref.samples), ref.pairs))

        for trial in range(kills):
            # Where to kill: once a first turn is committed and its second is not (the first
            # trial always), soon after the first request, or after a few requests.
            mode = (
                "between_turns"
                if trial == 0
                else rng.choice(["between_turns", "first_request", "requests", "requests"])
            )
            need = 1 if mode == "first_request" else rng.randint(1, 6)
            # Forked from the worker's pre-warmed interpreter (testkit/prewarmed.py): a fresh
            # one spends ~5 s importing before any work; prewarmed.kill SIGKILLs the command.
            proc = subprocess.Popen(
                [*prewarmed.argv(), *argv[3:]], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
            if mode == "between_turns":
                hit = wait_for(between_turns, proc, poll=0.03)
            else:
                hit = wait_for(requests_since(len(gen_requests(srv)), need), proc)
                time.sleep(rng.uniform(0, 0.25))
            if proc.poll() is None:
                prewarmed.kill(proc)
                landed += hit
            proc.wait(30)
            stderr = proc.stderr.read().decode()
            assert "Traceback" not in stderr, stderr
            now = committed(out, ref.samples)
            assert now >= done, "a kill lost committed samples"
            done = now
            splits |= split_chains(done, ref.pairs)
            if len(done) == len(ref.samples):
                break
        code, _, stderr = rerun(argv[3:])
        assert code == 0, stderr
        answered = {sample_of(r) for r in gen_requests(srv)}
    assert landed == kills, f"only {landed} of {kills} kills landed while gen was working"
    assert committed(out, ref.samples) == set(ref.samples)
    check_exact(out, ref.model, ref.stops)
    assert answered <= set(ref.samples)
    assert Dataset(out).verify() == []
    # Second turns resumed after their first turn had been committed by a killed run: their
    # prompts were rebuilt from the stored answer, and equal the uninterrupted run's.
    assert splits, "no kill landed between the turns of a conversation"
    stored = {s.sample_id: s for s in Dataset(out)}
    for second in splits:
        assert ints(stored[second].prompt_ids) == ref.samples[second][0]
        assert len(stored[second].prompt_ids) > len(stored[ref.pairs[second]].prompt_ids)


def test_sigkill_at_random_moments_then_rerun(tmp_path, qwen3, ref10, capfd, monkeypatch):
    # The final rerun goes through the same CLI in this process: it spares the ~5 s a fresh
    # interpreter spends importing (the slow variant reruns in a subprocess).
    crash_and_resume(
        tmp_path, ref10, qwen3, kills=2, seed=1, rerun=lambda args: cli(capfd, monkeypatch, *args)
    )


@pytest.mark.slow
@pytest.mark.timeout(1500)  # 24 killed gen commands, then a fresh interpreter to the end
def test_sigkill_many_times_then_rerun(tmp_path, qwen3):
    ref = Reference(tmp_path, 80, qwen3)  # all of MT-bench: enough work for every kill

    def rerun(args: list[str]) -> tuple[int, str, str]:
        done = subprocess.run(
            [sys.executable, "-m", "eagle3kit", *args],
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
        )
        return done.returncode, done.stdout, done.stderr

    crash_and_resume(tmp_path, ref, qwen3, kills=24, seed=2, rerun=rerun)


# SIGINT -------------------------------------------------------------------------------------
def test_sigint_stops_cleanly_and_the_printed_command_continues(
    tmp_path, qwen3, ref10, capfd, monkeypatch
):
    prompts = prompt_file(tmp_path, 10, MT_BENCH)  # the reference's prompts, copied here
    ref = ref10.samples
    out = tmp_path / "ds"
    with FakeServerProcess(
        "sglang", tokenizer=str(qwen3), decode_tps=100, record_bodies=False, **MODEL
    ) as srv:
        proc = subprocess.Popen(
            gen_argv(prompts, out, srv.url, qwen3, "--no-progress"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for(lambda: len(gen_requests(srv)) >= 5, proc)
        in_flight = srv.control("stats")["in_flight"]
        sent_before = len(gen_requests(srv))
        signalled = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
        first_run = gen_requests(srv)
        assert proc.returncode == 130, stderr  # stopped early: a script must not go on
        assert "Traceback" not in stderr
        assert "stopping: no new requests" in stderr
        # Nothing new was sent after the signal: at most one request per slot was already on
        # its way, and none arrived well after it.
        assert len(first_run) <= sent_before + 4
        assert not [r for r in first_run if r["t_received"] > signalled + 0.5]
        # What was in flight finished and was committed; nothing was cut off.
        assert in_flight > 0
        assert all(r["outcome"] == "ok" for r in first_run)
        kept = committed(out, ref)
        assert {sample_of(r) for r in first_run} <= kept
        assert 0 < len(kept) < len(ref)
        (line,) = [x for x in stderr.splitlines() if "continue with:" in x]
        command = shlex.split(line.split("continue with:", 1)[1])
        assert command[:2] == ["eagle3kit", "gen"] and str(out) in command
        # Run it as printed (through the CLI, in this process to spare the imports).
        code, _, rerun_stderr = cli(capfd, monkeypatch, *command[1:])
        assert code == 0, rerun_stderr
        everything = gen_requests(srv)
    assert committed(out, ref) == set(ref)
    check_exact(out, ref10.model, ref10.stops)
    # The rerun sent exactly what was missing: each sample was generated once overall.
    per_sample = [sample_of(r) for r in everything]
    assert sorted(per_sample) == sorted(k for k, v in ref.items() if v[1])


def test_sigterm_stops_with_143_and_a_line_that_keeps_what_was_done(tmp_path, qwen3):
    """A scheduler's SIGTERM stops gen as Ctrl-C does, with the status train uses for it;
    the command it prints continues the output, so it drops the --overwrite that started it."""
    prompts = prompt_file(tmp_path, 10, MT_BENCH)
    out = tmp_path / "ds"
    with FakeServerProcess(
        "sglang", tokenizer=str(qwen3), decode_tps=100, record_bodies=False, **MODEL
    ) as srv:
        proc = subprocess.Popen(
            gen_argv(prompts, out, srv.url, qwen3, "--no-progress", "--overwrite"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for(lambda: len(gen_requests(srv)) >= 5, proc)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    assert "Traceback" not in stderr and "stopping: no new requests" in stderr
    (line,) = [x for x in stderr.splitlines() if "continue with:" in x]
    command = shlex.split(line.split("continue with:", 1)[1])
    assert command[:2] == ["eagle3kit", "gen"] and "--overwrite" not in command


def test_a_second_sigint_aborts_hanging_requests(tmp_path, qwen3):
    prompts = prompt_file(tmp_path, 6, MT_BENCH)
    out = tmp_path / "ds"
    faults = {"hang_rate": 1.0, "hang_s": 300}
    with FakeServerProcess(
        "sglang", tokenizer=str(qwen3), record_bodies=False, faults=faults, **MODEL
    ) as srv:
        proc = subprocess.Popen(
            gen_argv(prompts, out, srv.url, qwen3, "--no-progress"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for(lambda: len(gen_requests(srv)) >= 4, proc)
        proc.send_signal(signal.SIGINT)
        time.sleep(1.0)
        assert proc.poll() is None, "the grace period lets in-flight requests finish"
        proc.send_signal(signal.SIGINT)
        aborted = time.monotonic()
        _, stderr = proc.communicate(timeout=30)
        took = time.monotonic() - aborted
        time.sleep(0.3)
        hung = gen_requests(srv)
    assert took < 5, f"gen took {took:.1f} s to stop after the second SIGINT"
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "continue with:" in stderr
    assert len(hung) == 4  # nothing sent after the first signal
    # The server saw each hanging request end (its connection dropped) long before hang_s.
    assert all(r["t_finished"] is not None for r in hung), "the requests were dropped"
    assert is_dataset(out) and len(Dataset(out)) == 0

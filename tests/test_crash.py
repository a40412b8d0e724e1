"""Crash safety: `eagle3kit convert` SIGKILLed at random moments, then the same command again.

DESIGN.md promises that a crash loses at most the samples not yet committed, never corrupts
what was committed, and never duplicates a sample on resume. These tests hold the real CLI to
that: a real subprocess, a real SIGKILL (no cleanup handler can run), a real filesystem. After
every kill the dataset must open (or, killed before its marker was written, not exist yet),
verify clean, keep every sample it held before the kill, hold each sample once and equal to
its source line; rerunning the same command must finish the job and remove the debris the
crashes left.

The commands are forked from the worker's pre-warmed interpreter (testkit/prewarmed.py), which
has imported torch and the rest already: `prewarmed.kill` SIGKILLs a command (through its
caller, milliseconds later, still with no handler of its own) and returns once it is gone.
Every run still starts the CLI from its `main`, so the early kills still land in its set-up.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import prewarmed
import pytest
from random_samples import canonical, write_source

from eagle3kit.convert.jsonl import record_to_sample
from eagle3kit.format import Dataset, TokenSample, is_dataset
from eagle3kit.format.layout import MANIFEST, MARKER, SHARD_DIR, TMP_SUFFIX

N_SAMPLES = 1000  # 143 commits a run at --commit-every 7: kills land in every phase
# Small commits keep a commit in flight most of the time, so kills land inside one often.
CONVERT_FLAGS = ("--commit-every", "7", "--commit-interval", "0.05", "-q")
# Share of kills aimed at the first moments of a run (imports, lock, dataset creation).
EARLY_SHARE = 0.3
RUN_TIMEOUT_S = 120.0


# Source data ------------------------------------------------------------------------------


# Running the CLI --------------------------------------------------------------------------
def cli_env() -> dict[str, str]:
    """The environment minus a shared run id, so every invocation is a run of its own."""
    env = dict(os.environ)
    env.pop("EAGLE3KIT_RUN_ID", None)
    return env


def convert_cmd(src: Path, ds: Path) -> list[str]:
    return [*prewarmed.argv(), "convert", str(src), str(ds), *CONVERT_FLAGS]


def start_convert(src: Path, ds: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        convert_cmd(src, ds),
        env=cli_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prewarmed.argv(), *args],
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )


def start_cli(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*prewarmed.argv(), *args],
        env=cli_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@dataclass
class Pace:
    """How long a run takes here, first measured once, then corrected by every run that ends.

    The machine's load changes while the tests run (other jobs share the cores), and a kill
    aimed past the end of a run is wasted, so each finished run updates the estimate.
    """

    setup_s: float
    """Seconds from starting the command until the dataset's marker exists."""
    total_s: float
    """Seconds for a full, uninterrupted run."""

    def expected(self, remaining: float) -> float:
        """Seconds a run should take when `remaining` (0-1) of the samples are left to do."""
        return self.setup_s + (self.total_s - self.setup_s) * remaining

    def observe(self, remaining: float, elapsed: float) -> None:
        # Runs with little left to do are dominated by start-up noise and say little.
        if remaining >= 0.25:
            full = self.setup_s + max(elapsed - self.setup_s, 0.0) / remaining
            self.total_s = max(0.5 * (self.total_s + full), 1.5 * self.setup_s)


@dataclass(frozen=True)
class Source:
    path: Path
    expected: dict[str, dict]
    pace: Pace


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Source:
    """The source JSONL, and one uninterrupted run timed so kills can be spread over a run."""
    root = tmp_path_factory.mktemp("crash-src")
    path = root / "src.jsonl"
    expected = write_source(path, N_SAMPLES, seed=1234)
    ds = root / "calibration"
    prewarmed.shared()  # started and warm before the clock starts: its imports are no run's
    start = time.monotonic()
    proc = start_convert(path, ds)
    setup_s = None
    while proc.poll() is None:
        if setup_s is None and (ds / MARKER).exists():
            setup_s = time.monotonic() - start
        time.sleep(0.002)
    total_s = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr.read().decode() if proc.stderr else ""
    assert len(Dataset(ds)) == N_SAMPLES
    shutil.rmtree(ds)
    return Source(path, expected, Pace(setup_s or total_s, total_s))


# Checks -----------------------------------------------------------------------------------
@dataclass
class TrialStats:
    kills: int = 0
    before_dataset: int = 0
    """Kills that landed before the dataset existed (imports, lock, creation)."""
    finished_first: int = 0
    """Kill times that came after the run had already finished (the trial then restarts)."""
    strays_seen: int = 0
    """Kills that left temp files or uncommitted shards behind."""
    committed_at_kill: list[int] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    """One line per run, e.g. 'kill@1.20s:714', for the summary printed with -s."""


def check_after_kill(ds: Path, src: Source, before: set[str], stats: TrialStats) -> set[str]:
    """Everything a crash may not break; returns the ids the dataset holds now."""
    if not is_dataset(ds):
        # Killed before the dataset was created: nothing was ever committed, so nothing is
        # lost, and `info` refuses the directory as unusable input rather than crashing.
        assert not before, f"{ds}: the dataset vanished after a kill; it held {len(before)}"
        stats.before_dataset += 1
        info = run_cli("info", str(ds))
        assert info.returncode == 2, info.stderr
        assert info.stderr.startswith("error: ") and "Traceback" not in info.stderr
        return set()

    # `info` starts first and runs beside the in-process checks; nothing writes meanwhile.
    info = start_cli("info", str(ds), "--json")
    # The reader's own warning about leftovers is checked by `info` below; here it is noise.
    dataset = Dataset(ds, warn_stray=False)
    assert dataset.verify() == []
    ids = list(dataset.sample_ids())
    held = set(ids)
    assert len(ids) == len(held) == len(dataset), "a sample id appears twice"
    assert before <= held, f"{len(before - held)} committed samples lost by a kill"
    for sample in dataset.iter_samples():
        # Whole and exact: every token, the mask, the partition and all metadata.
        assert canonical(sample) == src.expected[sample.sample_id]
    per_partition = sum(p["samples"] for p in dataset.partition_stats().values())
    assert per_partition == len(held)

    temps, orphans = dataset.stray_files()
    stats.strays_seen += bool(temps or orphans)
    # Debris is only ever what a crash can leave: temp names and sealed-but-uncommitted shards.
    assert all(p.name.endswith(TMP_SUFFIX) for p in temps)
    assert all(p.parent.name == SHARD_DIR for p in orphans)

    stdout, stderr = info.communicate(timeout=RUN_TIMEOUT_S)
    assert info.returncode == 0, stderr
    report = orjson.loads(stdout)
    assert report["problems"] == []
    assert report["samples"] == len(held)
    # Crash leftovers are reported as warnings, one per file, and are not problems.
    assert len(report["warnings"]) == len(temps) + len(orphans)
    assert "Traceback" not in stderr
    return held


def check_complete(ds: Path, src: Source, work: Path, export: bool) -> None:
    """The finished dataset: every source sample exactly once, no debris, exports losslessly."""
    out = work / "export.jsonl"
    # The CLI export runs beside the in-process checks; its lines are compared afterwards.
    exporting = start_cli("convert", str(ds), str(out), "-q") if export else None
    dataset = Dataset(ds)
    assert dataset.verify() == []
    ids = list(dataset.sample_ids())
    assert len(ids) == len(set(ids)) == N_SAMPLES
    assert set(ids) == set(src.expected)
    for sample in dataset.iter_samples():
        assert canonical(sample) == src.expected[sample.sample_id]
    assert dataset.stray_files() == ([], [])
    leftovers = [p for p in ds.rglob("*") if p.name.endswith(TMP_SUFFIX)]
    assert leftovers == []
    if exporting is None:
        return

    _, stderr = exporting.communicate(timeout=RUN_TIMEOUT_S)
    assert exporting.returncode == 0, stderr
    lines = out.read_bytes().splitlines()
    assert len(lines) == N_SAMPLES
    for line in lines:
        sample = record_to_sample(orjson.loads(line))
        assert canonical(sample) == src.expected[sample.sample_id]
    out.unlink()


# Trials -----------------------------------------------------------------------------------
def kill_delay(rng: random.Random, pace: Pace, remaining: float, early: bool) -> float:
    """Seconds to let a run live before SIGKILL.

    Early kills aim at the first moments of a run (imports, lock, the dataset's creation);
    the others spread uniformly over the time this run should take, which shrinks with the
    share of the work still to do, so resumed runs are hit mid-run too.
    """
    if early:
        return rng.uniform(0.0, 1.5 * pace.setup_s)
    return rng.uniform(0.0, pace.expected(remaining))


# A run that ends before its kill leaves nothing to interrupt: the trial starts over on a
# fresh dataset (the pace estimate has just been corrected), at most this many times.
MAX_RESTARTS = 3


def run_trial(src: Source, work: Path, trial: int, seed: int, n_kills: int | None) -> TrialStats:
    """Kill the convert `n_kills` times in a row (1-4 when None) at random moments, then let
    the same command finish."""
    rng = random.Random(seed * 100_003 + trial)
    ds = work / f"ds{trial}"
    stats = TrialStats()
    if n_kills is None:
        n_kills = rng.choice((1, 1, 2, 3, 4))
    held: set[str] = set()
    in_row = 0
    while in_row < n_kills:
        remaining = 1 - len(held) / N_SAMPLES
        early = rng.random() < EARLY_SHARE or (trial == 0 and in_row == 0)
        delay = kill_delay(rng, src.pace, remaining, early)
        start = time.monotonic()
        proc = start_convert(src.path, ds)
        try:
            proc.wait(timeout=delay)
            finished = True
        except subprocess.TimeoutExpired:
            prewarmed.kill(proc)
            # The run may have ended between the timeout and the kill: its exit code says
            # which came first (a SIGKILL to a process already gone changes nothing).
            finished = proc.returncode != -signal.SIGKILL
        stderr = proc.stderr.read().decode() if proc.stderr else ""
        if proc.stderr:
            proc.stderr.close()
        if finished:
            # The run beat the kill: it must have succeeded and be complete.
            assert proc.returncode == 0, stderr
            src.pace.observe(remaining, time.monotonic() - start)
            stats.finished_first += 1
            stats.events.append(f"done<{delay:.2f}s")
            check_complete(ds, src, work, export=False)
            if stats.finished_first > MAX_RESTARTS:
                break
            shutil.rmtree(ds)
            held, in_row = set(), 0
            continue
        stats.kills += 1
        in_row += 1
        held = check_after_kill(ds, src, held, stats)
        stats.committed_at_kill.append(len(held))
        stats.events.append(f"kill@{delay:.2f}s:{len(held)}")

    remaining = 1 - len(held) / N_SAMPLES
    start = time.monotonic()
    final = subprocess.run(
        convert_cmd(src.path, ds),
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert final.returncode == 0, final.stderr
    assert "Traceback" not in final.stderr
    src.pace.observe(remaining, time.monotonic() - start)
    # One lossless export per test is enough to cover that path; it costs a second.
    check_complete(ds, src, work, export=trial == 0)
    shutil.rmtree(ds)
    return stats


def run_trials(
    src: Source, work: Path, n_trials: int, seed: int, kills: tuple[int, ...] | None = None
) -> list[TrialStats]:
    all_stats = [
        run_trial(src, work, t, seed, kills[t] if kills else None) for t in range(n_trials)
    ]
    n_kills = sum(s.kills for s in all_stats)
    partial = sum(0 < n < N_SAMPLES for s in all_stats for n in s.committed_at_kill)
    # Shown with -s: how the kills fell, so a reader can tell the trials covered the run.
    print(
        f"\n{n_trials} trials, {n_kills} kills: {sum(s.before_dataset for s in all_stats)} "
        f"before the dataset existed, {partial} with a partial dataset, "
        f"{sum(s.strays_seen for s in all_stats)} left debris, "
        f"{sum(s.finished_first for s in all_stats)} runs finished before their kill "
        "(trial restarted); "
        f"full run now {src.pace.total_s:.2f} s, setup {src.pace.setup_s:.2f} s"
    )
    for t, stats in enumerate(all_stats):
        print(f"  trial {t}: {' '.join(stats.events)}")
    assert n_kills > 0, "every run finished before its kill: the timing estimate is off"
    return all_stats


def test_kill_at_random_moments_then_resume(source: Source, tmp_path: Path) -> None:
    # Fixed kill counts keep the default run short while one trial still crashes three times
    # in a row before the run is allowed to finish.
    run_trials(source, tmp_path, n_trials=3, seed=7, kills=(1, 3, 1))


@pytest.mark.slow
@pytest.mark.timeout(3600)  # 50 trials take minutes, more on a loaded machine
def test_kill_at_random_moments_then_resume_many(source: Source, tmp_path: Path) -> None:
    stats = run_trials(source, tmp_path, n_trials=50, seed=2024)
    # Fifty trials must have hit every phase: setup, mid-run with debris, and a partial dataset.
    assert sum(s.before_dataset for s in stats) > 0
    assert sum(s.strays_seen for s in stats) > 0
    assert any(0 < n < N_SAMPLES for s in stats for n in s.committed_at_kill)


# Reruns and kills in quick succession ------------------------------------------------------
def _manifest(ds: Path) -> dict:
    try:
        return orjson.loads((ds / MANIFEST).read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return {}


def test_each_run_commits_early_so_kills_in_quick_succession_still_progress(
    source: Source, tmp_path: Path
) -> None:
    """With commits rare by choice (a huge --commit-every), a run used to commit only at its
    end, so kills that came sooner, however many, left nothing. Each run now commits its
    first FIRST_COMMIT new samples at once: every run is SIGKILLed the moment that commit
    lands, and every one of them must have gained samples, exact and each stored once."""
    from eagle3kit.convert.jsonl import FIRST_COMMIT

    ds = tmp_path / "ds"
    cmd = [
        *prewarmed.argv(),
        "convert",
        str(source.path),
        str(ds),
        "--commit-every",
        "1000000",
        "--commit-interval",
        "3600",
        "-q",
    ]
    held: set[str] = set()
    for _ in range(3):
        before = len(_manifest(ds).get("shards", []))
        proc = subprocess.Popen(
            cmd,
            env=cli_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while len(_manifest(ds).get("shards", [])) == before and proc.poll() is None:
            assert time.monotonic() < deadline, "no commit from a run in its first minutes"
            time.sleep(0.002)
        prewarmed.kill(proc)
        stderr = proc.stderr.read().decode() if proc.stderr else ""
        assert proc.returncode == -signal.SIGKILL, f"the run ended before its kill: {stderr}"
        now = set(Dataset(ds, warn_stray=False).sample_ids())
        gained = len(now) - len(held)
        assert held <= now and FIRST_COMMIT <= gained < N_SAMPLES - len(held)
        for sample in Dataset(ds, warn_stray=False).iter_samples():
            assert canonical(sample) == source.expected[sample.sample_id]
        held = now
    final = subprocess.run(
        cmd, env=cli_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    assert final.returncode == 0, final.stderr
    check_complete(ds, source, tmp_path, export=False)


def test_a_rerun_parses_only_what_is_not_committed(
    source: Source, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A no-op rerun used to parse every committed line again (12 s for 50,000): it now
    starts after the committed part of the source when that part is byte for byte the one
    the dataset recorded, and reads the whole file again when it is not."""
    from eagle3kit import convert
    from eagle3kit._ui import OutputOptions
    from eagle3kit.convert import jsonl

    parsed: list[int] = []
    original = jsonl.record_to_sample

    def counting(record: object) -> TokenSample:
        parsed.append(1)
        return original(record)

    monkeypatch.setattr(jsonl, "record_to_sample", counting)
    src = tmp_path / "src.jsonl"
    shutil.copy(source.path, src)
    ds = tmp_path / "ds"

    def run() -> tuple[int, convert.ConvertResult]:
        parsed.clear()
        result = convert.run(convert.ConvertConfig(src, ds, output=OutputOptions(quiet=True)))
        return len(parsed), result

    assert run()[0] == N_SAMPLES
    n, again = run()
    assert n == 0 and again.written == 0 and again.skipped_existing == N_SAMPLES

    extra = write_source(tmp_path / "extra.jsonl", 5, seed=99)
    with open(src, "ab") as f:
        f.write((tmp_path / "extra.jsonl").read_bytes())
    n, grown = run()
    assert n == 5 and grown.written == 5 and grown.skipped_existing == N_SAMPLES

    # An edit inside the committed part: the recorded bytes no longer match, so every line
    # is read again; committed ids are still skipped, nothing is stored twice.
    lines = src.read_bytes().splitlines(keepends=True)
    lines[10] = (
        orjson.dumps({"sample_id": "edited", "prompt_ids": [1], "completion_ids": [2]}) + b"\n"
    )
    src.write_bytes(b"".join(lines))
    n, edited = run()
    assert n == N_SAMPLES + 5 and edited.written == 1
    ids = list(Dataset(ds).sample_ids())
    assert len(ids) == len(set(ids)) == N_SAMPLES + 6
    assert set(ids) == {*source.expected, *extra, "edited"}
    assert run()[0] == 0  # and the next rerun skips again

"""Fuzzing metrics.jsonl: whatever lines a run from elsewhere holds, `info --plot` and a resumed
train read it to a clean end (issue 38, item 10).

Each case writes a run's metrics.jsonl as train writes it (steps with their TTT accuracies,
evaluations) with random lines among them: a real line with one field made hostile (text,
null, a list, an object, a 400-digit number, a bool, a huge accuracy list), random bytes (not
UTF-8 among them), a line cut short, JSON nested past Python's recursion limit, a line of
several MiB. Then it reads the run the ways eagle3kit does: `read_curves` (what info --plot
draws) and `cut_metrics` (train, resuming). Nothing may be raised, the run's own lines are all
kept, no series is longer than the file's lines or wider than the run's TTT steps (what the
figure costs: tests/test_info_plot.py draws the crafted lines for real), and each case's
traced memory stays under MEMORY_LIMIT and its time under TIME_LIMIT_S. Cases are seeded by
their number: a failure names it.
"""

from __future__ import annotations

import json
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from eagle3kit.checkpoints.rundir import RunDir
from eagle3kit.info import read_curves

SEED = 38
CASES = 100
SLOW_CASES = 3_000
TTT_STEPS = 3
STEPS = 12
MEMORY_LIMIT = 64 << 20
TIME_LIMIT_S = 5.0
HOSTILE = [
    None,
    True,
    False,
    "x",
    "",
    "0.5",
    [],
    [None],
    [1, 2],
    {},
    {"a": 1},
    -1,
    2**63,
    -(2**63),
    10**400,
    1e308,
    float("nan"),
    float("inf"),
]


def genuine(step: int, rng: np.random.Generator) -> dict:
    if step % 4 == 0:
        return {
            "step": step,
            "eval": {
                "predicted_acceptance_length": 1 + float(rng.random()),
                "per_position": [0.5] * TTT_STEPS,
            },
            "time": "t",
        }
    return {
        "step": step,
        "epoch": 0,
        "loss": float(rng.random() * 5),
        "lr": 3e-3,
        "grad_norm": 1.0,
        "acc_k": [float(a) for a in rng.random(TTT_STEPS)],
        "tokens": 256,
        "tokens_total": 256 * step,
        "tokens_per_s": 100.0,
        "elapsed": 0.1 * step,
        "time": "t",
    }


def _dumps(record: object) -> bytes:
    try:
        return json.dumps(record).encode()
    except ValueError:  # an int past Python's str limit
        return b'{"step": 1, "loss": ' + b"9" * 400 + b"}"


def crafted(rng: np.random.Generator) -> bytes:
    """One line eagle3kit did not write (or, now and then, one of the same form)."""
    kind = int(rng.integers(7))
    record = genuine(int(rng.integers(1, STEPS + 1)), rng)
    if kind == 0:  # one field hostile
        key = str(rng.choice(["step", "loss", "lr", "grad_norm", "tokens_per_s", "acc_k", "eval"]))
        record[key] = HOSTILE[int(rng.integers(len(HOSTILE)))]
        return _dumps(record)
    if kind == 1:  # an accuracy hostile, or far too many
        record.setdefault("acc_k", [0.5])
        if rng.random() < 0.5:
            record["acc_k"] = [0.5] * int(rng.integers(TTT_STEPS + 1, 20_000))
        else:
            record["acc_k"][0] = HOSTILE[int(rng.integers(len(HOSTILE)))]
        return _dumps(record)
    if kind == 2:  # random bytes, most of them not UTF-8
        return bytes(rng.integers(0, 256, int(rng.integers(1, 3000)), dtype=np.uint8)).replace(
            b"\n", b" "
        )
    if kind == 3:  # cut short
        line = _dumps(record)
        return line[: int(rng.integers(1, len(line)))]
    if kind == 4:  # nested past the recursion limit
        depth = int(rng.integers(1_000, 200_000))
        return b"[" * depth + b"]" * depth * int(rng.integers(2))
    if kind == 5:  # several MiB on one line
        return b'{"step": 1, "note": "' + b"x" * int(rng.integers(1 << 20, 6 << 20)) + b'"}'
    return _dumps(HOSTILE[int(rng.integers(len(HOSTILE)))])  # a bare value


@pytest.fixture
def run_dir(tmp_path: Path) -> RunDir:
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    run.run_json.write_text(
        json.dumps({"format": "eagle3kit-run", "version": 1, "config": {"ttt_steps": TTT_STEPS}})
    )
    return run


def _case(run: RunDir, n: int) -> None:
    rng = np.random.default_rng([SEED, n])
    own = [json.dumps(genuine(step, rng)).encode() for step in range(STEPS + 1)]
    lines = list(own)
    for _ in range(int(rng.integers(1, 6))):
        lines.insert(int(rng.integers(len(lines) + 1)), crafted(rng))
    run.metrics.write_bytes(b"".join(line + b"\n" for line in lines))

    curves = read_curves(run)
    assert len(curves["accuracy per TTT step"]) <= TTT_STEPS
    assert all(
        len(points) <= len(lines) for series in curves.values() for points in series.values()
    )
    run.cut_metrics(STEPS)
    kept = run.metrics.read_bytes().splitlines()
    assert [line for line in kept if line in own] == own


def _run(run: RunDir, cases: range) -> None:
    for n in cases:
        tracemalloc.start()
        start = time.monotonic()
        try:
            _case(run, n)
        except Exception as exc:
            raise AssertionError(f"case {n}: {type(exc).__name__}: {exc}") from exc
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        took = time.monotonic() - start
        assert took < TIME_LIMIT_S, f"case {n}: {took:.1f} s"
        assert peak < MEMORY_LIMIT, f"case {n}: peak {peak:,} bytes traced"


def test_fuzzed_metrics_lines_are_passed_over(run_dir: RunDir) -> None:
    _run(run_dir, range(CASES))


@pytest.mark.slow
def test_fuzzed_metrics_lines_are_passed_over_at_length(run_dir: RunDir) -> None:
    _run(run_dir, range(CASES, CASES + SLOW_CASES))

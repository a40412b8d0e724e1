"""Every script in benchmarks/ answers `--help`: its imports still resolve.

A benchmark imports what it uses at module top (tests/test_architecture.py holds that they
are faces and public names), so `--help` imports everything the script needs; a room moved or
a name renamed breaks this test instead of the next person who runs the benchmark. The list
is the folder's files: a new script is covered without being named here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import prewarmed
import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))


def test_the_folder_is_found() -> None:
    assert len(SCRIPTS) >= 14 and BENCHMARKS / "bench_bench.py" in SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_benchmark_answers_help(script: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [*prewarmed.script_argv(script), "--help"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: {script.name} [-h]"), done.stdout
    assert "Traceback" not in done.stderr


@pytest.mark.timeout(900)
def test_long_context_bench_quick_form(tmp_path: Path) -> None:
    """The long-context benchmark end to end in its quick form (a minute): the three
    trainings see the same tokens, and each gives an acceptance length per depth bucket."""
    done = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "long_context_bench.py"),
            "--quick",
            "--json",
            "--workdir",
            str(tmp_path / "work"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=840,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    variants = report["variants"]
    assert list(variants) == ["truncated", "whole", "window 32"]
    assert len({v["tokens"] for v in variants.values()}) == 1  # same tokens seen
    for v in variants.values():
        assert [d["bucket"] for d in v["depths"]] == ["<64", "64-128", ">=128", "all"]
        assert all(d["rounds"] > 0 and d["acceptance_length"] >= 1 for d in v["depths"])

"""Every script in benchmarks/ answers `--help`: its imports still resolve.

A benchmark imports what it uses at module top (tests/test_architecture.py holds that they
are faces and public names), so `--help` imports everything the script needs; a room moved or
a name renamed breaks this test instead of the next person who runs the benchmark. The list
is the folder's files: a new script is covered without being named here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPTS = sorted(BENCHMARKS.glob("*.py"))


def test_the_folder_is_found() -> None:
    assert len(SCRIPTS) >= 14 and BENCHMARKS / "bench_bench.py" in SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_benchmark_answers_help(script: Path, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=240)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: {script.name} [-h]"), done.stdout
    assert "Traceback" not in done.stderr

"""benchmarks/quality_bench.py --quick end to end (slow: a few minutes, and the speculators venv).

The run trains a tiny target, generates its data, trains eagle3kit and speculators drafters on
it and measures both with bench accept. Checked: the table and the JSON figures have every
row and field, and the figures are sane (acceptance lengths within [1, k+1], rates in [0, 1]
and falling with the position as a chain's must, tokens seen matched between the sides,
tokens/s positive). Not the 1.05x target: a quick run is too small to decide it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

REPO = Path(__file__).resolve().parent.parent
K = 3


def test_quick_run_prints_both_sides(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "quality_bench.py"),
            "--quick",
            "--json",
            "--build-venv",
            "--dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=3000,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    figures = json.loads(proc.stdout)
    table = proc.stderr
    assert "| eagle3kit [default] |" in table
    assert "| speculators 0.9.0 (CLI defaults) |" in table
    assert "acceptance length eagle3kit / speculators:" in table
    assert "train tokens/s eagle3kit / speculators:" in table
    assert "predicted acceptance length" in table

    assert figures["seeds"] == [0, 1]
    sides = figures["sides"]
    for name in ("ours", "peer"):
        side = sides[name]
        assert len(side["acceptance_length_per_seed"]) == 2
        for al in side["acceptance_length_per_seed"]:
            assert 1.0 <= al <= K + 1
        rates = side["per_position"]
        assert len(rates) == K and all(0.0 <= r <= 1.0 for r in rates)
        assert rates == sorted(rates, reverse=True)  # a chain accepts position j+1 only after j
        assert side["tokens_per_s"] > 0 and side["tokens"] > 0
        for run in figures["runs"][name].values():
            assert run["lossless"] is True
            # the acceptance length is 1 + the per-position rates' sum, per seed
            assert run["acceptance_length"] == pytest.approx(1 + sum(run["per_position"]), abs=1e-6)
    # matched budgets: both sides trained on as many tokens, within a batch's worth
    assert sides["ours"]["tokens"] == pytest.approx(sides["peer"]["tokens"], rel=0.1)
    assert figures["ratio"] == pytest.approx(
        sides["ours"]["acceptance_length"] / sides["peer"]["acceptance_length"]
    )
    assert 1.0 <= sides["ours"]["predicted"] <= K + 1
    assert abs(figures["predicted_vs_measured"]) < 0.5
    assert figures["data"]["samples"] == 40

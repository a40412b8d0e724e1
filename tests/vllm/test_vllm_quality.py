"""The quality table's drafters, judged by the engine: one seed's drafter of each tool, served
by the real vLLM engine in the reasoning world, at temperature 0 and 1.

docs/quality.md measures eagle3kit against speculators with `bench accept`. This module holds
that measure to the engine for both tools' drafters: the shipped reasoning world's target
(benchmarks/worlds/reasoning/target) served by vLLM with each drafter of
benchmarks/worlds/reasoning/drafters/ (eagle3kit's `train` defaults, exported; speculators
0.9.0's tuned recipe, its checkpoint as speculators wrote it; the same greedy data and 417
steps, seed 0), then `bench parity` on held-out prompts of the world: at temperature 0 the
engine's acceptance equals bench accept's, overall and per position, within 0.05; at
temperature 1 (vLLM's default rule, greedy drafts) the engine's acceptance length falls
inside bench accept's 99% interval and no draft position's rate stands apart. The servers
run with eagle3kit/bench/vllm_cpu_expand_fix/ first on PYTHONPATH: vLLM 0.32.0's CPU build
verifies sampled drafts against uninitialised memory otherwise (test_vllm_sampled.py).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from conftest import K, bench_parity, first_on_pythonpath

from eagle3kit import tiny_reasoning
from eagle3kit.bench.vllm_cpu_expand_fix import FOLDER as EXPAND_FIX

pytestmark = pytest.mark.vllm
WORLD = Path(__file__).resolve().parents[2] / "benchmarks" / "worlds" / "reasoning"
TARGET = WORLD / "target"
DRAFTERS = {
    "eagle3kit": WORLD / "drafters" / "eagle3kit",
    "speculators": WORLD / "drafters" / "speculators",
}
PROMPTS = 16
MAX_NEW_TOKENS = 256
"""16 held-out problems answered to 256 tokens: about 1,400 rounds a side at temperature 1,
the same tokens docs/quality.md's benchmark reads of each answer."""


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Problems of the world's held-out split (neither the target nor a drafter trained on
    them), drawn as the benchmark draws its own."""
    path = tmp_path_factory.mktemp("quality") / "heldout.jsonl"
    return tiny_reasoning.write_prompts(path, "heldout", PROMPTS, 0)


def serve(servers, tool: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")  # the gate reads the speculative config
    first_on_pythonpath(monkeypatch, EXPAND_FIX)
    spec = {"method": "eagle3", "model": str(DRAFTERS[tool]), "num_speculative_tokens": K}
    return servers.get(
        f"quality-{tool}",
        TARGET,
        ["--speculative-config", json.dumps(spec), "--enforce-eager"],
    )


def gate(url: str, tool: str, prompts: Path, temperature: float) -> tuple[int, dict, str]:
    started = time.monotonic()
    done = bench_parity(
        url,
        TARGET,
        DRAFTERS[tool],
        prompts,
        "--max-new-tokens",
        MAX_NEW_TOKENS,
        "--temperature",
        temperature,
        timeout=1500,
    )
    assert done.returncode in (0, 1), done.stderr[-3000:]
    report = json.loads(done.stdout)
    figures = {
        "engine": report["engine"]["acceptance_length"],
        "engine_per_position": report["engine"]["per_position"],
        "bench": report["offline"]["acceptance_length"],
        "bench_per_position": report["offline"]["per_position"],
        "interval": report["interval"],
        "seconds": round(time.monotonic() - started, 1),
    }
    print(f"\n{tool}, temperature {temperature:g}: {json.dumps(figures)}", file=sys.stderr)
    return done.returncode, report, " ".join(done.stderr.split())


@pytest.mark.parametrize("tool", list(DRAFTERS))
def test_each_tools_drafter_keeps_in_the_engine_what_bench_accept_says(
    tool: str, servers, prompts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    vllm = serve(servers, tool, monkeypatch)

    code, report, stderr = gate(vllm.url, tool, prompts, 0.0)
    assert code == 0, (report["findings"], report["differences"], stderr[-2000:])
    assert len(report["engine"]["per_position"]) == K
    assert abs(report["differences"]["acceptance_length"]) <= report["tolerance"]
    assert all(abs(d) <= report["tolerance"] for d in report["differences"]["per_position"])
    # a drafter of this target keeps drafts (one of another target, or broken, keeps ~none)
    assert report["engine"]["per_position"][0] > 0.3, report["engine"]

    code, report, stderr = gate(vllm.url, tool, prompts, 1.0)
    assert code == 0, (report["findings"], report["interval"], stderr[-2000:])
    assert report["verify"] == "onehot" and report["served"]["verify"] == "onehot"
    interval = report["interval"]
    assert interval["low"] <= report["engine"]["acceptance_length"] <= interval["high"]
    assert interval["positions"] == []
    assert interval["offline_rounds"] >= 1000 and interval["engine_rounds"] >= 1000

"""A drafter of speculators' layout (norm_before_fc, norm_before_residual, norm_output: the
defaults of speculators 0.9.0's trainer), trained by `train --variant speculators` on the
states `extract --engine vllm` read from the real server, exported for vLLM: the engine loads
it (its `input_norm`, the residual and post-norm feedback of `llama_eagle3.py`), speculates
with it, and `bench accept` and the parity gate measure what vLLM reports, within 0.05 overall
and per draft position. Served with the export configuration (`launch.eagle3_args`, eager).
"""

from __future__ import annotations

import json
from pathlib import Path

import launch
import pytest
from conftest import BENCH_PROMPTS, K, World

from eagle3kit import _ui, export
from eagle3kit.bench import parity
from eagle3kit.checkpoints.detect import inspect

QUIET = _ui.OutputOptions(quiet=True)
TOLERANCE = 0.05
MAX_NEW_TOKENS = 128

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="session")
def speculators_layout(hidden: Path, world: World) -> tuple[Path, dict]:
    """(the vLLM export, the train result's eval) of a `--variant speculators` drafter trained
    with the quickstart's settings."""
    import torch

    from eagle3kit import train
    from eagle3kit.quickstart import QuickstartConfig
    from eagle3kit.quickstart.stages import train_options

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = train.run(
            train.TrainConfig(
                [hidden],
                world.root / "run-speculators-layout",
                world.target,
                output=QUIET,
                variant="speculators",
                **train_options(QuickstartConfig()),
            )
        )
    finally:
        torch.set_num_threads(threads)
    out = world.root / "exports" / "speculators-layout"
    export.run(
        export.ExportConfig(
            world.root / "run-speculators-layout",
            out,
            format="vllm",
            target=world.target,
            num_speculative_tokens=K,
            output=QUIET,
        )
    )
    return out, result.eval


@pytest.mark.timeout(2400)  # run alone, its fixtures start three servers and train a drafter
def test_a_speculators_layout_export_speculates_in_vllm_as_bench_accept_predicts(
    servers, speculators_layout: tuple[Path, dict], world: World
) -> None:
    import torch

    where, trained = speculators_layout
    config = json.loads((where / "config.json").read_text())
    assert (
        config["norm_before_fc"],
        config["norm_before_residual"],
        config["norm_output"],
        config["fc_norm"],
    ) == (True, True, True, False)
    info = inspect(where, world.target)
    assert info.problems == [] and "input_norm.weight" in info.tensors
    assert trained["predicted_acceptance_length"] >= 1.8
    args = launch.eagle3_args(where, K)
    vllm = servers.get("eagle3-speculators-layout", world.target, [*args, "--enforce-eager"])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        report = parity.run(
            parity.ParityConfig(
                vllm.url,
                [world.bench_prompts],
                world.target,
                where,
                speculative_config=args[1],
                max_new_tokens=MAX_NEW_TOKENS,
                device="cpu",
                output=QUIET,
            )
        )
    finally:
        torch.set_num_threads(threads)
    engine, offline = report.engine, report.offline
    print(
        f"speculators layout on vLLM: engine {engine['acceptance_length']:.3f} "
        f"{engine['per_position']}, bench accept {offline['acceptance_length']:.3f} "
        f"{offline['per_position']}, predicted {trained['predicted_acceptance_length']:.3f}"
    )
    assert engine["requests"] == BENCH_PROMPTS and engine["errors"] == 0
    assert offline["lossless"] and offline["acceptance_length"] >= 1.8
    assert abs(engine["acceptance_length"] - offline["acceptance_length"]) <= TOLERANCE
    assert len(report.differences["per_position"]) == K
    assert all(abs(d) <= TOLERANCE for d in report.differences["per_position"])
    assert report.findings == [] and report.agree and report.passed, report.findings

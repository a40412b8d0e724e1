"""A sliding-window drafter in the real engine: vLLM applies the exported window as bench
accept does.

A drafter fitted with a window of WINDOW positions (the tests' few seconds of training-time
test on a tiny target's greedy continuations, as benchmarks/bench_bench.py makes one) is
exported for vLLM (`sliding_window` and `layer_types` in its transformer_layer_config) and
served by the CPU engine; the prompts and continuations run several times past the window.
`bench parity` holds the engine's acceptance, overall and per draft position, to bench
accept's with the window (exit 0); the same drafter read without its window (full
attention) predicts another acceptance length, so the agreement is the window's. One server
configuration of its own, no gen, extract or train: its start is most of the wall time.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import launch
import pytest
from conftest import K, bench_parity

from eagle3kit import _ui, export

pytestmark = pytest.mark.vllm
WINDOW = 12
PROMPTS = 6
MAX_NEW_TOKENS = 96
TOLERANCE = 0.05


@pytest.fixture(scope="module")
def windowed(vllm_env: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A random tiny target (head_dim 32, the CPU engine's smallest), a drafter fitted with
    a sliding window on its greedy continuations, its vLLM export, and the same drafter
    without the window; prompts from alpaca."""
    import torch
    from bench_fit import DATA, fit_drafter, greedy_sequences, subset
    from transformers import AutoModelForCausalLM

    from eagle3kit.checkpoints import save_drafter
    from eagle3kit.model import DrafterConfig, Eagle3Drafter
    from eagle3kit.tiny import make_target, make_tokenizer, stdlib_docstrings

    root = tmp_path_factory.mktemp("window")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        make_tokenizer(root / "tok", corpus=stdlib_docstrings(100_000))
        target = make_target(root / "target", root / "tok", seed=3)
        model = AutoModelForCausalLM.from_pretrained(target).eval()
        sequences = greedy_sequences(model, target, 6, 2 * MAX_NEW_TOKENS)
        torch.manual_seed(2)
        config = DrafterConfig.from_target(model.config)
        config.sliding_window = WINDOW
        drafter = Eagle3Drafter(config)
        drafter.load_target_embedding(model.get_input_embeddings().weight)
        fit_drafter(model, drafter, sequences, steps=150)
    finally:
        torch.set_num_threads(threads)
    save_drafter(drafter, root / "drafter")
    export.run(
        export.ExportConfig(
            root / "drafter",
            root / "export",
            format="vllm",
            target=target,
            verifier=str(target),
            num_speculative_tokens=K,
            output=_ui.OutputOptions(quiet=True),
        )
    )
    full = root / "full-attention"
    save_drafter(drafter, full)
    raw = json.loads((full / "config.json").read_text())
    raw["eagle3kit"]["drafter"]["sliding_window"] = None
    (full / "config.json").write_text(json.dumps(raw))
    prompts = subset(root / "prompts.jsonl", [DATA / "eagle/alpaca/question.jsonl"], PROMPTS)
    return {"target": target, "export": root / "export", "full": full, "prompts": prompts}


def test_vllm_serves_the_window_bench_accept_predicts(servers, windowed: dict[str, Path]) -> None:
    started = time.monotonic()
    layer = json.loads((windowed["export"] / "config.json").read_text())["transformer_layer_config"]
    assert (layer["sliding_window"], layer["layer_types"]) == (WINDOW, ["sliding_attention"])
    vllm = servers.get(
        "eagle3-sliding-window",
        windowed["target"],
        [*launch.eagle3_args(windowed["export"], K), "--enforce-eager"],
    )
    common = [
        str(windowed["prompts"]),
        "--target",
        str(windowed["target"]),
        "--max-new-tokens",
        str(MAX_NEW_TOKENS),
        "--device",
        "cpu",
        "--json",
        "--no-progress",
    ]
    gate = bench_parity(
        vllm.url,
        windowed["target"],
        windowed["export"],
        windowed["prompts"],
        "--max-new-tokens",
        MAX_NEW_TOKENS,
        "--tolerance",
        TOLERANCE,
        timeout=1200,
    )
    assert gate.returncode == 0, gate.stderr[-3000:]
    report = json.loads(gate.stdout)
    engine, offline = report["engine"], report["offline"]
    assert engine["errors"] == 0 and offline["lossless"]
    full = subprocess.run(
        [
            sys.executable,
            "-m",
            "eagle3kit",
            "bench",
            "accept",
            *common[:1],
            "--drafter",
            str(windowed["full"]),
            "--k",
            str(K),
            *common[1:],
        ],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert full.returncode == 0, full.stderr[-3000:]
    without = json.loads(full.stdout)["acceptance_length"]
    print(
        f"sliding window {WINDOW} on vLLM: engine {engine['acceptance_length']:.3f} "
        f"{engine['per_position']}, bench accept {offline['acceptance_length']:.3f} "
        f"{offline['per_position']}, full attention {without:.3f}; "
        f"{time.monotonic() - started:.0f} s with the server start"
    )
    assert abs(engine["acceptance_length"] - offline["acceptance_length"]) <= TOLERANCE
    assert abs(engine["acceptance_length"] - without) > TOLERANCE  # the window is served
    assert offline["acceptance_length"] > 1.3  # the drafter drafts something

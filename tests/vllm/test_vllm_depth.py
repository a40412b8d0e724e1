"""Acceptance by context depth, several thousand tokens deep, against the real engine.

The quickstart's target and its reduced-vocabulary drafter, both with max_position_embeddings
raised to 8192 (nothing else changed: RoPE needs no more), served by vLLM with
`--per-request-spec-decode-metrics detailed`: each answer then carries the engine's own
accepted count of every verification round, which bench server buckets by depth exactly as
bench accept buckets its own rounds (eagle3kit.model.depth). The contexts are cut from a
token dataset of multi-turn histories: gen's recorded samples (prompt + the target's own
completion) run together, 5K+ tokens each; `bench parity --context-from` cuts them at 1500,
3000 and 4500 tokens and at the start of each history's last answer. At temperature 0 both
sides decode the same tokens, so each depth bucket's acceptance length agrees within 0.05.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import launch
import numpy as np
import pytest
from conftest import K, World

from eagle3kit import _ui, export
from eagle3kit.format import Dataset, DatasetWriter, TokenSample

pytestmark = pytest.mark.vllm
LONG = 8192
HISTORY_TOKENS = 5000
HISTORIES = 2
CUTS = "1500,3000,4500,last-turn"
EDGES = "1024,2048,4096"
TOLERANCE = 0.05


@pytest.fixture(scope="module")
def long_target(world: World) -> Path:
    """The same weights and tokenizer, positions up to 8192 (RoPE needs no other change)."""
    out = world.root / "target-8k"
    if not out.exists():
        shutil.copytree(world.target, out)
        config = json.loads((out / "config.json").read_text())
        config["max_position_embeddings"] = LONG
        (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


@pytest.fixture(scope="module")
def histories(tokens: Path, world: World) -> Path:
    """Multi-turn histories: gen's samples in order, each prompt and completion as recorded,
    run together until a history holds HISTORY_TOKENS; the answers carry the loss mask."""
    out = world.root / "histories"
    if out.exists():
        return out
    recorded = Dataset(tokens)
    made: list[TokenSample] = []
    ids: list[int] = []
    mask: list[int] = []
    for sample in recorded:
        ids += [*map(int, sample.prompt_ids), *map(int, sample.completion_ids)]
        mask += [0] * len(sample.prompt_ids) + [1] * len(sample.completion_ids)
        if len(ids) >= HISTORY_TOKENS:
            split = int(np.flatnonzero(mask)[0])
            made.append(TokenSample(f"history-{len(made)}", ids[:split], ids[split:],
                                    loss_mask=mask))
            ids, mask = [], []
        if len(made) == HISTORIES:
            break
    assert len(made) == HISTORIES
    with DatasetWriter(out, config={"stage": "test"}) as writer:
        for sample in made:
            writer.add(sample)
    return out


@pytest.fixture(scope="module")
def long_export(drafters: dict, world: World) -> Path:
    """The reduced-vocabulary drafter exported against the target it trained with (export
    refuses another config), its positions then raised as the target's were."""
    out = world.root / "exports" / "reduced-8k"
    if not out.exists():
        export.run(export.ExportConfig(drafters["reduced"][0], out, format="vllm",
                                       target=world.target, num_speculative_tokens=K,
                                       output=_ui.OutputOptions(quiet=True)))
        config = json.loads((out / "config.json").read_text())
        config["transformer_layer_config"]["max_position_embeddings"] = LONG
        (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def test_depth_buckets_of_bench_and_of_the_engine_agree_thousands_of_tokens_deep(
        servers, long_target: Path, long_export: Path, histories: Path, tmp_path: Path
        ) -> None:
    vllm = servers.get("eagle3-reduced-8k", long_target, [
        *launch.eagle3_args(long_export, K), "--enforce-eager", "--max-model-len", str(LONG),
        "--per-request-spec-decode-metrics", "detailed"])
    started = time.monotonic()
    gate = subprocess.run(
        [sys.executable, "-m", "eagle3kit", "bench", "parity", "--server", vllm.url,
         "--target", str(long_target), "--drafter", str(long_export),
         "--context-from", str(histories), "--context-tokens", CUTS,
         "--depth-buckets", EDGES, "--max-new-tokens", "64", "--device", "cpu", "--json",
         "--no-progress"], capture_output=True, text=True, timeout=1200)
    seconds = time.monotonic() - started
    assert gate.returncode == 0, gate.stderr[-3000:]
    report = json.loads(gate.stdout)
    depths = report["depths"]
    # 1500 -> 1K-2K, 3000 -> 2K-4K, 4500 and the last answers (past 4K) -> >=4K.
    assert list(depths) == ["1K-2K", "2K-4K", ">=4K"], depths
    for name, side in depths.items():
        engine, offline = side["engine"], side["offline"]
        assert engine is not None and offline is not None, (name, side)
        assert abs(engine["rounds"] - offline["rounds"]) <= 0.05 * offline["rounds"], side
        assert abs(side["difference"]) <= TOLERANCE, (name, side)
    rounds = sum(d["offline"]["rounds"] for d in depths.values())
    assert rounds == report["offline"]["rounds"]
    print(f"\ndepth parity on vLLM ({seconds:.0f} s for bench parity): overall engine "
          f"{report['engine']['acceptance_length']:.3f}, bench "
          f"{report['offline']['acceptance_length']:.3f}; per bucket "
          + "; ".join(f"{n}: engine {d['engine']['acceptance_length']:.3f} "
                      f"({d['engine']['rounds']} rounds), bench "
                      f"{d['offline']['acceptance_length']:.3f} ({d['offline']['rounds']})"
                      for n, d in depths.items()))

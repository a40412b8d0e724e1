"""Every export `eagle3kit export` writes loads and speculates in the real engine, and the
acceptance vLLM reports is the one `bench accept` measures offline.

Drafters: trained by `train` (the quickstart's settings) on the states `extract --engine
vllm` read from the real server, once with a 512-token draft vocabulary and once with the
target's whole vocabulary. Each is exported with and without `--with-embedding` and served
with `--speculative-config '{"method": "eagle3", ...}'` (k = 3). On the held-out prompts
`bench server` reads vLLM's `vllm:spec_decode_*` counters and `bench accept` decodes the
same prompts offline: their acceptance lengths, overall and per draft position, agree
within 0.05 (for the last export, `bench parity` does both on its server). The embedding
is a bit-exact copy of the target's, so the exports with and without it speculate identically.

The full-vocabulary layout eagle3kit wrote before (d2t/t2d of the identity mapping) is
refused by vLLM at load; `eagle3kit info` flags it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import launch
import pytest
from conftest import BENCH_PROMPTS, K, World

from eagle3kit import _ui, export
from eagle3kit.bench import accept, result, server
from eagle3kit.checkpoints.detect import inspect
from eagle3kit.checkpoints.problems import FULL_VOCAB_D2T

QUIET = _ui.OutputOptions(quiet=True)
VARIANTS = [("reduced", False), ("reduced", True), ("full", False), ("full", True)]
TOLERANCE = 0.05
MAX_NEW_TOKENS = 128

pytestmark = pytest.mark.vllm


def variant_id(variant: tuple[str, bool]) -> str:
    return f"{variant[0]}{'-embedding' if variant[1] else ''}"


@pytest.fixture(scope="session")
def exports(drafters: dict, world: World) -> dict[tuple[str, bool], Path]:
    out = {}
    for name, embedding in VARIANTS:
        where = world.root / "exports" / variant_id((name, embedding))
        export.run(
            export.ExportConfig(
                drafters[name][0],
                where,
                format="vllm",
                with_embedding=embedding,
                target=world.target,
                num_speculative_tokens=K,
                output=QUIET,
            )
        )
        out[(name, embedding)] = where
    return out


@pytest.fixture(scope="session")
def offline(exports: dict, world: World) -> dict[str, result.AcceptReport]:
    """bench accept on the held-out prompts, per drafter (chain k=3, temperature 0)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {
            name: accept.run(
                accept.AcceptConfig(
                    world.target,
                    exports[(name, False)],
                    [world.bench_prompts],
                    k=K,
                    temperature=0.0,
                    max_new_tokens=MAX_NEW_TOKENS,
                    device="cpu",
                    output=QUIET,
                )
            )
            for name in ("reduced", "full")
        }
    finally:
        torch.set_num_threads(threads)


def test_the_full_vocabulary_export_has_no_identity_mapping(
    exports: dict, world: World, drafters: dict
) -> None:
    from safetensors import safe_open

    def names(path: Path) -> set[str]:
        with safe_open(str(path / "model.safetensors"), framework="pt") as f:
            return set(f.keys())

    vocab = json.loads((world.target / "config.json").read_text())["vocab_size"]
    full = json.loads((exports[("full", False)] / "config.json").read_text())
    assert full["draft_vocab_size"] == vocab
    assert not {"d2t", "t2d"} & names(exports[("full", False)])
    assert {"d2t", "t2d"} <= names(exports[("reduced", False)])
    assert "embed_tokens.weight" in names(exports[("full", True)])
    for where in exports.values():
        assert inspect(where, world.target).problems == []
    assert drafters["reduced"][1].eval["predicted_acceptance_length"] >= 1.8


@pytest.mark.parametrize("variant", VARIANTS[:-1], ids=variant_id)
def test_every_export_speculates_in_vllm_as_bench_accept_predicts(
    variant: tuple[str, bool], servers, exports: dict, offline: dict, world: World, tmp_path: Path
) -> None:
    vllm = servers.get(
        f"eagle3-{variant_id(variant)}",
        world.target,
        [*launch.eagle3_args(exports[variant], K), "--enforce-eager"],
    )
    online = server.run(
        server.ServerBenchConfig(
            vllm.url,
            [world.bench_prompts],
            world.target,
            api="vllm",
            max_new_tokens=MAX_NEW_TOKENS,
            temperature=0.0,
            output=QUIET,
        )
    )
    measured = offline[variant[0]]
    assert online.requests == BENCH_PROMPTS and online.errors == 0
    assert measured.lossless and measured.acceptance_length >= 1.8
    assert online.acceptance_length is not None
    assert abs(online.acceptance_length - measured.acceptance_length) <= TOLERANCE, (
        online.acceptance_length,
        measured.acceptance_length,
    )
    assert len(online.per_position) == len(measured.per_position) == K
    for engine, bench in zip(online.per_position, measured.per_position, strict=True):
        assert engine is not None and bench is not None
        assert abs(engine - bench) <= TOLERANCE, (online.per_position, measured.per_position)


def test_the_parity_gate_agrees_with_vllm_on_the_trained_drafter(
    servers, exports: dict, world: World
) -> None:
    """The last export (full vocabulary, with its embedding) served, and `bench parity` run
    on it: the gate reads the engine's counters over the held-out prompts and decodes them
    offline, which is the test above for this variant (so it is not run twice). The
    engine's figures and bench accept's within 0.05, overall and per position, and nothing
    in what vLLM serves (model, context length, chat template via /tokenize, the
    --speculative-config the server was started with) differs from the run."""
    from eagle3kit.bench import parity

    variant = VARIANTS[-1]
    args = launch.eagle3_args(exports[variant], K)
    vllm = servers.get(f"eagle3-{variant_id(variant)}", world.target, [*args, "--enforce-eager"])
    report = parity.run(
        parity.ParityConfig(
            vllm.url,
            [world.bench_prompts],
            world.target,
            exports[variant],
            speculative_config=args[1],
            max_new_tokens=MAX_NEW_TOKENS,
            device="cpu",
            output=QUIET,
        )
    )
    assert report.engine["requests"] == BENCH_PROMPTS and report.engine["errors"] == 0
    assert report.api == "vllm" and report.served["template_checked"]
    assert report.served["source"] == "--speculative-config"
    assert report.findings == [] and report.agree and report.passed, report.findings
    assert report.offline["acceptance_length"] >= 1.8
    assert len(report.differences["per_position"]) == K
    assert all(abs(d) <= TOLERANCE for d in report.differences["per_position"])
    assert abs(report.differences["acceptance_length"]) <= TOLERANCE
    assert set(report.phases) == {"think", "answer"}
    print(
        f"parity gate on vLLM: {report.to_dict()['differences']}, engine "
        f"{report.engine['acceptance_length']:.3f}, offline "
        f"{report.offline['acceptance_length']:.3f}, phases {report.phases}"
    )


def test_the_old_full_vocabulary_layout_is_refused_by_vllm_and_flagged_by_info(
    servers, exports: dict, world: World, tmp_path: Path
) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    old = tmp_path / "old-layout"
    shutil.copytree(exports[("full", False)], old)
    tensors = load_file(str(old / "model.safetensors"))
    vocab = tensors["lm_head.weight"].shape[0]
    tensors["d2t"] = torch.zeros(vocab, dtype=torch.int64)
    tensors["t2d"] = torch.ones(vocab, dtype=torch.bool)
    save_file(tensors, str(old / "model.safetensors"), metadata={"format": "pt"})

    info = subprocess.run(
        [sys.executable, "-m", "eagle3kit", "info", str(old)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert info.returncode == 1
    assert FULL_VOCAB_D2T in " ".join(info.stderr.split())

    servers.stop()
    refused = launch.VllmServer(
        world.target,
        [*launch.eagle3_args(old, K), "--enforce-eager"],
        name="eagle3-old-layout",
        log_dir=tmp_path,
    )
    with pytest.raises(RuntimeError, match="while starting"):
        refused.start()
    assert (
        "There is no module or parameter named 'draft_id_to_target_id'" in refused.log.read_text()
    )

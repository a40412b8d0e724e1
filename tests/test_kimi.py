"""The whole pipeline on a Kimi-K2-shaped target (eagle3kit.tiny_kimi.make_kimi_target): Multi-head
Latent Attention, routed + shared experts behind the noaux_tc sigmoid router, a dense first
layer, Kimi-K2's YaRN rope scaling, Kimi's chat markers, and a tokenizer that loads only
through its own code, so every stage runs with --trust-remote-code.

One target, trained once, and one run of every stage (real `eagle3kit` processes) serve the
whole module: gen (transformers engine), validate, extract, train offline and online, export
for vLLM and SGLang, bench accept and plan; then each stage told nothing refuses, naming the
flag.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import prewarmed
import pytest

from eagle3kit import tiny, tiny_kimi
from eagle3kit.quickstart.stages import STAGES

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LAYERS = [1, 2, 3]
"""Boundary ids for the 4-layer target (the default 2, N//2, N-3 needs 8 layers); all below N,
as vLLM captures only states entering a layer."""
TRUST = "--trust-remote-code"
REFUSAL = "ships its own code (tokenization_tiny_kimi.py); pass --trust-remote-code to run it"
PROMPTS, BENCH_PROMPTS = 16, 4


def eagle3kit(*args: object, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [*prewarmed.argv(), *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    if check:
        assert done.returncode == 0, done.stderr[-3000:]
    return done


def json_out(done: subprocess.CompletedProcess) -> dict:
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def kimi(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tiny_kimi.make_kimi_target(tmp_path_factory.mktemp("kimi") / "target")
    return tiny.train_target(target, trust_remote_code=True, **tiny_kimi.KIMI_TRAINING)


@pytest.fixture(scope="module")
def pipeline(kimi: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("pipeline")
    chats = tiny.prompts(PROMPTS + BENCH_PROMPTS)
    p = {
        "prompts": root / "prompts.jsonl",
        "bench_prompts": root / "heldout.jsonl",
        "tokens": root / "tokens",
        "hidden": root / "hidden",
        "run": root / "run",
        "online": root / "online",
        "export": root / "export",
        "plan": root / "plan",
    }
    for path, part in ((p["prompts"], chats[:PROMPTS]), (p["bench_prompts"], chats[PROMPTS:])):
        path.write_text("".join(json.dumps({"messages": m}) + "\n" for m in part))
    layers = ",".join(map(str, LAYERS))
    train = [
        "--ttt-steps",
        3,
        "--draft-vocab",
        256,
        "--batch-tokens",
        1024,
        "--lr",
        3e-3,
        "--warmup",
        0.1,
        "--eval-split",
        4,
        "--eval-every",
        0,
        "--device",
        "cpu",
        TRUST,
        "--no-progress",
        "--json",
    ]
    out = {"paths": p, "target": kimi}
    out["gen"] = json_out(
        eagle3kit(
            "gen",
            p["prompts"],
            p["tokens"],
            "--engine",
            "hf",
            "--target",
            kimi,
            "--temperature",
            0,
            "--max-tokens",
            64,
            TRUST,
            "--no-progress",
            "--json",
        )
    )
    out["validate"] = json_out(eagle3kit("validate", p["tokens"], TRUST, "--json", check=False))
    out["extract"] = json_out(
        eagle3kit(
            "extract",
            p["tokens"],
            p["hidden"],
            "--target",
            kimi,
            "--layers",
            layers,
            "--device",
            "cpu",
            TRUST,
            "--no-progress",
            "--json",
        )
    )
    out["train"] = json_out(
        eagle3kit("train", p["hidden"], p["run"], "--target", kimi, "--max-steps", 40, *train)
    )
    out["online"] = json_out(
        eagle3kit(
            "train",
            p["tokens"],
            p["online"],
            "--target",
            kimi,
            "--online",
            "--layers",
            layers,
            "--max-steps",
            4,
            *train,
        )
    )
    out["export"] = eagle3kit("export", p["run"], p["export"], "--format", "both", TRUST)
    out["bench"] = json_out(
        eagle3kit(
            "bench",
            "accept",
            p["bench_prompts"],
            "--target",
            kimi,
            "--drafter",
            p["export"] / "vllm",
            "--k",
            3,
            "--temperature",
            0,
            "--max-new-tokens",
            48,
            "--device",
            "cpu",
            TRUST,
            "--no-progress",
            "--json",
        )
    )
    out["plan"] = eagle3kit(
        "plan",
        p["prompts"],
        p["plan"],
        "--engine",
        "hf",
        "--target",
        kimi,
        "--max-tokens",
        64,
        "--pilot",
        4,
        "--layers",
        layers,
        TRUST,
        "--no-progress",
    )
    return out


def test_the_target_has_kimis_architecture_and_markers(kimi: Path) -> None:
    config = json.loads((kimi / "config.json").read_text())
    assert config["architectures"] == ["DeepseekV3ForCausalLM"]
    assert (config["kv_lora_rank"], config["qk_rope_head_dim"]) == (512, 64)  # vLLM's CPU MLA
    assert (config["topk_method"], config["scoring_func"]) == ("noaux_tc", "sigmoid")
    assert config["first_k_dense_replace"] == 1 and config["n_shared_experts"] == 1
    assert config["rope_scaling"] == tiny_kimi.KIMI_ROPE_SCALING and config["rope_theta"] == 50000
    tokenizer = json.loads((kimi / "tokenizer_config.json").read_text())
    assert tokenizer["auto_map"]["AutoTokenizer"][1] == "tokenization_tiny_kimi.TinyKimiTokenizer"
    assert (kimi / "tokenization_tiny_kimi.py").is_file()


def test_gen_and_validate_see_a_reasoning_target(pipeline: dict) -> None:
    gen, report = pipeline["gen"], pipeline["validate"]
    assert gen["total"] == PROMPTS
    profile = report["profile"]
    assert profile["think_start"] == "<think>" and profile["think_end"] == "</think>"
    assert profile["generation_prompt"] == "<|im_assistant|>assistant<|im_middle|><think>"
    failed = {c["name"] for c in report["checks"] if c["status"] == "fail"}
    assert not failed & {
        "integrity",
        "round_trip",
        "literal_markers",
        "structure",
        "vocabulary",
        "reasoning",
    }, failed


def test_extract_stores_the_chosen_layers_at_the_target_width(pipeline: dict) -> None:
    from eagle3kit.format import HiddenDataset

    hidden = HiddenDataset(pipeline["paths"]["hidden"])
    assert len(hidden) == PROMPTS
    assert list(hidden.layer_ids) == LAYERS and hidden.hidden_size == 256


def test_the_drafter_learns_the_targets_answers(pipeline: dict) -> None:
    train = pipeline["train"]
    before = train["initial_eval"]["predicted_acceptance_length"]
    after = train["eval"]["predicted_acceptance_length"]
    assert before < 1.3 < 1.8 <= after, (before, after)
    online = pipeline["online"]
    assert online["steps"] == 4
    run = json.loads((pipeline["paths"]["online"] / "run.json").read_text())
    assert run["layer_ids"] == LAYERS and run["layer_convention"] == "boundary"


def test_exports_carry_the_targets_layers_and_yarn(pipeline: dict) -> None:
    export = pipeline["paths"]["export"]
    yarn = {
        **{k: v for k, v in tiny_kimi.KIMI_ROPE_SCALING.items() if k != "type"},
        "rope_type": "yarn",
    }
    vllm = json.loads((export / "vllm" / "config.json").read_text())
    layer = vllm["transformer_layer_config"]
    assert vllm["eagle_aux_hidden_state_layer_ids"] == LAYERS
    assert vllm["speculators_config"]["verifier"]["architectures"] == ["DeepseekV3ForCausalLM"]
    sglang = json.loads((export / "sglang" / "config.json").read_text())
    assert sglang["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [x - 1 for x in LAYERS]
    for config in (layer, sglang):
        assert (config["hidden_size"], config["head_dim"]) == (256, 64)
        assert config["rope_theta"] == 50000 and config["rope_scaling"] == yarn
        assert config["max_position_embeddings"] == 131072
    # The drafter was trained with the YaRN it is exported with: no rope warning.
    assert "rope" not in pipeline["export"].stderr


def test_bench_measures_what_train_predicted(pipeline: dict) -> None:
    bench = pipeline["bench"]
    assert bench["lossless"] is True
    assert bench["acceptance_length"] >= 1.8, bench["acceptance_length"]


def test_plan_forecasts_the_run(pipeline: dict) -> None:
    plan = pipeline["plan"]
    assert plan.returncode == 0, plan.stderr[-2000:]
    assert "plan:" in plan.stderr and "hidden" in plan.stderr


@pytest.mark.parametrize("stage", ["gen", "extract", "bench", "plan"])
def test_each_stage_that_runs_the_tokenizers_code_refuses_by_name(
    stage: str, kimi: Path, pipeline: dict, tmp_path: Path
) -> None:
    p = pipeline["paths"]
    args = {
        "gen": ["gen", p["prompts"], tmp_path / "t", "--engine", "hf", "--target", kimi],
        "extract": [
            "extract",
            p["tokens"],
            tmp_path / "h",
            "--target",
            kimi,
            "--layers",
            "1,2,3",
            "--device",
            "cpu",
        ],
        "bench": [
            "bench",
            "accept",
            p["bench_prompts"],
            "--target",
            kimi,
            "--drafter",
            p["export"] / "vllm",
            "--device",
            "cpu",
        ],
        "plan": ["plan", p["prompts"], tmp_path / "p", "--engine", "hf", "--target", kimi],
    }[stage]
    done = eagle3kit(*args, check=False)
    assert done.returncode == 2, done.stderr[-2000:]
    # extract reads the tokenizer gen stored with the dataset (the same code, copied there);
    # the others the target's, named by the flag that gave it (--target, under --engine hf).
    where = (
        f"{p['tokens']}/tokenizer/tokenizer_config.json: its auto_map names code of its "
        "own (tokenization_tiny_kimi.py); pass --trust-remote-code to run it"
        if stage == "extract"
        else f"--target {kimi}: it {REFUSAL}"
    )
    assert done.stderr == f"error: {where}\n"


def test_train_and_export_run_none_of_the_tokenizers_code(pipeline: dict, tmp_path: Path) -> None:
    """The model is transformers' own DeepseekV3: the stages that read only its config and
    weights (and the dataset's ids) need no consent, and are not asked for one."""
    p = pipeline["paths"]
    eagle3kit(
        "train",
        p["hidden"],
        tmp_path / "r",
        "--target",
        pipeline["target"],
        "--max-steps",
        1,
        "--draft-vocab",
        64,
        "--eval-split",
        0,
        "--device",
        "cpu",
        "--quiet",
    )
    eagle3kit("export", p["run"], tmp_path / "e", "--quiet")
    assert (tmp_path / "e" / "model.safetensors").is_file()


def test_quickstart_runs_on_the_kimi_target(tmp_path: Path) -> None:
    """`quickstart --target-arch kimi`, at a size that checks the wiring: every stage told to
    trust the tokenizer's code (which quickstart wrote), extract given the 4-layer target's
    ids, and the by-hand commands saying both."""
    out = tmp_path / "qs"
    done = eagle3kit(
        "quickstart",
        out,
        "--target-arch",
        "kimi",
        "--prompts",
        4,
        "--bench-prompts",
        1,
        "--target-steps",
        4,
        "--train-steps",
        2,
        "--max-tokens",
        16,
        "--no-progress",
        "--json",
    )
    summary = json.loads(done.stdout)
    config = json.loads((out / "target" / "config.json").read_text())
    assert config["architectures"] == ["DeepseekV3ForCausalLM"]
    assert summary["samples"] == 4 and summary["measured_acceptance_length"] is not None
    commands = summary["commands"]
    assert "make_kimi_target" in commands["target"]
    assert "--layers 1,2,3" in commands["extract"]
    for stage in ("gen", "validate", "extract", "train", "export", "bench"):
        assert commands[stage].endswith("--trust-remote-code"), commands[stage]
    # Continued, the whole directory quickstart wrote passes its check of the code it holds.
    rerun = eagle3kit(
        "quickstart",
        out,
        "--target-arch",
        "kimi",
        "--prompts",
        4,
        "--bench-prompts",
        1,
        "--target-steps",
        4,
        "--train-steps",
        2,
        "--max-tokens",
        16,
        "--no-progress",
        "--json",
    )
    assert json.loads(rerun.stdout)["skipped"] == [n for n, _, _ in STAGES]
    again = eagle3kit(
        "quickstart",
        out,
        "--prompts",
        4,
        "--bench-prompts",
        1,
        "--target-steps",
        4,
        "--train-steps",
        2,
        "--max-tokens",
        16,
        check=False,
    )
    assert again.returncode == 2
    assert "other settings (--target-arch kimi -> llama)" in again.stderr

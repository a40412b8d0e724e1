"""`eagle3kit export`: the vLLM and SGLang layouts of CHECKPOINTS.md, written atomically,
checked on reload, and loaded back unchanged."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from typer.testing import CliRunner

from eagle3kit.checkpoints.detect import inspect
from eagle3kit.checkpoints.load import load_any
from eagle3kit.checkpoints.weights import target_embedding
from eagle3kit.cli import app
from eagle3kit.errors import UserError
from eagle3kit.export import ExportConfig, run

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location(
    "make_tiny_run", REPO / "examples" / "make_tiny_run.py"
)
make_tiny_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_tiny_run)

H, HQ, HKV, INTER, V, VD = 64, 64, 32, 128, 1026, 300
QUIET = ["--quiet"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("export")
    target, long_target, run_dir = root / "target", root / "target-long", root / "run"
    make_tiny_run.make_target(target)
    make_tiny_run.make_target(long_target, max_positions=40960)
    make_tiny_run.make_run(run_dir, target, [2, 4, 5])
    return {"root": root, "target": target, "long_target": long_target, "run": run_dir}


def cli(*args: str):
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result


def tensors(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        return {n: f.get_tensor(n) for n in f.keys()}  # noqa: SIM118


def source(tiny) -> dict[str, torch.Tensor]:
    model, _ = load_any(tiny["run"] / "drafter")
    return {n: t for n, t in model.state_dict().items() if n != "embed_tokens.weight"}


def test_both_layouts_are_written_checked_and_described(tiny, tmp_path):
    out = tmp_path / "out"
    result = run(ExportConfig(tiny["run"], out, format="both"))
    assert sorted(p.name for p in out.iterdir()) == ["sglang", "vllm"]
    assert [e.format for e in result.exports] == ["vllm", "sglang"]
    assert all(name for e in result.exports for name, _ in e.checks)
    assert not list(tmp_path.glob(".out.tmp-*"))  # the temp dir became OUT
    assert oct((out / "vllm" / "model.safetensors").stat().st_mode & 0o044) == oct(0o044)
    assert inspect(out / "vllm").layout == "speculators"
    assert inspect(out / "sglang").layout == "sglang"


def test_vllm_layout_is_the_speculators_one(tiny, tmp_path):
    out = tmp_path / "vllm"
    run(ExportConfig(tiny["run"], out, num_speculative_tokens=5))
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3"
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]  # boundary, from the run
    assert config["norm_before_residual"] is False  # written although false
    assert config["draft_vocab_size"] == VD and config["target_hidden_size"] is None
    layer = config["transformer_layer_config"]
    assert layer["vocab_size"] == V and layer["model_type"] == "llama"
    assert layer["num_hidden_layers"] == 1 and layer["use_cache"] is True
    assert layer["max_position_embeddings"] == 2048 and layer["rope_theta"] == 10000.0
    spec = config["speculators_config"]
    assert spec["algorithm"] == "eagle3" and spec["default_proposal_method"] == "greedy"
    assert spec["proposal_methods"][0]["speculative_tokens"] == 5
    assert spec["verifier"] == {
        "name_or_path": str(tiny["target"]),
        "architectures": ["LlamaForCausalLM"],
    }
    stored = tensors(out)
    assert "embed_tokens.weight" not in stored
    assert stored["d2t"].dtype == torch.int64 and stored["t2d"].dtype == torch.bool
    assert stored["layers.0.self_attn.q_proj.weight"].shape == (HQ, 2 * H)
    assert stored["fc.weight"].dtype == torch.bfloat16
    assert not any(n.startswith("midlayer.") for n in stored)


def test_sglang_layout_has_exactly_the_documented_tensors(tiny, tmp_path):
    """CHECKPOINTS.md §1 weights table, SGLang column; no embedding."""
    out = tmp_path / "sglang"
    run(ExportConfig(tiny["run"], out, format="sglang"))
    bf16 = torch.bfloat16
    expected = {
        "fc.weight": ((H, 3 * H), bf16),
        "midlayer.self_attn.q_proj.weight": ((HQ, 2 * H), bf16),
        "midlayer.self_attn.k_proj.weight": ((HKV, 2 * H), bf16),
        "midlayer.self_attn.v_proj.weight": ((HKV, 2 * H), bf16),
        "midlayer.self_attn.o_proj.weight": ((H, HQ), bf16),
        "midlayer.mlp.gate_proj.weight": ((INTER, H), bf16),
        "midlayer.mlp.up_proj.weight": ((INTER, H), bf16),
        "midlayer.mlp.down_proj.weight": ((H, INTER), bf16),
        "midlayer.input_layernorm.weight": ((H,), bf16),
        "midlayer.hidden_norm.weight": ((H,), bf16),
        "midlayer.post_attention_layernorm.weight": ((H,), bf16),
        "norm.weight": ((H,), bf16),
        "lm_head.weight": ((VD, H), bf16),
        "d2t": ((VD,), torch.int64),
        "t2d": ((V,), torch.bool),
    }
    stored = {n: (tuple(t.shape), t.dtype) for n, t in tensors(out).items()}
    assert stored == expected
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]  # boundary, for vLLM
    assert (config["vocab_size"], config["draft_vocab_size"]) == (V, VD)
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 2, 0)
    assert config["hidden_size"] == H and config["torch_dtype"] == "bfloat16"


@pytest.mark.parametrize("fmt", ["vllm", "sglang"])
def test_exports_load_back_with_identical_tensors(tiny, tmp_path, fmt):
    want = source(tiny)
    exact = tmp_path / "fp32"
    run(ExportConfig(tiny["run"], exact, format=fmt, dtype="fp32"))
    model, info = load_any(exact)
    assert info.aux_layer_ids == [2, 4, 5]
    got = model.state_dict()
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name
    halved = tmp_path / "bf16"
    run(ExportConfig(tiny["run"], halved, format=fmt))
    got = load_any(halved)[0].state_dict()
    for name, tensor in want.items():
        expected = (
            tensor.to(torch.bfloat16).to(tensor.dtype) if tensor.is_floating_point() else tensor
        )
        assert torch.equal(got[name], expected), name


def test_an_export_exports_again_unchanged(tiny, tmp_path):
    """An export is itself a source (a third-party checkpoint is converted the same way)."""
    run(
        ExportConfig(
            tiny["run"], tmp_path / "a", format="sglang", dtype="fp32", verifier="org/target"
        )
    )
    run(ExportConfig(tmp_path / "a", tmp_path / "b", dtype="fp32", verifier="org/target"))
    assert tensors(tmp_path / "b").keys() == tensors(tiny["run"] / "drafter").keys()
    for name, t in tensors(tiny["run"] / "drafter").items():
        assert torch.equal(tensors(tmp_path / "b")[name], t), name


def test_target_settings_are_copied_from_the_target(tiny, tmp_path):
    """The drafter recorded 2048 positions; the target it is served with has 40960."""
    with pytest.raises(UserError, match="not the target the run was trained against"):
        _mismatched_target(tiny, tmp_path)
    long_run = tmp_path / "long-run"
    make_tiny_run.make_run(long_run, tiny["long_target"], [2, 4, 5])
    cfg = json.loads((long_run / "drafter" / "config.json").read_text())
    cfg["eagle3kit"]["drafter"]["max_position_embeddings"] = 2048  # trained short
    (long_run / "drafter" / "config.json").write_text(json.dumps(cfg))
    assert any("shorter" in p for p in inspect(long_run / "drafter").problems)
    run(ExportConfig(long_run, tmp_path / "both", format="both"))
    for fmt in ("vllm", "sglang"):
        config = json.loads((tmp_path / "both" / fmt / "config.json").read_text())
        layer = config.get("transformer_layer_config", config)
        assert layer["max_position_embeddings"] == 40960
        assert layer["rope_parameters"] == {"rope_theta": 10000.0, "rope_type": "default"}


def test_a_run_recording_the_older_target_keys_is_checked_on_its_fingerprint(tiny, tmp_path):
    """Runs train wrote before the one identity record carry a fingerprint but no config
    hash: export compares what they carry."""
    old = tmp_path / "old-run"
    shutil.copytree(tiny["run"], old)
    record = json.loads((old / "run.json").read_text())
    keys = (
        "path",
        "name_or_path",
        "architectures",
        "model_type",
        "num_layers",
        "hidden_size",
        "vocab_size",
        "fingerprint",
    )
    record["target"] = {k: record["target"][k] for k in keys}
    (old / "run.json").write_text(json.dumps(record))
    run(ExportConfig(old, tmp_path / "ok", target=tiny["target"]))
    assert (tmp_path / "ok" / "config.json").is_file()
    record["target"]["fingerprint"] = "0123456789abcdef"
    (old / "run.json").write_text(json.dumps(record))
    with pytest.raises(
        UserError,
        match=r"not the target the run was trained against "
        r"\(fingerprint [0-9a-f]+, the run recorded 0123",
    ):
        run(ExportConfig(old, tmp_path / "bad", target=tiny["target"]))


def _mismatched_target(tiny, tmp_path):
    other = tmp_path / "other-target"
    make_tiny_run.make_target(other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["num_hidden_layers"] = 12
    (other / "config.json").write_text(json.dumps(cfg))
    run(ExportConfig(tiny["run"], tmp_path / "x", target=other))


def test_with_embedding_writes_the_targets_embedding_bit_exact(tiny, tmp_path):
    out = tmp_path / "emb"
    run(ExportConfig(tiny["run"], out, with_embedding=True))
    stored = tensors(out)["embed_tokens.weight"]
    reference = target_embedding(tiny["target"])
    assert stored.dtype == reference.dtype == torch.float32  # the target's dtype, not bf16
    assert torch.equal(stored, reference)
    assert inspect(out, tiny["target"]).problems == []


def test_ids_never_come_from_a_default(tiny, tmp_path):
    run(ExportConfig(tiny["run"], tmp_path / "sg", format="sglang", dtype="fp32"))
    config = json.loads((tmp_path / "sg" / "config.json").read_text())
    del config["eagle_config"], config["eagle_aux_hidden_state_layer_ids"]
    (tmp_path / "sg" / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="never falls back"):
        run(ExportConfig(tmp_path / "sg", tmp_path / "x"))
    assert not (tmp_path / "x").exists()
    run(ExportConfig(tmp_path / "sg", tmp_path / "y", layers=[3, 4, 6]))
    written = json.loads((tmp_path / "y" / "config.json").read_text())
    assert written["eagle_aux_hidden_state_layer_ids"] == [3, 4, 6]
    with pytest.raises(UserError, match="trained on layers"):
        run(ExportConfig(tiny["run"], tmp_path / "z", layers=[3, 4, 6]))


def test_overwrite_is_explicit_and_atomic(tiny, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = cli("export", tiny["run"], out, *QUIET)
    assert result.exit_code == 2 and "--overwrite" in result.stderr
    assert (out / "keep.txt").read_text() == "mine"
    # a folder that is not an earlier export is replaced only when --overwrite-dir names it
    result = cli("export", tiny["run"], out, "--overwrite", *QUIET)
    assert result.exit_code == 2 and "--overwrite-dir" in result.stderr
    # a failing export leaves OUT as it was, even when named
    result = cli("export", tiny["run"], out, "--overwrite-dir", out, "--layers", "1,2,3", *QUIET)
    assert result.exit_code == 2 and (out / "keep.txt").exists()
    assert cli("export", tiny["run"], out, "--overwrite-dir", out, *QUIET).exit_code == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md",
        "config.json",
        "eagle3kit-export.json",
        "model.safetensors",
    ]
    assert not list(tmp_path.glob(".out.tmp-*"))


@pytest.mark.parametrize(
    "args, message",
    [
        (["--format", "onnx"], "--format 'onnx': expected one of vllm, sglang, both"),
        (["--dtype", "int8"], "--dtype int8: expected one of bfloat16, float16, float32"),
        (["--num-speculative-tokens", "0"], "--num-speculative-tokens must be >= 1"),
        (["--format", "sglang", "--with-embedding"], "--with-embedding: the SGLang layout"),
        (["--layers", "2,x"], "--layers 2,x: expected comma-separated integers"),
        (["--layers", "2,2,5"], "--layers 2,2,5: ids must be distinct and increasing"),
        (["--target", "/nonexistent"], "--target /nonexistent: not a model directory"),
    ],
)
def test_bad_options_end_in_one_message(tiny, tmp_path, args, message):
    result = cli("export", tiny["run"], tmp_path / "o", *args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_bad_sources_end_in_one_message(tiny, tmp_path):
    assert "no such run directory" in cli("export", tmp_path / "none", tmp_path / "o").stderr
    empty_run = tmp_path / "run"
    empty_run.mkdir()
    (empty_run / "run.json").write_text("{}")
    result = cli("export", empty_run, tmp_path / "o")
    assert result.exit_code == 2 and "the run has no drafter yet" in result.stderr
    (empty_run / "run.json").write_text("{not json")
    result = cli("export", empty_run, tmp_path / "o")
    assert result.exit_code == 2 and "run.json: not valid JSON" in result.stderr
    result = cli("export", tiny["target"], tmp_path / "o")  # a model, not a drafter
    assert result.exit_code == 2 and "not a checkpoint layout" in result.stderr
    assert "Traceback" not in result.stderr


def test_json_result(tiny, tmp_path):
    result = cli("export", tiny["run"], tmp_path / "o", "--format", "both", "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert [e["format"] for e in data["exports"]] == ["vllm", "sglang"]
    assert data["exports"][1]["aux_layer_ids_output"] == [1, 3, 4]


def test_the_training_prediction_travels_with_the_export(tiny, tmp_path):
    """bench accept on an exported drafter shows what training predicted for it."""
    import json
    import shutil

    from eagle3kit.bench.accept_load import training_prediction

    run_dir = tmp_path / "run"
    shutil.copytree(tiny["run"], run_dir)
    config_file = run_dir / "drafter" / "config.json"
    config = json.loads(config_file.read_text())
    evaluation = {
        "k": 3,
        "temperature": 0,
        "predicted_acceptance_length": 2.5,
        "per_position": [0.8, 0.6, 0.5],
        "step": 10,
    }
    config["eagle3kit"]["eval"] = evaluation
    config_file.write_text(json.dumps(config))
    run(ExportConfig(run_dir, tmp_path / "out", format="both"))
    for fmt in ("vllm", "sglang"):
        assert training_prediction(tmp_path / "out" / fmt) == evaluation
    assert training_prediction(tiny["run"] / "drafter") is None  # none recorded, none shown


def test_a_full_vocabulary_is_written_without_d2t_and_t2d(tiny, tmp_path):
    """vLLM creates draft_id_to_target_id only when the draft vocabulary is smaller than the
    target's and refuses a full-vocabulary d2t at load (tests/vllm/test_vllm_export.py shows
    it against the real engine): the identity mapping is left out, as speculators does."""
    run_dir = tmp_path / "run-full"
    make_tiny_run.make_run(run_dir, tiny["target"], [2, 4, 5], draft_vocab=V)
    out = tmp_path / "out"
    run(ExportConfig(run_dir, out, format="both"))
    model, _ = load_any(run_dir / "drafter")
    for fmt in ("vllm", "sglang"):
        written = tensors(out / fmt)
        assert not {"d2t", "t2d"} & set(written)
        assert json.loads((out / fmt / "config.json").read_text())["draft_vocab_size"] == V
        assert inspect(out / fmt).problems == []
        back, _ = load_any(out / fmt)
        assert torch.equal(back.d2t, torch.zeros(V, dtype=torch.long))
        assert torch.equal(back.lm_head.weight, model.lm_head.weight.to(torch.bfloat16).float())


def test_a_permuted_full_vocabulary_is_folded_into_lm_head(tiny, tmp_path):
    """A full vocabulary in frequency order (ModelOpt's): row t of the export drafts id t."""
    from eagle3kit.checkpoints.native import save_drafter

    run_dir = tmp_path / "run-permuted"
    make_tiny_run.make_run(run_dir, tiny["target"], [2, 4, 5], draft_vocab=V)
    model, _ = load_any(run_dir / "drafter")
    order = torch.randperm(V, generator=torch.Generator().manual_seed(0))
    model.set_vocab(order - torch.arange(V), torch.ones(V, dtype=torch.bool))
    config = json.loads((run_dir / "drafter" / "config.json").read_text())["eagle3kit"]
    save_drafter(
        model, run_dir / "drafter", extra={k: v for k, v in config.items() if k != "drafter"}
    )
    run(ExportConfig(run_dir, tmp_path / "out", dtype="fp32"))
    written = tensors(tmp_path / "out")
    assert "d2t" not in written
    assert torch.equal(written["lm_head.weight"][order], model.lm_head.weight)


def test_serving_more_drafts_than_were_trained_warns(tiny, tmp_path):
    """A drafter learns only --ttt-steps chain positions: an export asking the engine for
    more warns, whether run.json or the drafter's own config.json says so; a value that is
    not a step count (someone else's file) says nothing."""
    run_dir = tmp_path / "run"
    shutil.copytree(tiny["run"], run_dir)
    run_json = run_dir / "run.json"
    recorded = json.loads(run_json.read_text())

    def untrained(*extra: str, source: Path = run_dir) -> list[str]:
        out = tmp_path / f"out-{len(list(tmp_path.iterdir()))}"
        result = cli("export", source, out, "--json", *extra)
        assert result.exit_code == 0, result.stderr
        return [w for w in json.loads(result.stdout)["warnings"] if "--ttt-steps" in w]

    run_json.write_text(json.dumps({**recorded, "config": {"ttt_steps": 2}}))
    assert untrained() == [
        "--num-speculative-tokens 3: the drafter was trained for 2 draft steps (--ttt-steps), "
        "so every draft after the first 2 of a chain was never trained and is rarely kept; "
        "train with --ttt-steps 3 to serve that many"
    ]
    assert untrained("--num-speculative-tokens", "2") == []
    for hostile in ("2", True, -1, None):
        run_json.write_text(json.dumps({**recorded, "config": {"ttt_steps": hostile}}))
        assert untrained("--num-speculative-tokens", "5") == []
    # A drafter copied out of its run: its config.json's training block says it.
    drafter = tmp_path / "drafter"
    shutil.copytree(run_dir / "drafter", drafter)
    config = json.loads((drafter / "config.json").read_text())
    config["eagle3kit"]["training"] = {"ttt_steps": 4}
    (drafter / "config.json").write_text(json.dumps(config))
    assert len(untrained("--num-speculative-tokens", "5", source=drafter)) == 1
    assert untrained("--num-speculative-tokens", "4", source=drafter) == []


def test_info_flags_the_full_vocabulary_layout_vllm_refuses(tiny, tmp_path):
    from safetensors.torch import save_file

    run_dir = tmp_path / "run-full"
    make_tiny_run.make_run(run_dir, tiny["target"], [2, 4, 5], draft_vocab=V)
    run(ExportConfig(run_dir, tmp_path / "out", format="both"))
    for fmt in ("vllm", "sglang"):  # as eagle3kit wrote them before: the identity mapping
        old = tensors(tmp_path / "out" / fmt)
        old["d2t"] = torch.zeros(V, dtype=torch.int64)
        old["t2d"] = torch.ones(V, dtype=torch.bool)
        save_file(old, str(tmp_path / "out" / fmt / "model.safetensors"))
    vllm_layout = cli("info", tmp_path / "out" / "vllm")
    assert vllm_layout.exit_code == 1
    flat = " ".join(vllm_layout.output.split())
    assert (
        "the draft vocabulary is the target's whole vocabulary, yet the checkpoint has d2t" in flat
        and "vLLM refuses to load it" in flat
    )
    sglang = inspect(tmp_path / "out" / "sglang")  # SGLang reads it; vLLM would not
    assert sglang.problems == []
    assert any("when vLLM serves it" in w for w in sglang.warnings)
    load_any(tmp_path / "out" / "vllm")  # eagle3kit itself still reads the old layout


def _windowed_run(tiny, tmp_path, window: int = 64, target: Path | None = None) -> Path:
    """The tiny run with a drafter trained with a sliding window (train --sliding-window)."""
    run_dir = tmp_path / "windowed-run"
    if target is None:
        shutil.copytree(tiny["run"], run_dir)
    else:
        make_tiny_run.make_run(run_dir, target, [2, 4, 5])
    config_file = run_dir / "drafter" / "config.json"
    config = json.loads(config_file.read_text())
    config["eagle3kit"]["drafter"]["sliding_window"] = window
    config_file.write_text(json.dumps(config))
    return run_dir


def test_a_sliding_window_is_exported_where_the_engines_read_it(tiny, tmp_path, capsys):
    """vLLM's Llama attention applies `sliding_window` to the draft layers `layer_types`
    names sliding_attention; SGLang takes the window from its launch flag only (counting
    the keys before the query's own), which the card's launch line and a warning give."""
    run(ExportConfig(_windowed_run(tiny, tmp_path), tmp_path / "out", format="both"))
    vllm = json.loads((tmp_path / "out" / "vllm" / "config.json").read_text())
    sglang = json.loads((tmp_path / "out" / "sglang" / "config.json").read_text())
    for layer in (vllm["transformer_layer_config"], sglang):
        assert (layer["sliding_window"], layer["layer_types"]) == (64, ["sliding_attention"])
    assert (
        "warning: sliding window of 64: SGLang takes a draft's window from its launch "
        "flag, not from config.json; serve with --speculative-draft-window-size 63"
        in capsys.readouterr().err
    )
    card = (tmp_path / "out" / "sglang" / "README.md").read_text()
    assert "--speculative-num-draft-tokens 4 --speculative-draft-window-size 63" in card
    assert "- attention: a sliding window of 64 positions" in card
    for fmt in ("vllm", "sglang"):
        model, info = load_any(tmp_path / "out" / fmt)
        assert info.sliding_window == 64 and model.config.sliding_window == 64, fmt
    # A drafter without a window writes the configs as before.
    run(ExportConfig(tiny["run"], tmp_path / "full", format="vllm"))
    plain = json.loads((tmp_path / "full" / "config.json").read_text())
    assert not {"sliding_window", "layer_types"} & set(plain["transformer_layer_config"])
    assert load_any(tmp_path / "full")[1].sliding_window is None


def test_info_shows_the_sliding_window(tiny, tmp_path):
    run(ExportConfig(_windowed_run(tiny, tmp_path), tmp_path / "out", format="both"))
    result = cli("info", tmp_path / "out", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["checkpoints"][0]["sliding_window"] == 64
    result = cli("info", tmp_path / "out")
    assert "sliding window of 64 positions" in result.stderr
    result = cli("info", tiny["run"])
    assert "every earlier position" in result.stderr


def test_a_yarn_targets_rope_scaling_is_exported_and_applied(tiny, tmp_path):
    """A drafter for a YaRN target carries the target's rope scaling and its positions up
    to the target's length, and rotates its queries and keys with it, as vLLM does."""
    target = tmp_path / "yarn-target"
    make_tiny_run.make_target(target, max_positions=32768)
    config = json.loads((target / "config.json").read_text())
    yarn = {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_theta": 10000.0,
    }
    config.pop("rope_scaling", None)
    config["rope_parameters"] = yarn
    (target / "config.json").write_text(json.dumps(config))
    run(ExportConfig(_windowed_run(tiny, tmp_path, target=target), tmp_path / "out", format="both"))
    for fmt in ("vllm", "sglang"):
        written = json.loads((tmp_path / "out" / fmt / "config.json").read_text())
        layer = written.get("transformer_layer_config", written)
        assert layer["rope_parameters"] == yarn and layer["max_position_embeddings"] == 32768
        model, _ = load_any(tmp_path / "out" / fmt)
        assert model.rope_factor == pytest.approx(1 + 0.1 * math.log(4.0)), fmt

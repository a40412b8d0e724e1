"""Every checkpoint layout of CHECKPOINTS.md is recognised and loads into the same drafter;
the loading failures of CHECKPOINTS.md §5 are each reported."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, LlamaConfig
from typer.testing import CliRunner

from eagle3kit.checkpoints.detect import checkpoint_problems, inspect
from eagle3kit.checkpoints.load import load_any
from eagle3kit.checkpoints.native import save_drafter
from eagle3kit.cli import app
from eagle3kit.errors import UserError
from eagle3kit.export import ExportConfig, run
from eagle3kit.model import DrafterConfig, Eagle3Drafter, build_vocab, config_fingerprint

N, V, VD, H = 8, 97, 40, 32


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("target")
    config = LlamaConfig(
        vocab_size=V,
        hidden_size=H,
        intermediate_size=64,
        num_hidden_layers=N,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def drafter(target) -> Eagle3Drafter:
    from transformers import AutoConfig

    config = DrafterConfig.from_target(
        AutoConfig.from_pretrained(target),
        draft_vocab_size=VD,
        aux_layer_ids=[2, 4, 5],
        target_name_or_path=str(target),
    )
    torch.manual_seed(1)
    model = Eagle3Drafter(config)
    for p in model.trainable_parameters():
        torch.nn.init.normal_(p, std=0.3)
    vocab = build_vocab(np.random.default_rng(0).integers(0, 9, V), VD)
    model.set_vocab(torch.from_numpy(vocab.d2t), torch.from_numpy(vocab.t2d))
    return model


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, drafter, target) -> Path:
    from transformers import AutoConfig

    out = tmp_path_factory.mktemp("run")
    identity = {
        "path": str(target),
        "name_or_path": str(target),
        "architectures": ["LlamaForCausalLM"],
        "fingerprint": config_fingerprint(AutoConfig.from_pretrained(target)),
    }
    save_drafter(drafter, out / "drafter", extra={"target": identity, "layer_ids": [2, 4, 5]})
    (out / "run.json").write_text(json.dumps({"target": identity, "layer_ids": [2, 4, 5]}))
    return out


@pytest.fixture(scope="module")
def exports(tmp_path_factory, run_dir) -> Path:
    out = tmp_path_factory.mktemp("exports") / "out"
    run(ExportConfig(run_dir, out, format="both", dtype="fp32"))
    return out


def weights_of(model: Eagle3Drafter) -> dict[str, torch.Tensor]:
    return {n: t.clone() for n, t in model.state_dict().items() if n != "embed_tokens.weight"}


def third_party(
    tmp: Path,
    name: str,
    model: Eagle3Drafter,
    config: dict,
    *,
    midlayer: bool = False,
    drop: tuple[str, ...] = (),
    bin_file: bool = False,
    extra: dict | None = None,
) -> Path:
    """A checkpoint directory with `config` and the drafter's tensors under other names."""
    out = tmp / name
    out.mkdir()
    tensors = {
        ("midlayer." + n[len("layers.0.") :] if midlayer and n.startswith("layers.0.") else n): t
        for n, t in weights_of(model).items()
        if n not in drop
    }
    tensors.update(extra or {})
    if bin_file:
        torch.save(tensors, out / "pytorch_model.bin")
    else:
        save_file(tensors, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config))
    return out


def llama_fields(model: Eagle3Drafter, max_positions: int = 2048) -> dict:
    c = model.config
    return {
        "model_type": "llama",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "num_hidden_layers": 1,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "max_position_embeddings": max_positions,
        "vocab_size": V,
        "draft_vocab_size": VD,
    }


def assert_same(model: Eagle3Drafter, reference: Eagle3Drafter) -> None:
    got = model.state_dict()
    for name, tensor in weights_of(reference).items():
        assert torch.equal(got[name], tensor), name


def test_eagle3kit_run_and_exports(run_dir, exports, drafter, target):
    for path, layout in (
        (run_dir / "drafter", "eagle3kit"),
        (exports / "vllm", "speculators"),
        (exports / "sglang", "sglang"),
    ):
        model, info = load_any(path)
        assert info.layout == layout and info.problems == [], (layout, info.problems)
        assert info.aux_layer_ids == [2, 4, 5] and info.aux_layer_ids_output == [1, 3, 4]
        assert not info.norm_before_residual
        assert_same(model, drafter)


def test_original_eagle3_bin_without_ids(tmp_path, drafter, target):
    """SafeAILab's layout: midlayer.*, pytorch_model.bin, no layer ids, 2048 positions."""
    config = {"architectures": ["LlamaForCausalLMEagle3"], **llama_fields(drafter)}
    path = third_party(tmp_path, "eagle3", drafter, config, midlayer=True, bin_file=True)
    with pytest.raises(UserError, match="no aux layer ids and no target"):
        load_any(path)
    model, info = load_any(path, target_config=target)
    assert info.layout == "eagle3"
    assert info.aux_layer_ids == [2, N // 2, N - 3]  # the engines' default, flagged
    assert info.layer_ids_source == "engine default"
    assert any(p.startswith("no aux layer ids") for p in info.problems)
    assert any("max_position_embeddings 2048 is shorter" in p for p in info.problems)
    assert not info.norm_before_residual  # the reference convention
    assert_same(model, drafter)


def test_specforge_ids_are_layer_output_ids(tmp_path, drafter):
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        **llama_fields(drafter),
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 4]},
    }
    model, info = load_any(third_party(tmp_path, "sf", drafter, config, midlayer=True))
    assert (info.layout, info.aux_layer_ids, info.problems) == ("sglang", [2, 4, 5], [])
    assert_same(model, drafter)


def test_modelopt_layout_with_d2t_only(tmp_path, drafter):
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        **llama_fields(drafter),
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": [1, 3, 4],
            "use_aux_hidden_state": True,
            "use_last_layernorm": True,
        },
    }
    model, info = load_any(third_party(tmp_path, "mo", drafter, config, drop=("t2d",)))
    assert (info.layout, info.aux_layer_ids) == ("modelopt", [2, 4, 5])
    assert_same(model, drafter)  # t2d rebuilt from d2t


def test_speculators_layout_missing_norm_before_residual_means_true(tmp_path, drafter):
    config = {
        "speculators_model_type": "eagle3",
        "draft_vocab_size": VD,
        "eagle_aux_hidden_state_layer_ids": [2, 4, 5],
        "transformer_layer_config": llama_fields(drafter, 4096),
        "speculators_config": {
            "proposal_methods": [{"speculative_tokens": 3}],
            "verifier": {"name_or_path": "org/x"},
        },
    }
    model, info = load_any(third_party(tmp_path, "sp", drafter, config))
    assert info.norm_before_residual is True  # what vLLM assumes
    assert model.config.norm_before_residual is True
    assert any(p.startswith("norm_before_residual missing") for p in info.problems)


def test_eagle1_is_recognised_and_refused(tmp_path):
    out = tmp_path / "e1"
    out.mkdir()
    save_file(
        {
            "fc.weight": torch.zeros(H, 2 * H),
            "fc.bias": torch.zeros(H),
            "layers.0.self_attn.q_proj.weight": torch.zeros(H, H),
            "norm.weight": torch.ones(H),
        },
        str(out / "model.safetensors"),
    )
    (out / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": H})
    )
    info = inspect(out)
    assert info.layout == "eagle1" and "not an EAGLE-3 checkpoint" in info.problems[0]
    with pytest.raises(UserError, match="not an EAGLE-3 checkpoint"):
        load_any(out)


class Payload:
    """A pickle that would write a file when unpickled by a plain torch.load."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "executed"))


def test_pickles_other_than_tensors_are_refused_unexecuted(tmp_path, drafter):
    config = {"architectures": ["LlamaForCausalLMEagle3"], **llama_fields(drafter)}
    path = third_party(tmp_path, "evil", drafter, config, midlayer=True, bin_file=True)
    marker = tmp_path / "executed.txt"
    torch.save(
        {**torch.load(path / "pytorch_model.bin"), "x": Payload(marker)}, path / "pytorch_model.bin"
    )
    with pytest.raises(UserError, match="weights_only=True"):
        inspect(path)
    assert not marker.exists()


# CHECKPOINTS.md §5, one by one ----------------------------------------------------------------
def edited(src: Path, tmp: Path, config_edit=None, tensor_edit=None) -> Path:
    from safetensors import safe_open

    out = tmp / "edited"
    out.mkdir(parents=True)
    config = json.loads((src / "config.json").read_text())
    if config_edit:
        config_edit(config)
    (out / "config.json").write_text(json.dumps(config))
    with safe_open(str(src / "model.safetensors"), framework="pt") as f:
        tensors = {n: f.get_tensor(n) for n in f.keys()}  # noqa: SIM118
    if tensor_edit:
        tensor_edit(tensors)
    save_file(tensors, str(out / "model.safetensors"))
    return out


def four_aux(t: dict) -> None:
    t["fc.weight"] = torch.zeros(H, 4 * H)


def ids_as_target_ids(t: dict) -> None:
    t["d2t"] = t["d2t"] + torch.arange(VD)


def inconsistent_t2d(t: dict) -> None:
    t["t2d"] = t["t2d"].clone()
    first = int(torch.nonzero(~t["t2d"])[0])
    t["t2d"][first] = True


def foreign_embedding(t: dict) -> None:
    t["embed_tokens.weight"] = torch.zeros(V, H)


def tlc(key, value):
    def edit(c: dict) -> None:
        if value is None and key != "use_cache":
            c["transformer_layer_config"].pop(key)
        else:
            c["transformer_layer_config"][key] = value

    return edit


def top(key, value=None):
    def edit(c: dict) -> None:
        if value is None:
            c.pop(key)
        else:
            c[key] = value

    return edit


@pytest.mark.parametrize(
    "config_edit, tensor_edit, found",
    [
        (None, four_aux, "fc takes 4 aux states"),
        (top("eagle_aux_hidden_state_layer_ids"), None, "no aux layer ids"),
        (tlc("max_position_embeddings", 2048), None, "max_position_embeddings 2048 is shorter"),
        (None, ids_as_target_ids, "d2t holds target ids, not offsets"),
        (tlc("vocab_size", VD), None, "transformer_layer_config.vocab_size is 40"),
        (top("norm_before_residual"), None, "norm_before_residual missing"),
        (None, foreign_embedding, "embed_tokens differs from the target"),
        (tlc("use_cache", None), None, "use_cache is null"),
        (None, inconsistent_t2d, "t2d does not mark exactly the ids d2t maps to"),
        (
            top("speculators_config", {"proposal_methods": [{}], "verifier": {}}),
            None,
            "verifier.name_or_path missing",
        ),
    ],
    ids=[
        "four-aux",
        "no-ids",
        "short-context",
        "d2t-semantics",
        "tlc-vocab",
        "nbr-missing",
        "embedding",
        "use-cache",
        "t2d",
        "verifier",
    ],
)
def test_each_known_failure_is_reported(exports, target, tmp_path, config_edit, tensor_edit, found):
    path = edited(exports / "vllm", tmp_path, config_edit, tensor_edit)
    problems = checkpoint_problems(path, target)
    assert any(found in p for p in problems), problems
    assert checkpoint_problems(exports / "vllm", target) == []


def test_a_target_copy_of_the_embedding_is_no_problem(exports, target, tmp_path):
    from eagle3kit.checkpoints.weights import target_embedding

    def exact(t: dict) -> None:
        t["embed_tokens.weight"] = target_embedding(target)

    assert checkpoint_problems(edited(exports / "vllm", tmp_path, None, exact), target) == []


def test_the_embedding_rounded_to_bf16_is_the_target_s(exports, target, tmp_path):
    """speculators saves its drafter in bf16 with the (fp32) target's embedding rounded to it:
    that is the target's embedding, while a one-ulp change in bf16 is not."""
    from eagle3kit.checkpoints.weights import target_embedding

    theirs = target_embedding(target)
    assert theirs.dtype == torch.float32

    def rounded(t: dict) -> None:
        t["embed_tokens.weight"] = theirs.to(torch.bfloat16)

    def nudged(t: dict) -> None:
        e = theirs.to(torch.bfloat16)
        e[3, 5] = torch.nextafter(e[3, 5], torch.tensor(1.0, dtype=torch.bfloat16))
        t["embed_tokens.weight"] = e

    assert (
        checkpoint_problems(edited(exports / "vllm", tmp_path / "a", None, rounded), target) == []
    )
    problems = checkpoint_problems(edited(exports / "vllm", tmp_path / "b", None, nudged), target)
    assert any("embed_tokens differs from the target" in p for p in problems), problems


# eagle3kit info CKPT ----------------------------------------------------------------------------
def test_info_describes_checkpoints_and_exits_1_on_problems(exports, run_dir, target, tmp_path):
    runner = CliRunner()
    for path in (exports, exports / "sglang", run_dir):
        result = runner.invoke(app, ["info", str(path), "--json"])
        assert result.exit_code == 0, result.stderr
        data = json.loads(result.stdout)
        assert data["kind"] == "checkpoint" and data["problems"] == []
        assert data["checkpoints"][0]["aux_layer_ids"] == [2, 4, 5]
        assert data["checkpoints"][0]["aux_layer_ids_output"] == [1, 3, 4]
    result = runner.invoke(app, ["info", str(exports)])
    assert "speculators / vLLM" in result.stderr and "SGLang / SpecForge" in result.stderr
    assert "[2, 4, 5] boundary / [1, 3, 4] layer-output" in result.stderr
    bad = edited(exports / "vllm", tmp_path, top("norm_before_residual"), four_aux)
    result = runner.invoke(app, ["info", str(bad), "--target", str(target)])
    assert result.exit_code == 1
    assert "norm_before_residual missing" in result.stderr and "fc takes 4" in result.stderr
    assert "Traceback" not in result.stderr
    result = runner.invoke(app, ["info", str(bad), "--json"])
    problems = json.loads(result.stdout)["problems"]
    assert result.exit_code == 1 and len(problems) == 3  # fc width, id count, residual
    assert any("3 aux layer ids but fc takes 4" in p for p in problems)


def test_info_bad_inputs(tmp_path, target):
    runner = CliRunner()
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text("{oops")
    result = runner.invoke(app, ["info", str(tmp_path / "cfg")])
    assert result.exit_code == 2 and "config.json: not valid JSON" in result.stderr
    result = runner.invoke(app, ["info", str(target)])  # a model, not a drafter
    assert result.exit_code == 2 and "not a checkpoint layout" in result.stderr
    assert "Traceback" not in result.stderr

"""Each export layout loads in the library that owns it, as the same drafter (slow: it builds
its own venv).

The vLLM layout is speculators' own: it loads with the real `speculators` library. The SGLang
layout is SpecForge's (`LlamaForCausalLMEagle3`, `midlayer.*`): it loads with the real
`specforge` package's `AutoDraftModel`, the class SpecForge trains and SGLang's own
`llama_eagle3` mirrors (SGLang itself has no CPU build here).

The speculators venv holds speculators==0.9.0 and hs-connectors==0.9.0 installed --no-deps,
the packages their imports need, torch==2.13.0 (the CPU build on this machine's disk; a plain
install would pull a CUDA torch) and transformers<=5.19. It is built once under
~/.cache/eagle3kit/speculators-0.9.0 (or $EAGLE3KIT_SPECULATORS_VENV) and reused. SpecForge
gets its own, ~/.cache/eagle3kit/specforge-0.2.0 (or $EAGLE3KIT_SPECFORGE_VENV), with its
pinned transformers==5.8.1.

In it, `SpeculatorModel.from_pretrained` loads each export with the verifier given as a local
path and attention set to sdpa on the CPU. Every tensor in the file must land in the model
unchanged, and the loaded model's training-time-test drafts must equal eagle3kit's.

The other way round, speculators' own trainer code (`TrainConfig` with its CLI defaults and
`build_draft_model`) builds drafters of the variants it trains (norm_before_fc,
norm_before_residual, norm_output; two layers with fc_norm and a trained embedding) and saves
them; eagle3kit must read each with no problem, draft and score as speculators' forward does,
and `bench accept` must evaluate them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from eagle3kit._lock import file_lock

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]  # the first run builds the venv

REPO = Path(__file__).resolve().parent.parent
VENV = Path(
    os.environ.get(
        "EAGLE3KIT_SPECULATORS_VENV", Path.home() / ".cache" / "eagle3kit" / "speculators-0.9.0"
    )
)
INSTALLS = [
    ["torch==2.13.0", "transformers<=5.19"],
    ["--no-deps", "speculators==0.9.0", "hs-connectors==0.9.0"],
    # what `import speculators` and the eagle3 loader import, within speculators' own pins
    ["openai", "datasets>=4.0.0,<=5.1.0", "loguru>=0.7.2,<=0.7.3", "pydantic-settings", "httpx"],
]
SPECFORGE_VENV = Path(
    os.environ.get(
        "EAGLE3KIT_SPECFORGE_VENV", Path.home() / ".cache" / "eagle3kit" / "specforge-0.2.0"
    )
)
# SpecForge's own transformers pin (under 5.19 its rotary caches load as uninitialised
# memory); its other pins (sglang, a CUDA torch) are for training on a GPU
SPECFORGE_INSTALLS = [["torch==2.13.0", "transformers==5.8.1"], ["--no-deps", "specforge==0.2.0"]]

LOADER = r"""
import json, sys
import torch
from safetensors.torch import load_file
from speculators import SpeculatorModel
from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

reports = {}
for draft in sys.argv[1:]:
    config = Eagle3SpeculatorConfig.from_pretrained(draft)
    config.transformer_layer_config._attn_implementation = "sdpa"
    model = SpeculatorModel.from_pretrained(draft, config=config)
    state = model.state_dict()
    stored = load_file(f"{draft}/model.safetensors")
    verifier = load_file(f"{config.speculators_config.verifier.name_or_path}/model.safetensors")
    target_embedding = verifier["model.embed_tokens.weight"]
    # speculators 0.9.0 (transformers 5.19) fills a missing embed_tokens only while it is
    # still NaN, which the meta-device load does not keep: record it, then load it for the
    # comparison below (vLLM is unaffected: it shares the target's embedding)
    embedding_from_verifier = torch.equal(model.embed_tokens.weight.float(), target_embedding)
    if "embed_tokens.weight" not in stored:
        model._load_verifier_weights(overwrite_embed_tokens=True)
    report = {
        "class": type(model).__name__,
        "not_in_model": [n for n in stored if n not in state],
        "differ": [n for n in stored if n in state
                   and not torch.equal(state[n].to(stored[n].dtype), stored[n])],
        "ids": model.config.eagle_aux_hidden_state_layer_ids,
        "norm_before_residual": model.config.norm_before_residual,
        "draft_vocab_size": model.draft_vocab_size,
        "verifier_vocab_size": model.verifier_vocab_size,
        "speculative_tokens":
            model.config.speculators_config.proposal_methods[0].speculative_tokens,
        "embedding_from_verifier": embedding_from_verifier,
    }
    torch.manual_seed(0)
    t = 9
    hidden = torch.randn(1, t, len(report["ids"]) * model.hidden_size)
    ids = torch.randint(0, model.verifier_vocab_size, (1, t))
    with torch.no_grad():
        tokens = model.float().eval()(hidden, ids, torch.zeros(1, t, dtype=torch.long),
                                      position_ids=torch.arange(t)[None], ttt_steps=3)
    report["hidden"], report["ids_in"] = hidden.tolist(), ids.tolist()
    report["drafts"] = [x[0].tolist() for x in tokens]
    reports[draft] = report
print(json.dumps(reports))
"""


def _pip(venv: Path, *args: str) -> None:
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *args],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if proc.returncode != 0:
        pytest.skip(
            f"pip could not install {' '.join(args)} into {venv}: {proc.stderr.strip()[-500:]}"
        )


def _built(venv: Path, installs: list[list[str]]) -> Path:
    """The venv's python, (re)built when what it should hold changed. Under the lock
    benchmarks/quality_bench.py takes too: the slow tier runs it beside these tests, and a
    venv cleared by one while the other used it lost its `speculators`."""
    venv.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(venv.with_name(venv.name + ".lock")):
        ready = venv / ".eagle3kit-ready"
        if not ready.exists() or json.loads(ready.read_text()) != installs:
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
            for args in installs:
                _pip(venv, *args)
            ready.write_text(json.dumps(installs))
    return venv / "bin" / "python"


@pytest.fixture(scope="module")
def venv() -> Path:
    return _built(VENV, INSTALLS)


@pytest.fixture(scope="module")
def specforge_venv() -> Path:
    return _built(SPECFORGE_VENV, SPECFORGE_INSTALLS)


def _tiny_run_module():
    spec = importlib.util.spec_from_file_location(
        "make_tiny_run", REPO / "examples" / "make_tiny_run.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_vllm_export_loads_with_speculators(venv, tmp_path):
    from eagle3kit.checkpoints.load import load_any
    from eagle3kit.checkpoints.weights import target_embedding
    from eagle3kit.export import ExportConfig, run
    from eagle3kit.model import TTTState

    tiny = _tiny_run_module()
    target = tmp_path / "target"
    tiny.make_target(target)
    drafts = {}
    for residual in (False, True):
        run_dir = tmp_path / f"run-{residual}"
        tiny.make_run(run_dir, target, [2, 4, 5])
        config_path = run_dir / "drafter" / "config.json"
        config = json.loads(config_path.read_text())
        config["eagle3kit"]["drafter"]["norm_before_residual"] = residual
        config_path.write_text(json.dumps(config))
        variants = [("fp32", False), ("bf16", False)] if not residual else [("fp32", True)]
        for dtype, with_embedding in variants:
            out = tmp_path / f"export-{residual}-{dtype}-{with_embedding}"
            run(
                ExportConfig(
                    run_dir,
                    out,
                    dtype=dtype,
                    verifier=str(target),
                    num_speculative_tokens=4,
                    with_embedding=with_embedding,
                )
            )
            drafts[str(out)] = residual
    proc = subprocess.run(
        [str(venv), "-c", LOADER, *drafts],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = json.loads(proc.stdout.strip().splitlines()[-1])
    embedding = target_embedding(target)
    for path, residual in drafts.items():
        report = reports[path]
        assert report["class"] == "Eagle3DraftModel"
        assert report["not_in_model"] == [] and report["differ"] == [], report
        assert report["ids"] == [2, 4, 5] and report["norm_before_residual"] is residual
        assert (report["draft_vocab_size"], report["verifier_vocab_size"]) == (300, 1026)
        assert report["speculative_tokens"] == 4
        if path.endswith("-True"):  # exported with the target's embedding: it lands as is
            assert report["embedding_from_verifier"] is True
        # the model speculators built drafts what eagle3kit's drafter drafts
        model = load_any(path, embedding=embedding)[0].eval()
        hidden, ids = torch.tensor(report["hidden"]), torch.tensor(report["ids_in"])
        t = ids.shape[1]
        padded = torch.cat([ids, torch.zeros(1, 3, dtype=torch.long)], 1)
        h, state, ours = model.project(hidden), TTTState(), []
        with torch.no_grad():
            for k in range(3):
                h = model.ttt_step(h, padded[:, k : k + t], torch.arange(t)[None] + k, state)
                ours.append(model.logits(h).argmax(-1)[0].tolist())
        assert ours == report["drafts"], path
        assert len({tuple(d) for d in ours}) > 1  # the steps differ: the check has teeth


SPECFORGE_LOADER = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
import torch
from safetensors.torch import load_file
from transformers import AutoConfig
from specforge.modeling.auto import AutoDraftModel
from specforge.training.model_loading import warm_start_draft_model
from specforge.utils import padding

target, drafts = sys.argv[1], sys.argv[2:]
reports = {}
for draft in drafts:
    # SpecForge's own way to continue from a published drafter: build the model from the
    # draft's config, warm-start its weights, load the embedding from the target (its
    # from_pretrained alone leaves the rotary buffers uninitialised: they are not saved)
    config = AutoConfig.from_pretrained(draft)
    model = AutoDraftModel.from_config(config, torch_dtype=torch.float32).eval()
    loaded = warm_start_draft_model(model, draft, draft_config=config, strategy="eagle3",
                                    allow_missing_embedding=True)
    state = model.state_dict()
    stored = load_file(f"{draft}/model.safetensors")
    report = {"class": type(model).__name__, "loaded": loaded.loaded_keys,
              "missing": list(loaded.missing_keys),
              "not_in_model": [n for n in stored if n not in state],
              "differ": [n for n in stored if n in state
                         and not torch.equal(state[n].to(stored[n].dtype), stored[n])]}
    model.load_embedding(target)
    torch.manual_seed(0)
    t = 9
    hidden = torch.randn(1, t, 3 * model.target_hidden_size)
    ids = torch.randint(0, model.vocab_size, (1, t))
    # SpecForge's own training-time test (algorithms/eagle3/model.py, sdpa backend): the ids
    # shift left each step, the positions stay and the attention caches what it saw
    mask = model.prepare_decoder_attention_mask(torch.ones(1, t, dtype=torch.bool), hidden, 1,
                                                t, 0)
    positions, cache, step_ids = torch.arange(t)[None], [[], []], ids
    logits, drafts_out = [], []
    with torch.no_grad():
        h = model.project_hidden_states(hidden)
        for _ in range(3):
            h = model.backbone(model.embed_input_ids(step_ids), h, cache, mask, positions,
                               None, True)
            out = model.compute_logits(h)[0]
            logits.append(out.tolist())
            drafts_out.append(out.argmax(-1).tolist())
            step_ids = padding(step_ids, left=False)
    report.update(hidden=hidden.tolist(), ids_in=ids.tolist(), logits=logits,
                  drafts=drafts_out)
    reports[draft] = report
print(json.dumps(reports))
"""


def test_sglang_export_loads_with_specforge(specforge_venv, tmp_path):
    """`export --format sglang` loads into SpecForge's own `LlamaForCausalLMEagle3` by
    SpecForge's warm start (the layout's owner): every tensor lands unchanged, the embedding
    comes from the target as SpecForge's trainer loads it, and SpecForge's training-time-test
    forward gives eagle3kit's logits and drafts at every step."""
    from eagle3kit.checkpoints.load import load_any
    from eagle3kit.checkpoints.weights import target_embedding
    from eagle3kit.export import ExportConfig, run
    from eagle3kit.model import TTTState

    tiny = _tiny_run_module()
    target = tmp_path / "target"
    tiny.make_target(target)
    run_dir = tmp_path / "run"
    tiny.make_run(run_dir, target, [2, 4, 5])
    out = tmp_path / "export-sglang"
    run(ExportConfig(run_dir, out, format="sglang", dtype="float32", verifier=str(target)))
    proc = subprocess.run(
        [str(specforge_venv), "-c", SPECFORGE_LOADER, str(target), str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])[str(out)]
    assert report["class"] == "LlamaForCausalLMEagle3"
    assert report["not_in_model"] == [] and report["differ"] == [], report
    assert report["loaded"] == 15 and report["missing"] == ["embed_tokens.weight"]
    model = load_any(out, embedding=target_embedding(target))[0].eval()
    hidden, ids = torch.tensor(report["hidden"]), torch.tensor(report["ids_in"])
    t = ids.shape[1]
    padded = torch.cat([ids, torch.zeros(1, 3, dtype=torch.long)], 1)
    h, state, ours = model.project(hidden), TTTState(), []
    with torch.no_grad():
        for k in range(3):
            h = model.ttt_step(h, padded[:, k : k + t], torch.arange(t)[None] + k, state)
            logits = model.logits(h)[0]
            torch.testing.assert_close(
                logits, torch.tensor(report["logits"][k]), rtol=1e-4, atol=1e-4
            )
            ours.append(logits.argmax(-1).tolist())
    assert ours == report["drafts"]
    assert len({tuple(d) for d in ours}) > 1  # the steps differ: the check has teeth


BUILDER = r"""
import argparse, json, sys
import torch
from speculators.models.eagle3 import Eagle3DraftModel
from speculators.train.cli import build_draft_model
from speculators.train.config.schema import TrainConfig

target, root, cases = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
reports = {}
for name, flags in cases.items():
    # the trainer's own configuration and model builder: its CLI defaults, plus `flags`
    cfg = TrainConfig.from_flat({"verifier_name_or_path": target, "draft_attn_impl": "sdpa",
                                 **flags})
    args = argparse.Namespace(**cfg.flatten())
    torch.manual_seed(0)
    vocab = int(args.draft_vocab_size)
    ids = torch.sort(torch.randperm(cfg_vocab := json.load(open(f"{target}/config.json"))
                                    ["vocab_size"])[:vocab]).values
    t2d = torch.zeros(cfg_vocab, dtype=torch.bool)
    t2d[ids] = True
    model = build_draft_model(args, Eagle3DraftModel, t2d, ids - torch.arange(vocab), vocab)
    with torch.no_grad():  # norms start at 1: perturb every weight so a swapped norm shows
        for n, p in model.named_parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.3)
    out = f"{root}/{name}"
    model.save_pretrained(out)
    c = model.config
    report = {"flags": {k: getattr(c, k) for k in (
        "norm_before_residual", "norm_before_fc", "fc_norm", "norm_output",
        "embed_requires_grad")}, "layers": c.transformer_layer_config.num_hidden_layers,
        "layer_types": getattr(c.transformer_layer_config, "layer_types", None)}
    logits = []
    model.lm_head.register_forward_hook(lambda m, i, o: logits.append(o[0].tolist()))
    torch.manual_seed(1)
    t = 9
    hidden = torch.randn(1, t, len(c.eagle_aux_hidden_state_layer_ids) * model.hidden_size)
    tokens = torch.randint(0, cfg_vocab, (1, t))
    with torch.no_grad():
        drafts = model.float().eval()(hidden, tokens, torch.zeros(1, t, dtype=torch.long),
                                      position_ids=torch.arange(t)[None], ttt_steps=3)
    report.update(hidden=hidden.tolist(), ids_in=tokens.tolist(),
                  drafts=[x[0].tolist() for x in drafts], logits=logits)
    reports[out] = report
print(json.dumps(reports))
"""

SPECULATORS_CASES = {
    "cli-defaults": {"draft_vocab_size": 300},
    # more layers, the per-state norms and a trained embedding, through the same builder
    "two-layers-fc-norm": {
        "draft_vocab_size": 300,
        "num_layers": 2,
        "norm_before_fc": False,
        "fc_norm": True,
        "embed_requires_grad": True,
    },
}


def test_a_drafter_speculators_builds_is_read_and_benched(venv, tmp_path):
    """speculators 0.9.0's trainer builds drafters with its CLI defaults (norm_before_fc,
    norm_before_residual, norm_output) and with two layers and fc_norm; eagle3kit loads each
    with no problem, its training-time-test drafts and logits equal speculators' own forward,
    and `bench accept` evaluates them."""
    from typer.testing import CliRunner

    from eagle3kit.checkpoints.detect import inspect
    from eagle3kit.checkpoints.load import load_any
    from eagle3kit.checkpoints.weights import target_embedding
    from eagle3kit.cli import app
    from eagle3kit.model import TTTState
    from eagle3kit.tiny import make_target, make_tokenizer

    make_tokenizer(tmp_path / "tok")
    target = make_target(tmp_path / "target", tmp_path / "tok", hidden_size=64)
    proc = subprocess.run(
        [str(venv), "-c", BUILDER, str(target), str(tmp_path), json.dumps(SPECULATORS_CASES)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = json.loads(proc.stdout.strip().splitlines()[-1])
    assert reports[str(tmp_path / "cli-defaults")]["flags"] == {
        "norm_before_residual": True,
        "norm_before_fc": True,
        "fc_norm": False,
        "norm_output": True,
        "embed_requires_grad": False,
    }
    embedding = target_embedding(target)
    prompts = REPO / "tests" / "data" / "prompts" / "eagle" / "mt_bench" / "question.jsonl"
    for path, report in reports.items():
        info = inspect(path, target)
        assert info.layout == "speculators" and info.problems == [], info.problems
        assert any("sliding-window attention (window 2048)" in w for w in info.warnings)
        assert info.variant["num_hidden_layers"] == report["layers"]
        assert {k: report["flags"][k] for k in info.variant if k in report["flags"]} == {
            k: v for k, v in info.variant.items() if k in report["flags"]
        }
        assert info.norm_before_residual is report["flags"]["norm_before_residual"]
        model = load_any(path, embedding=embedding)[0].eval()
        hidden, ids = torch.tensor(report["hidden"]), torch.tensor(report["ids_in"])
        t = ids.shape[1]
        padded = torch.cat([ids, torch.zeros(1, 3, dtype=torch.long)], 1)
        h, state, ours = model.project(hidden), TTTState(), []
        with torch.no_grad():
            for k in range(3):
                h = model.ttt_step(h, padded[:, k : k + t], torch.arange(t)[None] + k, state)
                logits = model.logits(h)[0]
                torch.testing.assert_close(
                    logits, torch.tensor(report["logits"][k]), rtol=1e-4, atol=1e-4
                )
                ours.append(logits.argmax(-1).tolist())
        assert ours == report["drafts"], path
        assert len({tuple(d) for d in ours}) > 1  # the steps differ: the check has teeth
        result = CliRunner().invoke(
            app,
            [
                "bench",
                "accept",
                "--target",
                str(target),
                "--drafter",
                path,
                str(prompts),
                "--max-samples",
                "2",
                "--max-new-tokens",
                "8",
                "--device",
                "cpu",
                "--json",
            ],
        )
        assert result.exit_code == 0, result.output
        data = json.loads(result.output[result.output.index("{") : result.output.rindex("}") + 1])
        assert data["lossless"] is True and data["acceptance_length"] >= 1.0
        assert len(data["per_position"]) == 3

"""The vLLM export loads with the real `speculators` library (slow: it builds its own venv).

The venv holds speculators==0.9.0 and hs-connectors==0.9.0 installed --no-deps, the packages
their imports need, torch==2.13.0 (the CPU build on this machine's disk; a plain install would
pull a CUDA torch) and transformers<=5.19. It is built once under
~/.cache/eagle3kit/speculators-0.9.0 (or $EAGLE3KIT_SPECULATORS_VENV) and reused.

In it, `SpeculatorModel.from_pretrained` loads each export with the verifier given as a local
path and attention set to sdpa on the CPU. Every tensor in the file must land in the model
unchanged, and the loaded model's training-time-test drafts must equal eagle3kit's.
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

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]  # the first run builds the venv

REPO = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("EAGLE3KIT_SPECULATORS_VENV",
                           Path.home() / ".cache" / "eagle3kit" / "speculators-0.9.0"))
INSTALLS = [
    ["torch==2.13.0", "transformers<=5.19"],
    ["--no-deps", "speculators==0.9.0", "hs-connectors==0.9.0"],
    # what `import speculators` and the eagle3 loader import, within speculators' own pins
    ["openai", "datasets>=4.0.0,<=5.1.0", "loguru>=0.7.2,<=0.7.3"],
]

LOADER = r'''
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
'''


def _pip(*args: str) -> None:
    proc = subprocess.run([str(VENV / "bin" / "python"), "-m", "pip", "install", "-q", *args],
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        pytest.skip(f"pip could not install {' '.join(args)} into {VENV}: "
                    f"{proc.stderr.strip()[-500:]}")


@pytest.fixture(scope="module")
def venv() -> Path:
    ready = VENV / ".eagle3kit-ready"
    if not ready.exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
        for args in INSTALLS:
            _pip(*args)
        ready.write_text(json.dumps(INSTALLS))
    return VENV / "bin" / "python"


def _tiny_run_module():
    spec = importlib.util.spec_from_file_location("make_tiny_run",
                                                  REPO / "examples" / "make_tiny_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_vllm_export_loads_with_speculators(venv, tmp_path):
    from eagle3kit.checkpoints.layouts import load_any, target_embedding
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
            run(ExportConfig(run_dir, out, dtype=dtype, verifier=str(target),
                             num_speculative_tokens=4, with_embedding=with_embedding))
            drafts[str(out)] = residual
    proc = subprocess.run([str(venv), "-c", LOADER, *drafts], capture_output=True, text=True,
                          timeout=900, cwd=tmp_path)
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
                h = model.ttt_step(h, padded[:, k:k + t], torch.arange(t)[None] + k, state)
                ours.append(model.logits(h).argmax(-1)[0].tolist())
        assert ours == report["drafts"], path
        assert len({tuple(d) for d in ours}) > 1  # the steps differ: the check has teeth

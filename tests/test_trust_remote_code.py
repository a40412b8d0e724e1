"""A target that needs its own code, through every stage: refused with one line without
--trust-remote-code, never an interactive question, and the consent travels with the data.

The target is a real custom-code model directory: a tiny Llama whose config.json names
`configuration_e3k.E3kConfig` and `modeling_e3k.E3kForCausalLM` in its `auto_map`, two
Python files beside it, as Kimi's and DeepSeek's checkpoints ship theirs. transformers knows
neither class, so nothing loads without running those files.
"""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagle3kit._ui import OutputOptions
from eagle3kit.errors import UserError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

REPO = Path(__file__).resolve().parent.parent
QUIET = OutputOptions(quiet=True)
REFUSAL = ("ships its own code (configuration_e3k.py, modeling_e3k.py); pass "
           "--trust-remote-code to run it")
CONFIGURATION = '''from transformers import LlamaConfig


class E3kConfig(LlamaConfig):
    model_type = "e3k_llama"
'''
MODELING = '''from transformers import LlamaForCausalLM

from .configuration_e3k import E3kConfig


class E3kForCausalLM(LlamaForCausalLM):
    config_class = E3kConfig
'''


@pytest.fixture(scope="module")
def custom(tmp_path_factory) -> Path:
    from eagle3kit import tiny

    root = tmp_path_factory.mktemp("custom")
    tokenizer = tiny.make_tokenizer(root / "tokenizer", vocab_size=320,
                                    corpus=tiny.stdlib_docstrings(20_000))
    target = tiny.make_target(root / "target", tokenizer, hidden_size=32)
    config = json.loads((target / "config.json").read_text())
    config.update(model_type="e3k_llama", architectures=["E3kForCausalLM"],
                  auto_map={"AutoConfig": "configuration_e3k.E3kConfig",
                            "AutoModelForCausalLM": "modeling_e3k.E3kForCausalLM"})
    (target / "config.json").write_text(json.dumps(config, indent=2))
    (target / "configuration_e3k.py").write_text(CONFIGURATION)
    (target / "modeling_e3k.py").write_text(MODELING)
    return target


@pytest.fixture(scope="module")
def chain(custom, tmp_path_factory) -> dict[str, Path]:
    """gen -> extract -> train -> export on the custom target; only gen is told to trust."""
    from eagle3kit import export, extract, gen, train

    root = tmp_path_factory.mktemp("chain")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"messages": [{"role": "user", "content": q}]}) + "\n"
                               for q in ("What is a list?", "Explain dict.", "Why tuples?",
                                         "Sort a list.", "Open a file.", "Read JSON.")))
    paths = {"prompts": prompts, "tokens": root / "tokens", "hidden": root / "hidden",
             "run": root / "run", "export": root / "export"}
    with pytest.raises(UserError, match=re.escape(f"--target {custom}: it {REFUSAL}")):
        gen.run(gen.GenConfig([prompts], paths["tokens"], engine="hf", target=custom,
                              max_tokens=8, output=QUIET))
    gen.run(gen.GenConfig([prompts], paths["tokens"], engine="hf", target=custom, max_tokens=8,
                          temperature=0.0, trust_remote_code=True, output=QUIET))
    extract.run(extract.ExtractConfig(paths["tokens"], paths["hidden"], target=custom,
                                      device="cpu", output=QUIET))
    train.run(train.TrainConfig([paths["hidden"]], paths["run"], custom, max_steps=2,
                                batch_tokens=256, draft_vocab=64, eval_split=0,
                                device="cpu", output=QUIET))
    export.run(export.ExportConfig(paths["run"], paths["export"], output=QUIET))
    return paths


def test_gen_and_extract_record_the_consent_and_later_stages_use_it(chain):
    from eagle3kit.format import Dataset, HiddenDataset

    assert Dataset(chain["tokens"]).manifest["provenance"]["trust_remote_code"] is True
    assert HiddenDataset(chain["hidden"]).manifest["provenance"]["trust_remote_code"] is True
    assert json.loads((chain["run"] / "run.json").read_text())["trust_remote_code"] is True
    assert (chain["export"] / "model.safetensors").is_file()


def test_each_stage_told_no_refuses_by_name(custom, chain, tmp_path):
    from eagle3kit import export, extract, train
    from eagle3kit.bench import accept

    with pytest.raises(UserError, match=re.escape(f"--target {custom}: it {REFUSAL}")):
        extract.run(extract.ExtractConfig(chain["tokens"], tmp_path / "h", target=custom,
                                          device="cpu", trust_remote_code=False,
                                          output=QUIET))
    with pytest.raises(UserError, match=re.escape(f"--target {custom}: it {REFUSAL}")):
        train.run(train.TrainConfig([chain["hidden"]], tmp_path / "r", custom, max_steps=1,
                                    trust_remote_code=False, device="cpu", output=QUIET))
    recorded = f"the recorded target {custom}: it {REFUSAL}"
    with pytest.raises(UserError, match=re.escape(recorded)):
        export.run(export.ExportConfig(chain["run"], tmp_path / "e", trust_remote_code=False,
                                       output=QUIET))
    bench = {"k": 2, "max_new_tokens": 4, "max_samples": 1, "device": "cpu", "output": QUIET}
    with pytest.raises(UserError, match=re.escape(f"--target {custom}: it {REFUSAL}")):
        accept.run(accept.AcceptConfig(custom, chain["export"], [chain["prompts"]], **bench))
    report = accept.run(accept.AcceptConfig(custom, chain["export"], [chain["prompts"]],
                                            trust_remote_code=True, **bench))
    assert report.lossless is True


def test_validate_and_info_need_no_consent(chain, custom):
    from eagle3kit import info, validate

    report = validate.run(validate.ValidateConfig(chain["tokens"], output=QUIET))
    assert report.samples == 6
    described = info.run(info.InfoConfig(chain["export"], target=custom, output=QUIET))
    assert not [p for p in described.problems if "code" in p]


def test_the_command_never_asks_even_on_a_terminal(custom, tmp_path):
    """transformers asks "Do you wish to run the custom code? [y/N]" when stdin is a terminal
    and no choice was passed; eagle3kit always passes one. stdin here is a pseudo-terminal."""
    (tmp_path / "empty").mkdir()
    leader, follower = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE3KIT_")}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1",
               HF_MODULES_CACHE=str(tmp_path / "modules"))
    began = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "eagle3kit", "train", str(tmp_path / "empty"),
             str(tmp_path / "run"), "--target", str(custom)],
            stdin=follower, capture_output=True, text=True, env=env, timeout=120)
    finally:
        os.close(follower)
        os.close(leader)
    assert proc.returncode == 2, proc.stderr
    assert "Do you wish to run the custom code" not in proc.stdout + proc.stderr
    assert proc.stderr.strip() == f"error: --target {custom}: it {REFUSAL}"
    assert time.monotonic() - began < 60

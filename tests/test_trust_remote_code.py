"""A target that needs its own code, through every stage: refused with one line without
--trust-remote-code, never an interactive question, and the consent never travels with the
data: each command needs its own flag, whatever a dataset or run records.

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
REFUSAL = (
    "ships its own code (configuration_e3k.py, modeling_e3k.py); pass --trust-remote-code to run it"
)
CONFIGURATION = """from transformers import LlamaConfig


class E3kConfig(LlamaConfig):
    model_type = "e3k_llama"
"""
MODELING = """from transformers import LlamaForCausalLM

from .configuration_e3k import E3kConfig


class E3kForCausalLM(LlamaForCausalLM):
    config_class = E3kConfig
"""


@pytest.fixture(scope="module")
def custom(tmp_path_factory) -> Path:
    from eagle3kit import tiny

    root = tmp_path_factory.mktemp("custom")
    tokenizer = tiny.make_tokenizer(
        root / "tokenizer", vocab_size=320, corpus=tiny.stdlib_docstrings(20_000)
    )
    target = tiny.make_target(root / "target", tokenizer, hidden_size=32)
    config = json.loads((target / "config.json").read_text())
    config.update(
        model_type="e3k_llama",
        architectures=["E3kForCausalLM"],
        auto_map={
            "AutoConfig": "configuration_e3k.E3kConfig",
            "AutoModelForCausalLM": "modeling_e3k.E3kForCausalLM",
        },
    )
    (target / "config.json").write_text(json.dumps(config, indent=2))
    (target / "configuration_e3k.py").write_text(CONFIGURATION)
    (target / "modeling_e3k.py").write_text(MODELING)
    return target


@pytest.fixture(scope="module")
def chain(custom, tmp_path_factory) -> dict[str, Path]:
    """gen -> extract -> train -> export on the custom target, each told to trust."""
    from eagle3kit import export, extract, gen, train

    root = tmp_path_factory.mktemp("chain")
    prompts = root / "prompts.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"messages": [{"role": "user", "content": q}]}) + "\n"
            for q in (
                "What is a list?",
                "Explain dict.",
                "Why tuples?",
                "Sort a list.",
                "Open a file.",
                "Read JSON.",
            )
        )
    )
    paths = {
        "prompts": prompts,
        "tokens": root / "tokens",
        "hidden": root / "hidden",
        "run": root / "run",
        "export": root / "export",
    }
    with pytest.raises(UserError, match=re.escape(f"--target {custom}: it {REFUSAL}")):
        gen.run(
            gen.GenConfig(
                [prompts], paths["tokens"], engine="hf", target=custom, max_tokens=8, output=QUIET
            )
        )
    gen.run(
        gen.GenConfig(
            [prompts],
            paths["tokens"],
            engine="hf",
            target=custom,
            max_tokens=8,
            temperature=0.0,
            trust_remote_code=True,
            output=QUIET,
        )
    )
    extract.run(
        extract.ExtractConfig(
            paths["tokens"],
            paths["hidden"],
            target=custom,
            device="cpu",
            trust_remote_code=True,
            output=QUIET,
        )
    )
    train.run(
        train.TrainConfig(
            [paths["hidden"]],
            paths["run"],
            custom,
            max_steps=2,
            batch_tokens=256,
            draft_vocab=64,
            eval_split=0,
            device="cpu",
            trust_remote_code=True,
            output=QUIET,
        )
    )
    export.run(
        export.ExportConfig(paths["run"], paths["export"], trust_remote_code=True, output=QUIET)
    )
    return paths


def test_each_stage_records_the_consent_it_was_given(chain):
    from eagle3kit.format import Dataset, HiddenDataset

    assert Dataset(chain["tokens"]).manifest["provenance"]["trust_remote_code"] is True
    assert HiddenDataset(chain["hidden"]).manifest["provenance"]["trust_remote_code"] is True
    assert json.loads((chain["run"] / "run.json").read_text())["trust_remote_code"] is True
    assert (chain["export"] / "model.safetensors").is_file()


def test_each_stage_told_no_refuses_by_name(custom, chain, tmp_path):
    from eagle3kit import export, extract, train
    from eagle3kit.bench import accept

    # The datasets and the run record the consent their makers were given: it is not used.
    with pytest.raises(UserError, match=re.escape(f"--target {custom}: it {REFUSAL}")):
        extract.run(
            extract.ExtractConfig(
                chain["tokens"], tmp_path / "h", target=custom, device="cpu", output=QUIET
            )
        )
    with pytest.raises(UserError, match=re.escape(f"--target {custom}: it {REFUSAL}")):
        train.run(
            train.TrainConfig(
                [chain["hidden"]], tmp_path / "r", custom, max_steps=1, device="cpu", output=QUIET
            )
        )
    recorded = f"the recorded target {custom}: it {REFUSAL}"
    with pytest.raises(UserError, match=re.escape(recorded)):
        export.run(export.ExportConfig(chain["run"], tmp_path / "e", output=QUIET))
    bench = {"k": 2, "max_new_tokens": 4, "max_samples": 1, "device": "cpu", "output": QUIET}
    with pytest.raises(UserError, match=re.escape(f"--target {custom}: it {REFUSAL}")):
        accept.run(accept.AcceptConfig(custom, chain["export"], [chain["prompts"]], **bench))
    report = accept.run(
        accept.AcceptConfig(
            custom, chain["export"], [chain["prompts"]], trust_remote_code=True, **bench
        )
    )
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
    env.update(
        PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", HF_MODULES_CACHE=str(tmp_path / "modules")
    )
    began = time.monotonic()
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "eagle3kit",
                "train",
                str(tmp_path / "empty"),
                str(tmp_path / "run"),
                "--target",
                str(custom),
            ],
            stdin=follower,
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
    finally:
        os.close(follower)
        os.close(leader)
    assert proc.returncode == 2, proc.stderr
    assert "Do you wish to run the custom code" not in proc.stdout + proc.stderr
    assert proc.stderr.strip() == f"error: --target {custom}: it {REFUSAL}"
    assert time.monotonic() - began < 60


# Consent comes from the command line, never from a file ------------------------------------
# A dataset or run made elsewhere records "trust_remote_code": true and carries (or names)
# code that writes a marker file when it is imported. Without the flag no stage imports it.
EVIL_TOKENIZER = """import pathlib

pathlib.Path({marker!r}).open("a").write("tokenizer\\n")

from transformers import PreTrainedTokenizerFast


class EvilTokenizerFast(PreTrainedTokenizerFast):
    pass
"""
EVIL_CONFIG = """import pathlib

pathlib.Path({marker!r}).open("a").write("config\\n")

from transformers import LlamaConfig


class EvilConfig(LlamaConfig):
    model_type = "evil_llama"
"""


def _make_tiny_run():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "make_tiny_run", REPO / "examples" / "make_tiny_run.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> dict[str, Path]:
    """DS: a token dataset whose stored tokenizer ships tokenization_evil.py, its manifest
    recording trust; RUN: a run whose run.json records trust and names EVIL, a target whose
    config ships configuration_evil.py; PLAIN: a target with no code of its own."""
    from eagle3kit import tiny
    from eagle3kit.format import DatasetWriter, TokenSample

    root = tmp_path_factory.mktemp("planted")
    marker = root / "code-ran"
    tokenizer = tiny.make_tokenizer(
        root / "tokenizer", vocab_size=320, corpus=tiny.stdlib_docstrings(20_000)
    )
    config = json.loads((tokenizer / "tokenizer_config.json").read_text())
    config.update(
        tokenizer_class="EvilTokenizerFast",
        auto_map={"AutoTokenizer": [None, "tokenization_evil.EvilTokenizerFast"]},
    )
    (tokenizer / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (tokenizer / "tokenization_evil.py").write_text(EVIL_TOKENIZER.format(marker=str(marker)))
    ds = root / "ds"
    with DatasetWriter(ds, provenance={"trust_remote_code": True}) as writer:
        writer.store_tokenizer(sorted(tokenizer.iterdir()))
        for i in range(4):
            writer.add(TokenSample(f"s{i}", [5, 6, 7 + i], [20 + i, 21, 22]))
    make_tiny_run = _make_tiny_run()
    plain, evil, run = root / "plain", root / "evil", root / "run"
    make_tiny_run.make_target(plain)
    make_tiny_run.make_target(evil)
    make_tiny_run.make_run(run, evil, [2, 4, 5])
    record = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**record, "trust_remote_code": True}))
    config = json.loads((evil / "config.json").read_text())
    config.update(model_type="evil_llama", auto_map={"AutoConfig": "configuration_evil.EvilConfig"})
    (evil / "config.json").write_text(json.dumps(config, indent=2))
    (evil / "configuration_evil.py").write_text(EVIL_CONFIG.format(marker=str(marker)))
    return {"root": root, "marker": marker, "ds": ds, "plain": plain, "evil": evil, "run": run}


def eagle3kit(planted: dict[str, Path], *args: str | Path) -> subprocess.CompletedProcess:
    """The command in a subprocess, with transformers' copy of imported code kept in tmp."""
    planted["marker"].unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE3KIT_")}
    env.update(
        PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", HF_MODULES_CACHE=str(planted["root"] / "modules")
    )
    return subprocess.run(
        [sys.executable, "-m", "eagle3kit", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )


def refusal(proc: subprocess.CompletedProcess) -> str:
    """The one error line of a refused command (exit 2, no traceback)."""
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


def test_extract_dry_run_refuses_a_datasets_tokenizer_code_without_the_flag(planted, tmp_path):
    tokenizer_config = planted["ds"] / "tokenizer" / "tokenizer_config.json"
    args = (
        "extract",
        planted["ds"],
        tmp_path / "hidden",
        "--target",
        planted["plain"],
        "--dry-run",
        "--device",
        "cpu",
    )
    proc = eagle3kit(planted, *args)
    assert not planted["marker"].exists()
    assert refusal(proc) == (
        f"error: {tokenizer_config}: its auto_map names code of its own "
        "(tokenization_evil.py); pass --trust-remote-code to run it"
    )
    told = eagle3kit(planted, *args, "--trust-remote-code")
    assert told.returncode == 0, told.stderr
    assert planted["marker"].read_text() == "tokenizer\n"


def test_validate_skips_the_tokenizer_checks_without_the_flag(planted):
    tokenizer_config = planted["ds"] / "tokenizer" / "tokenizer_config.json"
    proc = eagle3kit(planted, "validate", planted["ds"], "--json")
    assert not planted["marker"].exists()
    assert "Traceback" not in proc.stderr
    assert proc.returncode in (0, 1), proc.stderr
    report = json.loads(proc.stdout)
    said = (
        f"{tokenizer_config}: its auto_map names code of its own (tokenization_evil.py); "
        "pass --trust-remote-code to run it"
    )
    assert f"warning: {said}; the checks that need the tokenizer are skipped" in proc.stderr
    assert next(c for c in report["checks"] if c["name"] == "integrity")["status"] == "pass"
    assert next(c for c in report["checks"] if c["name"] == "vocabulary")["status"] == "skip"
    told = eagle3kit(planted, "validate", planted["ds"], "--json", "--trust-remote-code")
    assert "Traceback" not in told.stderr
    assert planted["marker"].read_text() == "tokenizer\n"
    checks = json.loads(told.stdout)["checks"]
    assert next(c for c in checks if c["name"] == "vocabulary")["status"] != "skip"


def test_train_takes_no_consent_from_a_datasets_manifest(planted, tmp_path):
    args = (
        "train",
        planted["ds"],
        tmp_path / "run",
        "--target",
        planted["evil"],
        "--device",
        "cpu",
        "--max-steps",
        "1",
    )
    proc = eagle3kit(planted, *args)
    assert not planted["marker"].exists()
    assert refusal(proc) == (
        f"error: --target {planted['evil']}: it ships its own code "
        "(configuration_evil.py); pass --trust-remote-code to run it"
    )
    eagle3kit(planted, *args, "--trust-remote-code")  # goes as far as a token dataset goes
    assert planted["marker"].read_text().startswith("config\n")


def test_export_takes_no_consent_from_run_json(planted, tmp_path):
    args = ("export", planted["run"], tmp_path / "export")
    proc = eagle3kit(planted, *args)
    assert not planted["marker"].exists()
    assert refusal(proc) == (
        f"error: the recorded target {planted['evil']}: it ships its own "
        "code (configuration_evil.py); pass --trust-remote-code to run it"
    )
    eagle3kit(planted, *args, "--trust-remote-code")
    assert planted["marker"].read_text().startswith("config\n")

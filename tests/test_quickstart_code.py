"""A Kimi quickstart directory copied from elsewhere runs none of its own code (issue 38,
item 3): quickstart trusts the tokenizer's code only because it wrote it, so before any stage
loads anything with trust on, DIR is checked against what make_kimi_target writes, byte for
byte, and a directory with other code is refused in one line unless --trust-remote-code is
typed. `target-arch = "kimi"` in a --config file is no way around it.

Each case is a real quickstart continuation (`eagle3kit quickstart DIR --target-arch kimi`, a
real process) on a crafted DIR: quickstart.json says the target is done, target/ is a real
tiny Kimi target from make_kimi_target, and one thing is planted: a module that writes a
marker file when imported. Without the check, gen's tokenizer load imports it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from eagle3kit import quickstart, tiny, tiny_kimi
from eagle3kit.errors import UserError
from eagle3kit.quickstart.layout import STATE, Layout
from eagle3kit.quickstart.state import STATE_VERSION, check_code

REPO = Path(__file__).resolve().parent.parent
SETTINGS = {
    "prompts": 4,
    "bench_prompts": 1,
    "target_steps": 4,
    "train_steps": 2,
    "max_tokens": 16,
    "target_arch": "kimi",
}
FLAGS = [f"--{k.replace('_', '-')}={v}" for k, v in SETTINGS.items() if k != "target_arch"]
PLANTED = """from pathlib import Path

Path({marker!r}).write_text("planted code ran")
raise ImportError("planted")
"""
"""What a copied directory's module does when imported: leaves a marker, then fails (so a
case that does run it ends at once, not after a whole quickstart)."""


def eagle3kit(*args: object, home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE3KIT_")}
    # transformers copies a module it imports into its modules cache: the test's own.
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", HF_MODULES_CACHE=str(home))
    return subprocess.run(
        [sys.executable, "-m", "eagle3kit", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.fixture(scope="module")
def kimi(tmp_path_factory) -> Path:
    """A real tiny Kimi target as make_kimi_target writes it (the tokenizer on a small corpus)."""
    root = tmp_path_factory.mktemp("kimi")
    tokenizer = tiny_kimi.make_kimi_tokenizer(
        root / "tok", vocab_size=320, corpus=tiny.stdlib_docstrings(20_000)
    )
    return tiny_kimi.make_kimi_target(root / "target", tokenizer, num_layers=2)


def copied(kimi: Path, where: Path) -> Path:
    """A quickstart directory as another machine left it: the target stage done."""
    shutil.copytree(kimi, where / "target")
    (where / "target" / "tiny_training.json").write_text(json.dumps({"losses": [7.0, 6.0]}))
    (where / STATE).write_text(
        json.dumps(
            {
                "version": STATE_VERSION,
                "settings": SETTINGS,
                "stages": {"target": {"target_loss": 6.0, "seconds": 30.0}},
            }
        )
    )
    return where


def _own_file_other_bytes(target: Path, marker: Path) -> Path:
    planted = target / f"{tiny_kimi.KIMI_TOKENIZER_MODULE}.py"
    planted.write_text(PLANTED.format(marker=str(marker)))
    return planted


def _another_module(target: Path, marker: Path) -> Path:
    (target / "tokenization_kimi.py").write_text(PLANTED.format(marker=str(marker)))
    config = json.loads((target / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": [None, "tokenization_kimi.TinyKimiTokenizer"]}
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    return target / "tokenization_kimi.py"


def _another_directory(target: Path, marker: Path) -> Path:
    """auto_map's `DIR--module.Class`: transformers loads the module from that directory."""
    elsewhere = target.parent.parent / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / f"{tiny_kimi.KIMI_TOKENIZER_MODULE}.py").write_text(
        PLANTED.format(marker=str(marker))
    )
    config = json.loads((target / "tokenizer_config.json").read_text())
    config["auto_map"] = {
        "AutoTokenizer": [
            None,
            f"{elsewhere}--{tiny_kimi.KIMI_TOKENIZER_MODULE}.{tiny_kimi.KIMI_TOKENIZER_CLASS}",
        ]
    }
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    return target / "tokenizer_config.json"


def _linked_module(target: Path, marker: Path) -> Path:
    elsewhere = target.parent.parent / "elsewhere.py"
    elsewhere.write_text(PLANTED.format(marker=str(marker)))
    planted = target / f"{tiny_kimi.KIMI_TOKENIZER_MODULE}.py"
    planted.unlink()
    planted.symlink_to(elsewhere)
    return planted


PLANTS = {
    "the tokenizer's own file, other bytes": _own_file_other_bytes,
    "another module auto_map names": _another_module,
    "auto_map naming another directory": _another_directory,
    "the tokenizer's file a link out": _linked_module,
}


@pytest.mark.parametrize("plant", list(PLANTS))
def test_a_copied_kimi_quickstart_runs_none_of_its_own_code(
    plant: str, kimi: Path, tmp_path: Path
) -> None:
    out = copied(kimi, tmp_path / "qs")
    marker = tmp_path / "MARKER"
    planted = PLANTS[plant](out / "target", marker)
    state = (out / STATE).read_text()
    done = eagle3kit(
        "quickstart",
        out,
        "--target-arch",
        "kimi",
        *FLAGS,
        "--no-progress",
        home=tmp_path / "modules",
    )
    assert not marker.exists(), "the copied directory's code ran"
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith(f"error: {planted}: "), lines[0]
    assert lines[0].endswith(
        "; quickstart runs only the code it wrote itself: start afresh "
        "with --overwrite, or pass --trust-remote-code to run it"
    )
    assert (out / STATE).read_text() == state  # nothing recorded, nothing run
    assert sorted(p.name for p in out.iterdir()) == [STATE, "target"]


def test_target_arch_from_a_settings_file_runs_none_of_it_either(
    kimi: Path, tmp_path: Path
) -> None:
    out = copied(kimi, tmp_path / "qs")
    marker = tmp_path / "MARKER"
    planted = _own_file_other_bytes(out / "target", marker)
    settings = tmp_path / "qs.toml"
    settings.write_text('target-arch = "kimi"\n')
    done = eagle3kit(
        "quickstart", out, "--config", settings, *FLAGS, "--no-progress", home=tmp_path / "modules"
    )
    assert not marker.exists(), "the copied directory's code ran"
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.startswith(f"error: {planted}: Python code quickstart did not write")
    # Nor can the file give the consent the command line did not.
    settings.write_text('target-arch = "kimi"\ntrust-remote-code = true\n')
    done = eagle3kit(
        "quickstart", out, "--config", settings, *FLAGS, "--no-progress", home=tmp_path / "modules"
    )
    assert done.returncode == 2 and "taken from the command line only" in done.stderr
    assert not marker.exists()


def test_the_check_is_skipped_only_for_the_flag_or_a_llama_target(
    kimi: Path, tmp_path: Path
) -> None:
    out = copied(kimi, tmp_path / "qs")
    _own_file_other_bytes(out / "target", tmp_path / "MARKER")
    state = json.loads((out / STATE).read_text())
    lay = Layout(out)
    for trusted, arch in ((True, "kimi"), (False, "llama")):
        cfg = quickstart.QuickstartConfig(out, trust_remote_code=trusted, target_arch=arch)
        check_code(cfg, lay, state)
    with pytest.raises(UserError, match="Python code quickstart did not write"):
        check_code(quickstart.QuickstartConfig(out, target_arch="kimi"), lay, state)


@pytest.mark.slow  # a minute on a busy 2-core machine: torch, then the target, then gen
def test_the_flag_typed_runs_the_directorys_code(kimi: Path, tmp_path: Path) -> None:
    """--trust-remote-code on the command line is consent: the planted module is imported
    (and fails, as it was written to)."""
    out = copied(kimi, tmp_path / "qs")
    marker = tmp_path / "MARKER"
    _own_file_other_bytes(out / "target", marker)
    done = eagle3kit(
        "quickstart",
        out,
        "--target-arch",
        "kimi",
        *FLAGS,
        "--no-progress",
        "--trust-remote-code",
        home=tmp_path / "modules",
    )
    assert marker.read_text() == "planted code ran"
    assert done.returncode != 0


def test_what_make_kimi_target_writes_passes_and_a_change_anywhere_does_not(
    kimi: Path, tmp_path: Path
) -> None:
    """The check itself: a fresh target (and copies of its tokenizer deeper in DIR, as a
    dataset stores one) holds no foreign code; one changed byte, a FIFO or a planted config
    anywhere does."""
    root = tmp_path / "qs"
    shutil.copytree(kimi, root / "target")
    shutil.copytree(kimi, root / "tokens" / "tokenizer")
    assert tiny_kimi.foreign_code(root) is None
    code = root / "tokens" / "tokenizer" / f"{tiny_kimi.KIMI_TOKENIZER_MODULE}.py"
    code.write_bytes(code.read_bytes() + b"\n")
    assert tiny_kimi.foreign_code(root) == f"{code}: Python code quickstart did not write"
    code.write_bytes(tiny_kimi.KIMI_TOKENIZER_CODE.encode())
    (root / "run").mkdir()
    (root / "run" / "config.json").write_text(
        json.dumps({"auto_map": {"AutoConfig": "configuration_x.X"}})
    )
    assert tiny_kimi.foreign_code(root) == (
        f"{root / 'run' / 'config.json'}: its auto_map "
        '({"AutoConfig": "configuration_x.X"}) names code quickstart did not write'
    )
    (root / "run" / "config.json").unlink()
    os.mkfifo(root / "run" / "fifo")
    assert tiny_kimi.foreign_code(root) == f"{root / 'run' / 'fifo'}: not a regular file"
    # A target quickstart is about to write afresh is looked at, not into.
    (root / "run" / "fifo").unlink()
    (root / "target" / "evil.py").write_text("print('x')\n")
    assert tiny_kimi.foreign_code(root, rebuilt=root / "target") is None
    assert (
        tiny_kimi.foreign_code(root) == f"{root / 'target' / 'evil.py'}: Python code "
        "quickstart did not write"
    )

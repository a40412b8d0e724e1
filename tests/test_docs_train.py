"""docs/train.md runs: every command it shows, in order, the way tests/test_docs.py runs the
other pages (a fresh checkout-like directory, `eagle3kit` forked from a pre-warmed
interpreter, `# exits N` honoured), and it describes every option `train --help` lists."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from test_docs import (  # noqa: F401  (prewarmed is a fixture)
    REPO,
    _checkout_like,
    _doc_env,
    _shims,
    commands,
    prewarmed,
)

DOC = REPO / "docs" / "train.md"


@pytest.mark.slow  # a target, gen, extract and five short trainings: minutes on 2 busy cores
def test_train_doc_commands_run(tmp_path: Path, prewarmed) -> None:  # noqa: F811
    cmds = commands(DOC)
    assert sum("eagle3kit train" in c.text for c in cmds) >= 5
    work = _checkout_like(tmp_path)
    _shims(tmp_path / "bin", prewarmed)
    env = {**_doc_env(tmp_path / "bin"), "OMP_NUM_THREADS": "1"}
    for cmd in cmds:
        proc = subprocess.run(["bash", "-c", cmd.text], cwd=work, env=env, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == cmd.status, (
            f"train.md:{cmd.line}: `{cmd.text}` exited {proc.returncode}, the doc says "
            f"{cmd.status}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}")
        if cmd.status == 2:
            assert "Traceback" not in proc.stderr and proc.stderr.count("error: ") == 1
        if "--json" in cmd.text:
            assert json.loads(proc.stdout)["steps"] == 2
    for run in ("tiny-run", "tiny-run-offline", "tiny-run-warm"):
        drafter = json.loads((work / run / "drafter" / "config.json").read_text())
        assert drafter["eagle3kit"]["eval"]["k"] == 3, run
    assert not (work / "bad-run").exists()


def test_every_train_option_is_documented() -> None:
    from typer.main import get_command

    from eagle3kit.cli import app

    command = get_command(app).commands["train"]  # type: ignore[attr-defined]
    flags = {opt for param in command.params for opt in param.opts if opt.startswith("--")}
    page = DOC.read_text()
    missing = sorted(f for f in flags - {"--help"} if f"`{f}" not in page)
    assert not missing, f"docs/train.md does not describe {missing}"

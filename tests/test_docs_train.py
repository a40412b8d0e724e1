"""docs/train.md runs: every command it shows, in order, the way tests/test_docs.py runs the
other pages (a fresh checkout-like directory, `eagle3kit` forked from a pre-warmed
interpreter, `# exits N` honoured), and it describes every option `train --help` lists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from doc_runner import (  # noqa: F401  (prewarmed is a fixture)
    REPO,
    commands,
    prewarmed,
    run_page,
)

DOC = REPO / "docs" / "train.md"


@pytest.mark.slow  # a target, gen, extract, ten short trainings and a torchrun: minutes
@pytest.mark.timeout(1800)
def test_train_doc_commands_run(tmp_path: Path, prewarmed) -> None:  # noqa: F811
    cmds = commands(DOC)
    assert sum("eagle3kit train" in c.text for c in cmds) >= 5
    work, ran = run_page(DOC, tmp_path, prewarmed, timeout=600)
    for cmd, proc in ran:
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

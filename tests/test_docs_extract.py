"""docs/extract.md runs: every command it shows, in order, the way tests/test_docs.py runs
the other pages (a fresh checkout-like directory, `eagle3kit` forked from a pre-warmed
interpreter, `# exits N` honoured), and it describes every option `extract --help` lists."""

from __future__ import annotations

from pathlib import Path

import pytest
from doc_runner import (  # noqa: F401  (prewarmed is a fixture)
    REPO,
    commands,
    prewarmed,
    run_page,
)

DOC = REPO / "docs" / "extract.md"


@pytest.mark.slow  # a tokenizer, a target, gen and several extracts: minutes on 2 busy cores
def test_extract_doc_commands_run(tmp_path: Path, prewarmed) -> None:  # noqa: F811
    cmds = commands(DOC)
    assert any("eagle3kit extract" in c.text for c in cmds)
    work, _ = run_page(DOC, tmp_path, prewarmed, timeout=600)
    assert (work / "tiny-hidden" / "eagle3kit.json").is_file()
    assert not (work / "bad").exists() and not (work / "tiny-hidden-fp8").exists()


def test_every_extract_option_is_documented() -> None:
    from typer.main import get_command

    from eagle3kit.cli import app

    command = get_command(app).commands["extract"]  # type: ignore[attr-defined]
    flags = {opt for param in command.params for opt in param.opts if opt.startswith("--")}
    page = DOC.read_text()
    missing = sorted(f for f in flags - {"--help"} if f"`{f}" not in page)
    assert not missing, f"docs/extract.md does not describe {missing}"

"""docs/quickstart.md runs: every command it shows, in order, the way tests/test_docs.py runs
the other pages (a fresh checkout-like directory, `eagle3kit` forked from a pre-warmed
interpreter, `# exits N` honoured). That is a full quickstart and the same pipeline again by
hand, so it is `slow`; the default run checks that the page's by-hand commands are the ones
quickstart prints and that it describes every option."""

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

from eagle3kit import quickstart
from eagle3kit.quickstart.commands import commands as commands_by_hand
from eagle3kit.quickstart.layout import Layout

DOC = REPO / "docs" / "quickstart.md"


def by_hand_commands() -> dict[str, str]:
    """quickstart's by-hand command lines with the page's directories: the quickstart's
    prompts, everything else written under by-hand/."""
    cfg = quickstart.QuickstartConfig()
    lay = Layout(Path("by-hand"))
    shown = commands_by_hand(cfg, lay)
    prompts = str(Layout(cfg.out).train_prompts)
    bench = str(Layout(cfg.out).bench_prompts)
    shown["gen"] = shown["gen"].replace(str(lay.train_prompts), prompts)
    shown["bench"] = shown["bench"].replace(str(lay.bench_prompts), bench)
    return shown


def test_by_hand_commands_are_the_ones_quickstart_prints() -> None:
    page = [c.text for c in commands(DOC)]
    for stage, line in by_hand_commands().items():
        assert line in page, f"docs/quickstart.md lacks the {stage} command:\n{line}"


def test_every_quickstart_option_is_documented() -> None:
    from typer.main import get_command

    from eagle3kit.cli import app

    command = get_command(app).commands["quickstart"]  # type: ignore[attr-defined]
    flags = {opt for param in command.params for opt in param.opts if opt.startswith("--")}
    page = DOC.read_text()
    missing = sorted(f for f in flags - {"--help"} if f"`{f}" not in page)
    assert not missing, f"docs/quickstart.md does not describe {missing}"


@pytest.mark.slow  # a full quickstart, then the same pipeline by hand: ~10 minutes on 2 cores
@pytest.mark.timeout(2400)
def test_quickstart_doc_commands_run(
    tmp_path: Path,
    prewarmed,  # noqa: F811
    finished_quickstart,
) -> None:
    """The page's commands, the full quickstart being the session's one (its own test holds
    its promise): copied in, the page's `eagle3kit quickstart` finds it done."""
    cmds = commands(DOC)
    assert any(c.text == "eagle3kit quickstart" for c in cmds)
    work, ran = run_page(DOC, tmp_path, prewarmed, timeout=900, finished=finished_quickstart)
    for cmd, proc in ran:
        if cmd.text.startswith("eagle3kit quickstart") and "--json" in cmd.text:
            summary = json.loads(proc.stdout)
            assert summary["measured_acceptance_length"] >= 1.5
    drafter = json.loads((work / "by-hand" / "run" / "drafter" / "config.json").read_text())
    assert drafter["eagle3kit"]["eval"]["k"] == 3
    assert (work / "by-hand" / "export" / "sglang" / "config.json").is_file()

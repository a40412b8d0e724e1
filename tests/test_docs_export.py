"""docs/export.md and docs/info-checkpoints.md run: every command they show, in order, in a
checkout-like temp directory (the machinery of tests/test_docs.py, its pre-warmed interpreter
included), and the serving lines of docs/export.md use real server flags."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest
from doc_runner import checkout_like, commands, doc_env, prewarmed, shims  # noqa: F401
from launch_blocks import blocks, logical_lines, parse

REPO = Path(__file__).resolve().parent.parent
# export.md trains nothing but exports and reloads several times (half a minute on 2 cores):
# it runs in the slow suite, so the default run stays within its budget.
PAGES = [
    pytest.param(REPO / "docs" / "export.md", id="export.md", marks=pytest.mark.slow),
    pytest.param(REPO / "docs" / "info-checkpoints.md", id="info-checkpoints.md"),
]


@pytest.mark.parametrize("doc", PAGES)
def test_doc_commands_run(doc: Path, tmp_path: Path, prewarmed) -> None:  # noqa: F811
    cmds = commands(doc)
    assert any(c.text.startswith("eagle3kit ") for c in cmds)
    work = checkout_like(tmp_path)
    shims(tmp_path / "bin", prewarmed)
    env = doc_env(tmp_path / "bin")
    for cmd in cmds:
        proc = subprocess.run(
            ["bash", "-c", cmd.text], cwd=work, env=env, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == cmd.status, (
            f"{doc.name}:{cmd.line}: `{cmd.text}` exited {proc.returncode}, the doc says "
            f"{cmd.status}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
        )
        assert "Traceback" not in proc.stderr, f"{doc.name}:{cmd.line}: {proc.stderr[-3000:]}"


def launches():
    page = REPO / "docs" / "export.md"
    return [
        parse(n, line)
        for lang, first, body in blocks(page)
        if lang == "launch"
        for n, line in logical_lines(body, first)
    ]


def test_serving_lines_use_documented_flags() -> None:
    found = launches()  # parse() raises on an unknown flag or a badly typed value
    assert {x.server for x in found} == {"vllm", "sglang"}
    for launch in found:
        assert launch.model and launch.get("--port")
        assert launch.get("--tensor-parallel-size", "--tp") == "8"
    long_form = next(x for x in found if x.get("--speculative-config"))
    spec = json.loads(long_form.get("--speculative-config"))
    assert spec["method"] == "eagle3" and spec["model"] == "drafter/vllm"
    assert isinstance(spec["num_speculative_tokens"], int)
    sglang = next(x for x in found if x.server == "sglang")
    assert sglang.get("--speculative-algorithm") == "EAGLE3"
    assert sglang.get("--speculative-draft-model-path") == "drafter/sglang"
    assert int(sglang.get("--speculative-num-draft-tokens")) == (
        int(sglang.get("--speculative-num-steps")) + 1
    )  # a chain: topk 1, steps + 1 tokens


def test_launch_lines_are_not_run() -> None:
    """They are in ```launch blocks, which neither doc test executes."""
    texts = " ".join(c.text for c in commands(REPO / "docs" / "export.md"))
    assert "vllm serve" not in texts and "sglang.launch_server" not in texts
    assert all(shlex.split(x.model or "x") for x in launches())


def test_every_export_option_is_documented() -> None:
    from typer.main import get_command

    from eagle3kit.cli import app

    command = get_command(app).commands["export"]
    flags = {opt for param in command.params for opt in param.opts if opt.startswith("--")}
    page = (REPO / "docs" / "export.md").read_text()
    missing = sorted(f for f in flags - {"--help"} if f"`{f}" not in page)
    assert not missing, f"docs/export.md does not describe {missing}"
    info_page = (REPO / "docs" / "info-checkpoints.md").read_text()
    assert "`--target" in info_page

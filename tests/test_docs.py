"""The documentation runs: every command it shows, and the example data it ships.

Each Markdown file's `console`, `bash`, `sh` and `shell` code blocks are run in order, in a
fresh temp directory laid out like a checkout (a copy of examples/, and tests/data/), because
later commands use what earlier ones wrote. In `console` blocks the commands are the lines
starting with "$ " (the rest is output, not checked); in the others every line that is not a
comment is a command. `&&` chains are split and run one by one; `pip install` and
`python -m pytest` parts are skipped (the first is the set-up, the second is this test suite).

A command must exit 0 unless its line ends with a comment such as `# exits 2`. `eagle3kit`
and `python` resolve to the interpreter running the tests. Text blocks (```text) are
transcripts that cannot run here (an interrupted run, a full disk) and are not executed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RUN_LANGS = {"console", "bash", "sh", "shell"}
FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
EXPECT = re.compile(r"\s+#\s*exits\s+(\d+)\s*$")
SKIPPED = ("pip install ", "python -m pytest")
TEST_COMMAND = "pip install torch==2.13.0 && pip install -e '.[test]' && python -m pytest"
MAIN_COMMAND = (
    "pip install torch==2.13.0 && pip install -e . && "
    "eagle3kit convert examples/tiny.jsonl tiny-dataset && eagle3kit info tiny-dataset"
)


@dataclass
class Command:
    line: int
    text: str
    status: int


def code_blocks(path: Path) -> list[tuple[str, int, str]]:
    """(language, first line number, body) of each fenced block."""
    text = path.read_text()
    return [
        (m.group(1).lower(), text.count("\n", 0, m.start(2)) + 1, m.group(2))
        for m in FENCE.finditer(text)
    ]


def block_commands(lang: str, body: str) -> list[tuple[int, str]]:
    out = []
    for i, raw in enumerate(body.splitlines()):
        line = raw.strip()
        if lang == "console":
            if not line.startswith("$ "):
                continue
            line = line[2:].strip()
        elif not line or line.startswith("#"):
            continue
        out.append((i, line))
    return out


def commands(path: Path) -> list[Command]:
    """Every command of the runnable blocks in `path`, && chains split, set-up parts dropped."""
    found = []
    for lang, first, body in code_blocks(path):
        if lang not in RUN_LANGS:
            continue
        for offset, line in block_commands(lang, body):
            m = EXPECT.search(line)
            status = int(m.group(1)) if m else 0
            parts = [p.strip() for p in EXPECT.sub("", line).split("&&")]
            parts = [p for p in parts if not p.startswith(SKIPPED)]
            for k, part in enumerate(parts):
                found.append(Command(first + offset, part, status if k == len(parts) - 1 else 0))
    return found


def _shims(bin_dir: Path) -> None:
    """`eagle3kit` and `python` as the interpreter running the tests."""
    bin_dir.mkdir()
    for name, target in (
        ("eagle3kit", f'"{sys.executable}" -m eagle3kit'),
        ("python", f'"{sys.executable}"'),
    ):
        shim = bin_dir / name
        shim.write_text(f'#!/bin/sh\nexec {target} "$@"\n')
        shim.chmod(0o755)


def _checkout_like(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    shutil.copytree(
        REPO / "examples", work / "examples", ignore=shutil.ignore_patterns("__pycache__")
    )
    (work / "tests").mkdir()
    (work / "tests" / "data").symlink_to(REPO / "tests" / "data")
    return work


@pytest.mark.parametrize("doc", DOCS, ids=[str(p.relative_to(REPO)) for p in DOCS])
def test_doc_commands_run(doc: Path, tmp_path: Path) -> None:
    cmds = commands(doc)
    if doc.name == "index.md":  # a map of the other pages
        assert not cmds
        return
    assert cmds, f"{doc.name}: no runnable commands found"
    work = _checkout_like(tmp_path)
    _shims(tmp_path / "bin")
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE3KIT_")}
    env.update(
        PATH=f"{tmp_path / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        COLUMNS="100",
        PYTHONPATH=str(REPO),
    )
    for cmd in cmds:
        proc = subprocess.run(
            ["bash", "-c", cmd.text], cwd=work, env=env, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == cmd.status, (
            f"{doc.name}:{cmd.line}: `{cmd.text}` exited {proc.returncode}, the doc says "
            f"{cmd.status}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
        )


def test_every_doc_is_checked() -> None:
    names = {p.name for p in DOCS}
    assert {
        "README.md",
        "format.md",
        "cli.md",
        "info.md",
        "convert.md",
        "troubleshooting.md",
        "index.md",
    } <= names


def test_readme_has_exactly_two_setup_commands() -> None:
    setup = [
        body.strip()
        for lang, _, body in code_blocks(REPO / "README.md")
        if lang in RUN_LANGS and "pip install" in body
    ]
    assert setup == [MAIN_COMMAND, TEST_COMMAND]


def test_ci_runs_the_readme_test_command() -> None:
    lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert TEST_COMMAND in lines


def test_make_tiny_regenerates_tiny_jsonl(tmp_path: Path) -> None:
    out = tmp_path / "tiny.jsonl"
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples" / "make_tiny.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == (REPO / "examples" / "tiny.jsonl").read_bytes()


def test_tiny_jsonl_stays_small() -> None:
    data = (REPO / "examples" / "tiny.jsonl").read_bytes()
    assert len(data) < 100_000
    assert 10 <= data.count(b"\n") <= 16


def test_extraction_rules() -> None:
    body = "$ a && pip install x && b  # exits 2\noutput line\n$ c\n"
    assert block_commands("console", body) == [(0, "a && pip install x && b  # exits 2"), (2, "c")]
    assert block_commands("bash", "# comment\n\nx y\n") == [(2, "x y")]

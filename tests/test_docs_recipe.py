"""The single-node 1T recipe of docs/running-at-scale.md: every eagle3kit command parses.

The recipe cannot run here (a 1T target on 8 GPUs), so each `eagle3kit ...` line of its
text blocks (also under `torchrun ... -m eagle3kit`) is parsed by the real command line,
which refuses an unknown flag, a missing value or a value of the wrong type; its server
lines are launch blocks, checked by tests/test_launch_lines.py.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.main import get_command

from eagle3kit.cli import app

PAGE = Path(__file__).resolve().parent.parent / "docs" / "running-at-scale.md"
SECTION = "### The single-node 1T recipe"
FENCE = re.compile(r"^\s*```text\n(.*?)^\s*```", re.M | re.S)


def recipe_commands() -> list[list[str]]:
    text = PAGE.read_text()
    start = text.index(SECTION)
    end = text.index("\n### ", start + len(SECTION))
    out = []
    for block in FENCE.findall(text[start:end]):
        for line in block.splitlines():
            words = shlex.split(line)
            if "eagle3kit" in words:
                out.append(words[words.index("eagle3kit") + 1 :])
    return out


def test_the_recipe_has_every_stage():
    stages = [words[0] for words in recipe_commands()]
    assert {"plan", "gen", "validate", "train", "extract", "export", "bench"} <= set(stages)
    train = [w for w in recipe_commands() if w[0] == "train" and "--server" in w]
    assert train and "--online" in train[0] and "2,30,58" in train[0]


@pytest.mark.parametrize("words", recipe_commands(), ids=lambda w: " ".join(w[:2]))
def test_a_recipe_command_parses(words):
    group = get_command(app)
    command, args = group.commands[words[0]], words[1:]  # type: ignore[attr-defined]
    if hasattr(command, "commands"):  # bench server
        command, args = command.commands[args[0]], args[1:]
    with command.make_context(words[0], list(args)) as ctx:  # raises on any bad flag
        assert ctx.params


def test_a_wrong_flag_would_be_caught():
    command = get_command(app).commands["train"]  # type: ignore[attr-defined]
    with pytest.raises(Exception, match="No such option: --prefetchh"):
        command.make_context("train", ["tokens", "run", "--prefetchh", "3"])

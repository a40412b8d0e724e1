"""Regenerate `COLUMNS=100 eagle3kit <cmd> --help` for every command and compare with saved
copies: the raw diff, and the facts that must not change (each option's names, metavar,
panel, default and required mark), compared apart from wording.

    python tests/scripts/help_diff.py SAVED_DIR [OUT_DIR]
"""

from __future__ import annotations

import difflib
import os
import re
import subprocess
import sys
from pathlib import Path

COMMANDS = [
    "",
    "info",
    "convert",
    "validate",
    "gen",
    "plan",
    "extract",
    "train",
    "export",
    "bench",
    "bench accept",
    "bench server",
    "bench parity",
    "quickstart",
]
ROW = re.compile(r"^│\s*(\*)?\s*(--?[a-zA-Z][\w-]*(?:/--[\w-]+)?)\s+(-\w)?\s*(\S*)")


def render(command: str) -> str:
    env = {**os.environ, "COLUMNS": "100"}
    return subprocess.run(
        ["eagle3kit", *command.split(), "--help"],
        env=env,
        text=True,
        capture_output=True,
        check=True,
    ).stdout


def facts(text: str) -> set[tuple]:
    """(panel, option, required, metavar-or-default words) for each option row."""
    out, panel, current = set(), None, None
    for line in text.splitlines():
        if line.startswith("╭─"):
            panel = line.strip("╭─╮ ").rstrip("─ ")
        m = ROW.match(line)
        if m:
            word = m.group(4) or ""
            current = [
                panel,
                m.group(2),
                bool(m.group(1)),
                word if word.isupper() or "," in word else "",
            ]
            out.add(tuple(current))
        for default in re.findall(r"\[default: ([^\]]*)\]", line):
            if current:
                out.add((current[0], current[1], "default", default))
    return out


def main() -> int:
    saved = Path(sys.argv[1])
    changed = 0
    for command in COMMANDS:
        name = "root_" + command.replace(" ", "_") + ".txt"
        before, after = (saved / name).read_text(), render(command)
        if len(sys.argv) > 2:
            (Path(sys.argv[2]) / name).write_text(after)
        lost, gained = facts(before) - facts(after), facts(after) - facts(before)
        if lost or gained:
            changed += 1
            print(f"== {command or '(top)'}: options, metavars, panels or defaults differ")
            for fact in sorted(lost, key=str):
                print("  -", fact)
            for fact in sorted(gained, key=str):
                print("  +", fact)
        diff = list(difflib.unified_diff(before.splitlines(), after.splitlines(), n=0, lineterm=""))
        print(f"-- {command or '(top)'}: {max(0, len(diff) - 2)} lines of raw diff")
    return 1 if changed else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""One full `eagle3kit quickstart` per test run, shared by every test that needs a finished one.

The full quickstart is the slow tier's most expensive command (2-3 minutes on a busy 2-core
machine), and three tests need it: its own promise (tests/test_quickstart.py: the acceptance
length, in time), the README's first command and docs/quickstart.md's (tests/test_docs.py,
tests/test_docs_quickstart.py). It runs once, from a fresh interpreter exactly as a user
types it (`python -m eagle3kit quickstart DIR --json`), and the first test to ask runs it
while the others wait; a page's test then copies the finished directory where the page's
commands expect it, and its `eagle3kit quickstart` finds every stage done (a copied
quickstart is accepted: nothing in its record names where it was made).

Across xdist workers the run is shared through the session's common temporary folder (the
parent of each worker's own) under a file lock; without xdist it is the session's own folder.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

DONE = "quickstart-done.json"


@dataclass(frozen=True)
class FinishedQuickstart:
    """The shared run: its directory, how long it took, and what it printed."""

    directory: Path
    seconds: float
    returncode: int
    summary: dict
    stderr_tail: str

    def copy_to(self, where: Path) -> Path:
        """A copy of the finished directory at `where` (hard links would let a test's rerun
        change the shared files: quickstart rewrites its record)."""
        assert self.returncode == 0, self.stderr_tail
        shutil.copytree(self.directory, where)
        return where


def shared_root(basetemp: Path) -> Path:
    """The folder every xdist worker of this session sees: pytest-N/, the parent of a
    worker's popen-gwK/; the session's own folder without xdist."""
    return basetemp.parent if os.environ.get("PYTEST_XDIST_WORKER") else basetemp


def run_once(root: Path) -> FinishedQuickstart:
    """The session's full quickstart under `root`, run now if no test has run it yet."""
    with open(root / "quickstart.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second worker waits here for the first's run
        record = root / DONE
        if not record.exists():
            record.write_text(json.dumps(_run(root / "quickstart" / "qs")))
        fields = json.loads(record.read_text())
    return FinishedQuickstart(**{**fields, "directory": Path(fields["directory"])})


def _run(out: Path) -> dict:
    out.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "EAGLE3KIT_NO_PROGRESS": "1"}
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "eagle3kit", "quickstart", str(out), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    seconds = time.perf_counter() - start
    try:
        summary = json.loads(proc.stdout) if proc.returncode == 0 else {}
    except ValueError:
        summary = {}
    return {
        "directory": str(out),
        "seconds": round(seconds, 1),
        "returncode": proc.returncode,
        "summary": summary,
        "stderr_tail": proc.stderr[-3000:],
    }

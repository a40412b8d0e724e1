"""The type hints hold: mypy checks eagle3kit/ with the settings in pyproject.toml's
[tool.mypy] section, and finds nothing.

It runs from the repository root with mypy's own cache there (.mypy_cache/, ignored by git):
a cold run is about 30 s of CPU, a run after a small change a few seconds.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_mypy_finds_no_error_in_the_package() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=REPO, capture_output=True, text=True, timeout=280
    )
    assert done.returncode == 0, f"mypy found errors:\n{done.stdout}{done.stderr}"
    assert "Success: no issues found" in done.stdout, done.stdout

"""Fixtures shared by several test modules, and the guard that keeps tests inside the checkout."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BESIDE = os.path.join(os.path.dirname(str(REPO)), "shared")
"""Where CI keeps the project's shared/ folder: beside the checkout. A user's clone has no such
folder, so a test that reads it passes in CI and fails (or skips) for everyone else."""
_WATCHED = frozenset({"open", "os.listdir", "os.scandir"})
fenced = [BESIDE]
"""Folders the guard refuses (its own test fences a temporary one instead of touching BESIDE)."""
outside_reads: list[str] = []


def _audit(event: str, args: tuple) -> None:
    if event not in _WATCHED or not args:
        return
    path = args[0]
    if isinstance(path, int) or path is None:
        return
    try:
        path = os.path.abspath(os.fsdecode(path))
    except (TypeError, ValueError):
        return
    if any(path == fence or path.startswith(fence + os.sep) for fence in fenced):
        outside_reads.append(path)
        raise PermissionError(f"{path}: tests may read only what the repository holds; copy "
                              "the file into tests/data/ with its origin line")


sys.addaudithook(_audit)


@pytest.fixture(autouse=True)
def _reads_stay_inside_the_repository():
    """Fail any test that read from beside the checkout, even one that caught the error."""
    yield
    if outside_reads:
        found = sorted(set(outside_reads))
        outside_reads.clear()
        pytest.fail(f"read outside the repository: {', '.join(found)}", pytrace=False)


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module's tests: the 2-core machines they run on are shared, and
    a tiny model's forward passes lose 10-20x to threads spinning against other processes.
    Modules take it with `pytestmark = pytest.mark.usefixtures("one_torch_thread")`."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

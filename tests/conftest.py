"""Fixtures shared by several test modules."""

from __future__ import annotations

import pytest


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

"""Drafter checkpoints on disk: eagle3kit's own layout (`native.py`), the layouts `export`
writes (`speculators.py`, `sglang.py`: each its writer beside what is its own in reading it),
the layouts other trainers write (`detect.py` names and reads them, `problems.py` checks them,
`load.py` loads them into an `Eagle3Drafter`), and the training run directory (`rundir.py`).

The model package is the nn.Module and its config only; everything that reads or writes
weight files lives here. Submodules import torch only inside functions, so `inspect` runs
without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from eagle3kit._lazy import attribute_loader

_HOMES = {
    "RunDir": "rundir",
    "save_drafter": "native",
    "load_drafter": "native",
    "inspect": "detect",
    "load_any": "load",
}

__all__ = ["RunDir", "inspect", "load_any", "load_drafter", "save_drafter"]

if TYPE_CHECKING:
    from eagle3kit.checkpoints.detect import inspect
    from eagle3kit.checkpoints.load import load_any
    from eagle3kit.checkpoints.native import load_drafter, save_drafter
    from eagle3kit.checkpoints.rundir import RunDir

__getattr__ = attribute_loader(__name__, _HOMES)

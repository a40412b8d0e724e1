"""Drafter checkpoints on disk: eagle3kit's own layout (`native.py`), the layouts `export`
writes (`speculators.py`, `sglang.py`: each its writer beside what is its own in reading it),
the layouts other trainers write (`detect.py` names and reads them, `problems.py` checks them,
`load.py` loads them into an `Eagle3Drafter`), and the training run directory (`rundir.py`).

The model package is the nn.Module and its config only; everything that reads or writes
weight files lives here. Submodules import torch only inside functions, so `inspect` runs
without it.
"""

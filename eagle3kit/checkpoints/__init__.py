"""Drafter checkpoints on disk: eagle3kit's own layout (`native.py`: save and load) and the
third-party ones it reads (`layouts.py`: speculators, SpecForge, EAGLE, SGLang and the rest,
inspected without torch and loaded into an `Eagle3Drafter`).

The model package is the nn.Module and its config only; everything that reads or writes
weight files lives here. Submodules import torch only inside functions where they can.
"""

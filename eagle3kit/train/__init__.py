"""Training an EAGLE-3 drafter: offline from hidden-state datasets, or online with the
target in the loop. `run(TrainConfig)` (run.py) is the stage: set-up (setup.py) builds the
run once, the loop (loop.py) steps it, checkpointing.py saves and resumes it, feed.py feeds
it, heldout.py evaluates it (over the rounds a decode makes, rounds.py), ttt.py and
losses.py are its loss; `evaluate` predicts acceptance.

Importing this package is free: `TrainConfig` checks a command line before torch loads,
`run` loads torch when called, and the rest (all torch) loads on first use. See
docs/train.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from eagle3kit._lazy import attribute_loader
from eagle3kit.train.config import TrainConfig
from eagle3kit.train.option_values import DataSpec
from eagle3kit.train.result import TrainResult
from eagle3kit.train.run import run

_HOMES = {
    "OfflineTarget": "target",
    "OnlineTarget": "target",
    "TargetBatch": "target",
    "TargetHead": "target",
    "TTTLoss": "ttt",
    "held_out": "data",
    "step_counts": "ttt",
    "EvalResult": "heldout",
    "chain_verdicts": "heldout",
    "conditional_counts": "heldout",
    "evaluate": "heldout",
    "predicted_acceptance_length": "heldout",
}

__all__ = [
    "DataSpec",
    "EvalResult",
    "OfflineTarget",
    "OnlineTarget",
    "TTTLoss",
    "TargetBatch",
    "TargetHead",
    "TrainConfig",
    "TrainResult",
    "chain_verdicts",
    "conditional_counts",
    "evaluate",
    "held_out",
    "predicted_acceptance_length",
    "run",
    "step_counts",
]

if TYPE_CHECKING:
    from eagle3kit.train.data import held_out
    from eagle3kit.train.heldout import (
        EvalResult,
        chain_verdicts,
        conditional_counts,
        evaluate,
        predicted_acceptance_length,
    )
    from eagle3kit.train.target import OfflineTarget, OnlineTarget, TargetBatch, TargetHead
    from eagle3kit.train.ttt import TTTLoss, step_counts


__getattr__ = attribute_loader(__name__, _HOMES)

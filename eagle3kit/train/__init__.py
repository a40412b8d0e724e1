"""Training an EAGLE-3 drafter: offline from hidden-state datasets, or online with the
target in the loop. `run(TrainConfig)` is the stage; `evaluate` predicts acceptance.

See docs/train.md.
"""

from eagle3kit.train.config import DataSpec, TrainConfig, TrainResult
from eagle3kit.train.loop import Trainer, run
from eagle3kit.train.target import OfflineTarget, OnlineTarget, TargetBatch, TargetHead
from eagle3kit.train.ttt import (
    EvalResult,
    TTTLoss,
    chain_verdicts,
    conditional_counts,
    evaluate,
    predicted_acceptance_length,
)

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
    "Trainer",
    "chain_verdicts",
    "conditional_counts",
    "evaluate",
    "predicted_acceptance_length",
    "run",
]

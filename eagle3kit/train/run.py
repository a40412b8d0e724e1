"""`eagle3kit train`'s entry: the stage's `run`, which loads torch only when called (the
orchestration is the Trainer's, in loop.py)."""

from __future__ import annotations

from eagle3kit.train.config import TrainConfig, TrainResult


def run(cfg: TrainConfig) -> TrainResult:
    """Train (or continue) the run `cfg` describes; see eagle3kit.train.loop.run."""
    from eagle3kit.train.loop import run as train

    return train(cfg)

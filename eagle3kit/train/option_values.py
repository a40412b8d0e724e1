"""The values train's options take: the fixed choices of each option that has them, the
options that decide a run's trajectory, DATA[:WEIGHT], one dataset and its mixing weight,
and --lr's default for a drafter's width. No torch, as for config.py."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from eagle3kit.errors import UserError

LONG_POLICIES = ("drop", "truncate")
DTYPES = ("auto", "bfloat16", "float32")
"""--dtype: the drafter's autocast (float16 would need a loss scaler)."""
RECORDED_DTYPES = {"bfloat16": "bf16", "float32": "fp32"}
"""How run.json records --dtype (as `precision`, its old name and spelling), so a run
started before the one dtype vocabulary continues without --force."""
SCHEDULES = ("cosine", "linear", "constant")
LM_HEADS = ("train", "target", "frozen")
DATA_ORDERS = ("shuffle", "fixed")
LOSSES = ("soft-ce", "tv", "nla", "lk")
"""--loss: the per-step loss between the drafter's and the target's distributions (the
functions are eagle3kit/train/losses.py's, by these names)."""
DRAFTER_STEPS = ("best", "last")
"""--drafter-step: what RUN/drafter/ holds (eagle3kit/train/selection.py)."""

TRAJECTORY_OPTIONS = (
    "data",
    "target",
    "online",
    "layers",
    "draft_vocab",
    "init_from",
    "ttt_steps",
    "ttt_decay",
    "max_len",
    "long_samples",
    "lr",
    "min_lr",
    "warmup",
    "weight_decay",
    "grad_clip",
    "batch_tokens",
    "grad_accum",
    "epochs",
    "max_steps",
    "seed",
    "eval_split",
    "eval_k",
    "precision",
    "schedule",
    "lm_head",
    "data_order",
)
"""The options that decide a run's trajectory: continuing a run with any of them changed
needs --force. Logging, checkpoint cadence, --device, --fsdp, --eval-every and
--drafter-step may change freely."""


@dataclass(frozen=True)
class DataSpec:
    """One training dataset and its mixing weight (`DIR` or `DIR:0.3`)."""

    path: Path
    weight: float = 1.0

    @classmethod
    def parse(cls, text: str | Path | DataSpec) -> DataSpec:
        """`DIR` or `DIR:WEIGHT`; a colon followed by something that is not a number is part
        of the path."""
        if isinstance(text, DataSpec):
            return text
        raw = str(text)
        head, sep, tail = raw.rpartition(":")
        if sep and head:
            try:
                weight = float(tail)
            except ValueError:
                return cls(Path(raw))
            if not (weight > 0 and math.isfinite(weight)):
                raise UserError(f"{raw}: a dataset weight must be a number > 0 (got {tail})")
            return cls(Path(head), weight)
        return cls(Path(raw))

    def to_json(self) -> dict:
        return {"path": str(self.path.resolve()), "weight": self.weight}


# The learning rate's default --------------------------------------------------------------
DEFAULT_LR = 1e-4
"""--lr's default at full width (hidden 4,096 and up): EAGLE-3's and the peers'."""
DEFAULT_LR_WIDTH = 4096
MAX_DEFAULT_LR = 1e-3
"""--lr's default at hidden 64 and below: the tuned rate of a narrow drafter."""
MAX_DEFAULT_LR_WIDTH = 64


def default_lr(hidden_size: int) -> float:
    """--lr's default for a drafter of `hidden_size`: log-linear in the width between 1e-4
    at hidden 4,096 (the peers' rate, tuned at full width) and 1e-3 at hidden 64, where a
    narrow drafter learns too slowly at 1e-4 (docs/train.md, "Why these defaults": held-out
    acceptance 1.30 at 1e-4, 2.53 at 8e-4, 2.64 at 1e-3 for the same steps), and within
    those two rates outside them."""
    slope = math.log(MAX_DEFAULT_LR / DEFAULT_LR) / math.log(
        DEFAULT_LR_WIDTH / MAX_DEFAULT_LR_WIDTH
    )
    scaled = DEFAULT_LR * (DEFAULT_LR_WIDTH / max(hidden_size, 1)) ** slope
    return min(MAX_DEFAULT_LR, max(DEFAULT_LR, scaled))

"""plan's settings: the gen run to forecast and the forecast's own options."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from eagle3kit._options import SEED_BOUNDS, embed, not_option, opt
from eagle3kit.errors import UserError
from eagle3kit.gen import GenConfig
from eagle3kit.target import check_layer_ids, parse_layer_ids

PLAN = "The forecast"
"""The help panel of plan's own options (gen's keep their panels)."""
REPLICATES = 200
"""Bootstrap replicates a forecast draws (fewer for a big run: run.DRAW_BUDGET)."""


@dataclass
class PlanConfig:
    gen: GenConfig = field(metadata=embed())
    """The gen run to forecast: the same prompts, servers, output and settings."""
    pilot: str | float | None = field(default=None, metadata=opt(metavar="N|SHARE", panel=PLAN))
    """Pilot prompts: a count (200), or a share of the run like 0.05 or 5% (default 1% or 200,
    whichever is larger)."""
    hidden_size: int | None = field(default=None, metadata=opt(panel=PLAN))
    """The target's hidden size (default: from --target's config.json)."""
    layers: list[int] | str | None = field(
        default=None, metadata=opt(metavar="2,18,33", type=str, panel=PLAN)
    )
    """Aux layer ids (boundary convention); their count sets the states stored (default
    three)."""
    batch_tokens: int | None = field(default=None, metadata=opt(metavar="N", panel=PLAN))
    """Training tokens per optimizer step: forecast the steps per epoch."""
    train_tokens_per_s: float | None = field(default=None, metadata=opt(metavar="N", panel=PLAN))
    """Training throughput: forecast the time per epoch."""
    extract_tokens_per_s: float | None = field(default=None, metadata=opt(metavar="N", panel=PLAN))
    """extract's throughput (the tokens_per_s it reports, summed over ranks): forecast its
    time."""
    seed: int = field(default=0, metadata=opt(panel=PLAN, bounds=SEED_BOUNDS))
    """Chooses the pilot prompts and the bootstrap draws."""
    replicates: int = field(default=REPLICATES, metadata=not_option())  # tests and benchmarks

    def __post_init__(self) -> None:
        self.pilot = parse_pilot(self.pilot)
        for flag, value in (
            ("--hidden-size", self.hidden_size),
            ("--batch-tokens", self.batch_tokens),
        ):
            if value is not None and value < 1:
                raise UserError(f"{flag} must be at least 1 (got {value})")
        for flag, rate in (
            ("--train-tokens-per-s", self.train_tokens_per_s),
            ("--extract-tokens-per-s", self.extract_tokens_per_s),
        ):
            if rate is not None and not rate > 0:
                raise UserError(f"{flag} must be > 0 (got {rate})")
        self.layers = parse_layer_ids(self.layers)
        if self.layers is not None:
            check_layer_ids(self.layers)
        if self.replicates < 20:
            raise UserError(f"replicates must be at least 20 (got {self.replicates})")


def parse_pilot(value: str | float | None) -> float | None:
    """'200' -> 200 prompts; '0.05' or '5%' -> that share of the run; None -> the default."""
    if value is None:
        return None
    text = str(value).strip()
    try:
        number = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        number = math.nan
    if not number > 0 or (number >= 1 and not number.is_integer()):
        raise UserError(
            f"--pilot {value}: give a number of prompts (200) or a share of the "
            "run between 0 and 1 (0.05, or 5%)"
        )
    return number

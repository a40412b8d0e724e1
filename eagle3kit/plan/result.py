"""What `eagle3kit plan` returns: `PlanResult`, its per-partition figures and each forecast
as an `Estimate` (a median and a range); `asdict` of it is the --json output."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

COVERAGE = 0.95
"""The share of bootstrap outcomes a stated range holds."""


@dataclass
class Estimate:
    value: float
    low: float
    high: float

    @classmethod
    def of(cls, outcomes: np.ndarray, shift: float = 0.0, margin: float = 0.0) -> Estimate:
        """The median and the middle COVERAGE of bootstrap outcomes, widened by margin."""
        tail = (1 - COVERAGE) / 2 * 100
        low, mid, high = np.percentile(outcomes, [tail, 50, 100 - tail])
        return cls(
            float(mid + shift),
            float(low * (1 - margin) + shift),
            float(high * (1 + margin) + shift),
        )

    def scaled(self, factor: float) -> Estimate:
        return Estimate(self.value * factor, self.low * factor, self.high * factor)


@dataclass
class PartitionFigures:
    name: str
    samples: int
    """Samples the run makes for this partition."""
    remaining: int
    pilot: int
    """Pilot samples measured."""
    mean_tokens: float
    p50_tokens: float
    p90_tokens: float
    p99_tokens: float
    max_tokens: int
    truncation: float
    """Share of the pilot's samples cut at the max tokens."""
    mean_latency_s: float
    prompt_share: float
    time_share: float
    """Share of the run's request time (slot-seconds) this partition takes."""


@dataclass
class PlanResult:
    output: str
    samples: int
    done: int
    """Samples already in the dataset (the pilot's and any earlier run's)."""
    remaining: int
    slots: int
    pilot_requests: int
    """Requests the pilot sent in this run (0 when it was already done)."""
    pilot_elapsed_s: float
    pilot_req_per_s: float | None
    pilot_tok_per_s: float | None
    pilot_simulated_s: float | None
    """The slot model replaying the pilot's own requests (the pilot took pilot_elapsed_s)."""
    startup_s: float
    """Loading, connecting, checks and the final commit: in every run, on top of the slots'."""
    truncation: float
    max_tokens: int
    partitions: list[PartitionFigures]
    wall_time_s: Estimate
    """The gen that follows: the samples not yet in the dataset."""
    full_wall_time_s: Estimate
    """The whole run from an empty dataset, pilot included."""
    completion_tokens: Estimate
    total_tokens: Estimate
    token_dataset_bytes: Estimate
    bytes_per_token: float
    hidden: dict[str, Any] = field(default_factory=dict)
    """hidden_size, n_aux, tokens, and bytes per codec (empty without a hidden size)."""
    train: dict[str, Any] = field(default_factory=dict)
    extract: dict[str, Any] = field(default_factory=dict)
    """tokens_per_s and time_s, with --extract-tokens-per-s."""
    notes: list[str] = field(default_factory=list)
    coverage: float = COVERAGE

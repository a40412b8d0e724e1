"""Acceptance figures from counts (EAGLE3.md §4), shared by `bench accept` and `bench server`.

Acceptance length τ = tokens per verification round = accepted drafts + 1 (the target's own
token), in [1, k+1] for a chain of k. Per position n (1-based): the unconditional rate p_n =
rounds that accepted at least n drafts / rounds (what vLLM reports), and the conditional rate
c_n = p_n / p_{n-1} (the paper's n-α). τ = 1 + Σ p_n.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from eagle3kit.model.acceptance import predicted_acceptance_length

LIKELY_MISCONFIGURED = 1.05
CONFIDENCE = 0.99
"""Of the intervals around sampled acceptance figures: a correct setup fails the parity gate
by chance once in a hundred runs."""
"""An acceptance length below this, with correct output, points at the setup (layer ids, an
EAGLE-3 head served as plain EAGLE, the wrong target), not at training (EAGLE3.md §4)."""


@dataclass
class Acceptance:
    """Counts over verification rounds, from which every acceptance figure follows."""

    k: int
    """Draft positions per round."""
    rounds: int = 0
    accepted: int = 0
    """Draft tokens accepted, over all rounds (the bonus token not included)."""
    at_least: list[int] = field(default_factory=list)
    """at_least[n-1]: rounds that accepted at least n drafts."""

    def __post_init__(self) -> None:
        if not self.at_least:
            self.at_least = [0] * self.k

    def add(self, accepted: int) -> None:
        self.rounds += 1
        self.accepted += accepted
        for n in range(min(accepted, self.k)):
            self.at_least[n] += 1

    def add_all(self, rounds: Iterable[int]) -> None:
        for accepted in rounds:
            self.add(accepted)

    def merge(self, other: Acceptance) -> None:
        self.rounds += other.rounds
        self.accepted += other.accepted
        self.at_least = [a + b for a, b in zip(self.at_least, other.at_least, strict=True)]

    @property
    def length(self) -> float | None:
        """τ: tokens per verification round; None without rounds."""
        return 1 + self.accepted / self.rounds if self.rounds else None

    @property
    def per_position(self) -> list[float | None]:
        """Unconditional acceptance rate of each draft position."""
        return [n / self.rounds if self.rounds else None for n in self.at_least]

    @property
    def conditional(self) -> list[float | None]:
        """Acceptance rate of each position given every earlier one was accepted."""
        before = [self.rounds, *self.at_least[:-1]]
        return [n / b if b else None for n, b in zip(self.at_least, before, strict=True)]


@dataclass(frozen=True)
class Interval:
    """A confidence interval around an acceptance length measured by sampling."""

    low: float
    high: float
    standard_error: float
    rounds: int
    """Verification rounds it rests on."""
    generations: int
    """Independent generations those rounds came from."""
    confidence: float = CONFIDENCE

    def to_dict(self) -> dict[str, float | int]:
        return {
            "low": self.low,
            "high": self.high,
            "standard_error": self.standard_error,
            "rounds": self.rounds,
            "generations": self.generations,
            "confidence": self.confidence,
        }


def z_score(confidence: float = CONFIDENCE) -> float:
    """The two-sided normal quantile: 2.576 at 0.99, 1.960 at 0.95."""
    from statistics import NormalDist

    return NormalDist().inv_cdf(0.5 + confidence / 2)


def length_interval(
    generations: Sequence[Sequence[int]], confidence: float = CONFIDENCE
) -> Interval | None:
    """The interval around τ = 1 + Σ accepted / Σ rounds over generations (each a list of
    accepted drafts per round); None without rounds.

    Rounds of one generation share its context, so they are not independent: the standard
    error is the larger of the per-round one and the one over generations (the ratio
    estimator's, by the delta method), which holds when rounds within a generation are
    correlated.
    """
    rounds = [r for g in generations for r in g]
    n = len(rounds)
    if n == 0:
        return None
    mean = sum(rounds) / n
    per_round = (sum((r - mean) ** 2 for r in rounds) / max(n - 1, 1)) / n
    kept = [g for g in generations if g]
    count = len(kept)
    by_generation = 0.0
    if count > 1:
        by_generation = (
            count / (count - 1) * sum((sum(g) - mean * len(g)) ** 2 for g in kept) / n**2
        )
    se = math.sqrt(max(per_round, by_generation))
    half = z_score(confidence) * se
    return Interval(1 + mean - half, 1 + mean + half, se, n, count, confidence)


def predicted_length(conditional: Sequence[float]) -> float:
    """τ from conditional per-position rates: 1 + c1 + c1·c2 + ... (EAGLE3.md §4)."""
    return predicted_acceptance_length(conditional)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear between closest ranks; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low, high = math.floor(pos), math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def likely_misconfigured(length: float | None) -> bool:
    return length is not None and length < LIKELY_MISCONFIGURED


def compare_sampled(
    engine: float | None,
    engine_rounds: int | None,
    offline: float | None,
    offline_interval: dict[str, Any] | None,
) -> tuple[dict[str, Any], bool, dict[str, Any] | None]:
    """(engine minus offline; whether the engine's acceptance length is inside the interval;
    that interval) at temperature > 0, where both figures are random.

    The engine sampled its own tokens, so the difference carries both sides' noise: the
    offline standard error, and the engine's taken to be the offline one scaled to the
    engine's rounds (the same drafter, prompts and rule give the same per-round spread).
    """
    if engine is None or offline is None or not offline_interval:
        overall = None if engine is None or offline is None else engine - offline
        return {"acceptance_length": overall, "per_position": []}, False, None
    overall = engine - offline
    se = offline_interval["standard_error"]
    rounds = offline_interval["rounds"]
    engine_se = se * math.sqrt(rounds / engine_rounds) if engine_rounds else se
    half = z_score(offline_interval["confidence"]) * math.sqrt(se**2 + engine_se**2)
    interval = {
        "low": offline - half,
        "high": offline + half,
        "half_width": half,
        "confidence": offline_interval["confidence"],
        "offline_rounds": rounds,
        "engine_rounds": engine_rounds,
    }
    return (
        {"acceptance_length": overall, "per_position": []},
        abs(overall) <= half + 1e-9,
        interval,
    )

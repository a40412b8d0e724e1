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
    by_generation = clustered_ratio_variance([(len(g), sum(g)) for g in kept])
    se = math.sqrt(max(per_round, by_generation))
    half = z_score(confidence) * se
    return Interval(1 + mean - half, 1 + mean + half, se, n, count, confidence)


def clustered_ratio_variance(clusters: Sequence[tuple[int, int]]) -> float:
    """The variance of the ratio Σ counted / Σ size over clusters of (size, counted) rounds
    (generations), by the delta method: it holds when rounds within a cluster are
    correlated. 0 with fewer than two non-empty clusters."""
    used = [(size, counted) for size, counted in clusters if size]
    total = sum(size for size, _ in used)
    if len(used) < 2:
        return 0.0
    ratio = sum(counted for _, counted in used) / total
    spread = sum((counted - ratio * size) ** 2 for size, counted in used)
    return len(used) / (len(used) - 1) * spread / total**2


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
    engine_per_position: Sequence[float | None] = (),
    offline_generations: Sequence[Sequence[int]] = (),
) -> tuple[dict[str, Any], bool, dict[str, Any] | None]:
    """(engine minus offline; whether the two agree; the interval) at temperature > 0, where
    both figures are random. They agree when the engine's acceptance length is inside the
    interval and no draft position's conditional acceptance differs beyond chance
    (`position_breaks`, listed under the interval's "positions").

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
    breaks = position_breaks(
        engine_per_position, engine_rounds, offline_generations, offline_interval["confidence"]
    )
    interval = {
        "low": offline - half,
        "high": offline + half,
        "half_width": half,
        "confidence": offline_interval["confidence"],
        "offline_rounds": rounds,
        "engine_rounds": engine_rounds,
        "positions": breaks,
    }
    return (
        {"acceptance_length": overall, "per_position": []},
        abs(overall) <= half + 1e-9 and not breaks,
        interval,
    )


def position_breaks(
    engine_per_position: Sequence[float | None],
    engine_rounds: int | None,
    generations: Sequence[Sequence[int]],
    confidence: float = CONFIDENCE,
) -> list[dict[str, Any]]:
    """The draft positions whose conditional acceptance (kept, of the rounds that kept every
    earlier draft) differs between the engine and bench accept beyond chance, each as
    position, engine, offline, half_width.

    The acceptance length sums the positions, so a fault that keeps the first draft as often
    as it should and never a second one can hide inside its interval: vLLM's CPU build at
    temperature 1 kept 0 of 32 second drafts where bench accept kept 22 of 32, at an
    acceptance length 1.230 against 1.423 ± 0.429. Each position is a two-proportion test
    (pooled), its variance widened by the offline rounds' clustering within generations,
    at `confidence` shared over the k positions (Bonferroni)."""
    k = len(engine_per_position)
    if not engine_rounds or not generations or k == 0:
        return []
    z = z_score(1 - (1 - confidence) / k)
    engine_at_least: list[float | None] = [1.0, *engine_per_position]
    breaks = []
    for position in range(1, k + 1):
        before, now = engine_at_least[position - 1], engine_at_least[position]
        if before is None or now is None:
            continue
        engine_reached = round(engine_rounds * before)
        engine_kept = round(engine_rounds * now)
        reached = [sum(1 for a in g if a >= position - 1) for g in generations]
        kept = [sum(1 for a in g if a >= position) for g in generations]
        offline_reached = sum(reached)
        if engine_reached == 0 or offline_reached == 0:
            continue
        offline_rate = sum(kept) / offline_reached
        engine_rate = engine_kept / engine_reached
        pooled = (sum(kept) + engine_kept) / (offline_reached + engine_reached)
        spread = pooled * (1 - pooled)
        if spread == 0:
            continue
        clustered = clustered_ratio_variance(list(zip(reached, kept, strict=True)))
        design = max(1.0, clustered / (spread / offline_reached))
        half = z * math.sqrt(spread * design * (1 / offline_reached + 1 / engine_reached))
        if abs(engine_rate - offline_rate) > half:
            breaks.append(
                {
                    "position": position,
                    "engine": engine_rate,
                    "offline": offline_rate,
                    "half_width": half,
                }
            )
    return breaks

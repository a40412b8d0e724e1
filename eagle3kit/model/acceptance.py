"""Acceptance length from per-position acceptance rates (EAGLE3.md §4)."""

from __future__ import annotations

from collections.abc import Iterable

VERIFY_RULES = ("onehot", "probabilistic", "sglang")
"""How an engine verifies drafts at temperature > 0 (eagle3kit.model.verification): --verify's
choices of bench accept and bench parity, train's --eval-verify. Here, away from torch, so
the configs can check them before anything heavy loads."""


def predicted_acceptance_length(conditional: Iterable[float]) -> float:
    """τ = 1 + Σ_j Π_{i≤j} a_i for conditional per-position rates a_i: the tokens a chain
    verification round yields (accepted drafts plus the target's own token)."""
    total, running = 1.0, 1.0
    for rate in conditional:
        running *= rate
        total += running
    return total

"""`bench accept`'s figures beside the acceptance itself: tokens per second and the speedup,
each category's figures, the sampled length's interval, what training predicted, and the
warnings a report earns against that prediction.
"""

from __future__ import annotations

from typing import Any, TypedDict

from eagle3kit.bench.result import AcceptReport, PromptResult
from eagle3kit.bench.stats import Acceptance, likely_misconfigured


class Speed(TypedDict):
    spec_tokens_per_s: float | None
    plain_tokens_per_s: float | None
    speedup: float | None


def speed_figures(results: list[PromptResult]) -> Speed:
    tokens = sum(r.tokens for r in results)
    spec = sum(r.spec_seconds for r in results)
    plain = sum(r.plain_seconds for r in results)
    spec_rate = tokens / spec if spec > 0 else None
    plain_rate = tokens / plain if plain > 0 else None
    return {
        "spec_tokens_per_s": spec_rate,
        "plain_tokens_per_s": plain_rate,
        "speedup": spec_rate / plain_rate if spec_rate and plain_rate else None,
    }


def category_figures(results: list[PromptResult], positions: int) -> dict[str, Any]:
    acc = Acceptance(positions)
    for r in results:
        acc.add_all(r.rounds)
    return {
        "prompts": len(results),
        "rounds": acc.rounds,
        "tokens": sum(r.tokens for r in results),
        "acceptance_length": acc.length,
        "per_position": acc.per_position,
        **speed_figures(results),
    }


def interval_figures(results: list[PromptResult]) -> dict[str, Any] | None:
    from eagle3kit.bench.stats import length_interval

    interval = length_interval([r.rounds for r in results])
    return None if interval is None else interval.to_dict()


def predicted_length(predicted: dict[str, Any] | None) -> float | None:
    value = (predicted or {}).get("predicted_acceptance_length")
    return float(value) if isinstance(value, int | float) else None


def report_warnings(report: AcceptReport, predicted: dict[str, Any] | None) -> list[str]:
    notes = []
    if likely_misconfigured(report.acceptance_length):
        notes.append(
            f"acceptance length {report.acceptance_length:.3f}: the drafter almost never "
            "agrees with the target; with a trained drafter this is a configuration error "
            "(wrong aux layer ids or convention, a drafter for another target, a d2t mapping "
            "that does not fit), not a training result"
        )
    if predicted:
        k, temp = predicted.get("k"), predicted.get("temperature")
        if report.shape.startswith("tree"):
            notes.append(
                "training predicted for a chain; a tree of the same depth usually accepts more"
            )
        elif k is not None and k != report.k:
            notes.append(
                f"training predicted for k={k}, this run drafts {report.k}: "
                "compare per-position rates, not the lengths"
            )
        if temp is not None and temp != report.temperature:
            notes.append(
                f"training predicted at temperature {temp}, this run uses {report.temperature:g}"
            )
        elif report.verify and predicted.get("verify") not in (None, report.verify):
            notes.append(
                f"training predicted for --verify {predicted['verify']}, this run "
                f"verifies as {report.verify}"
            )
        expected = predicted.get("per_position")
        first = report.per_position[0] if report.per_position else None
        if (
            isinstance(expected, list)
            and expected
            and isinstance(expected[0], int | float)
            and first is not None
            and first < 0.5 * expected[0]
        ):
            notes.append(
                f"position-1 acceptance {first:.2f} is far below training's "
                f"{expected[0]:.2f}: check the layer ids and the target"
            )
    return notes

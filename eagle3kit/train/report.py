"""The summary `eagle3kit train` prints at the end of a run (or a stopped one)."""

from __future__ import annotations

from eagle3kit import _ui
from eagle3kit.checkpoints.rundir import RunDir
from eagle3kit.model import VARIANTS, describe_variant
from eagle3kit.train.config import TrainConfig
from eagle3kit.train.result import TrainResult


def _cut_line(long: dict) -> str:
    """What the length limit left out, for the summary."""
    limit = f"limit {long['max_len']:,}" if long.get("max_len") else "no limit"
    share = long["tokens_cut"] / long["tokens"] if long.get("tokens") else 0.0
    return (
        f"{long['tokens_cut']:,} of {long.get('tokens', 0):,} ({100 * share:.2f}%; "
        f"{long['truncated']} samples truncated, {long['dropped']} dropped; {limit})"
    )


def report(result: TrainResult, cfg: TrainConfig) -> None:
    """The summary, on stderr (and the result as JSON on stdout with --json)."""
    opts = cfg.output
    if result.stopped:
        step = f"checkpoints/step-{result.steps:08d}"
        _ui.warn(
            f"train: stopped by {result.stopped} after step {result.steps:,} of "
            f"{result.total_steps:,}; {cfg.out / step} holds it. Continue with:\n  "
            + (result.resume_command or "the same train command (same run directory)")
        )
    if opts.json:
        _ui.print_json(result.to_dict())
    pairs: list[tuple[str, object]] = [
        ("run", str(result.out)),
        ("steps", result.steps),
        ("tokens", result.tokens),
        ("loss", None if result.loss is None else round(result.loss, 4)),
        ("vocab coverage", result.vocab_coverage),
    ]
    long = result.metrics.get("long_samples")
    if long:
        pairs.append(("tokens cut", _cut_line(long)))
    for name, ev in (("before training", result.initial_eval), ("held-out", result.eval)):
        if ev:
            rates = " ".join(f"{a:.3f}" for a in ev["per_position"])
            sampled = (
                f", temperature {ev['temperature']:g}, verify {ev.get('verify')}, "
                f"prediction {ev.get('prediction', 'expected')}"
                if ev.get("temperature")
                else ""
            )
            pairs.append(
                (
                    f"{name} AL (k={ev['k']}{sampled})",
                    f"{ev['predicted_acceptance_length']:.3f}  per position {rates}",
                )
            )
    if result.eval and result.eval.get("phases"):
        pairs.append(
            (
                "held-out AL per phase",
                "  ".join(
                    f"{name} {f['predicted_acceptance_length']:.3f} ({f['chains']} chains)"
                    for name, f in result.eval["phases"].items()
                ),
            )
        )
    if result.eval and result.eval.get("depths"):
        pairs.append(
            (
                "held-out AL per context depth",
                "  ".join(
                    f"{name} {f['predicted_acceptance_length']:.3f} ({f['chains']} chains)"
                    for name, f in result.eval["depths"].items()
                ),
            )
        )
    variant = result.metrics.get("variant")
    if variant and variant != VARIANTS["eagle3"]:
        pairs.append(
            (
                "layout",
                describe_variant(variant)
                + (", norm_before_residual" if variant["norm_before_residual"] else ""),
            )
        )
    drafter = str(RunDir(result.out).drafter)
    if result.selection:
        drafter += f"  step {result.selection['step']:,}: {result.selection['why']}"
    pairs.append(("drafter", drafter))
    _ui.kv("train", pairs, opts)

"""What bench accept and bench server show: JSON on stdout, tables on stderr, and an optional
figure (plots.py draws it; bench parity's tables are parity_report.py's).

Every figure is printed with the drafting shape and temperature beside it: acceptance lengths
of different shapes or temperatures are not comparable (EAGLE3.md §4).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from eagle3kit import _ui
from eagle3kit.bench.plots import acceptance_figure
from eagle3kit.bench.result import AcceptReport, ServerReport


def sampling_label(run: Any) -> str:
    """'temperature 0', or the temperature with the verification rule and the filters that
    apply (of a bench accept config or report)."""
    if run.temperature == 0:
        return "temperature 0"
    parts = [f"temperature {run.temperature:g}", f"verify {run.verify}"]
    if run.top_k > 0:
        parts.append(f"top-k {run.top_k}")
    if run.top_p < 1:
        parts.append(f"top-p {run.top_p:g}")
    return ", ".join(parts)


def number_text(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _rate(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


# bench accept -------------------------------------------------------------------------------
def _trained_phase(report: AcceptReport, phase: str) -> float | None:
    """Training's held-out prediction for `phase` (its eval block's `phases`), if any."""
    phases = (report.predicted or {}).get("phases") or {}
    return _rate((phases.get(phase) or {}).get("predicted_acceptance_length"))


def _trained_depth(report: AcceptReport, bucket: str) -> float | None:
    """Training's held-out prediction for depth `bucket` (its eval block's `depths`), if
    training bucketed by the same edges."""
    depths = (report.predicted or {}).get("depths") or {}
    return _rate((depths.get(bucket) or {}).get("predicted_acceptance_length"))


def depth_table(
    title: str,
    depths: dict[str, dict],
    k: int,
    opts: _ui.OutputOptions,
    trained: Callable[[str], float | None] | None = None,
) -> None:
    """Acceptance per context-depth bucket (eagle3kit.model.depth), one row a bucket."""
    if not depths:
        return
    _ui.table(
        title,
        [
            "context depth",
            "rounds",
            "acceptance length",
            *(f"accepted {i + 1}" for i in range(k)),
            *(["predicted by training"] if trained else []),
        ],
        [
            [
                name,
                f["rounds"],
                _rate(f["acceptance_length"]),
                *(_rate(r) for r in f["per_position"][:k]),
                *([trained(name)] if trained else []),
            ]
            for name, f in depths.items()
        ],
        opts,
    )


def show_accept(report: AcceptReport, opts: _ui.OutputOptions, plot: Path | None) -> None:
    if opts.json:
        _ui.print_json(report.to_dict())
    _ui.kv(f"bench accept: {report.shape}, {sampling_label(report)}", _accept_summary(report), opts)
    _ui.table(
        "acceptance per draft position",
        ["position", "accepted", "conditional", "training (conditional)"],
        _position_rows(report),
        opts,
    )
    _ui.table(
        f"per category ({report.shape}, temperature {report.temperature:g})",
        ["category", "prompts", "rounds", "acceptance length", "tok/s", "plain tok/s", "speedup"],
        [
            [
                name,
                c["prompts"],
                c["rounds"],
                _rate(c["acceptance_length"]),
                _rate(c["spec_tokens_per_s"]),
                _rate(c["plain_tokens_per_s"]),
                _rate(c["speedup"]),
            ]
            for name, c in report.categories.items()
        ],
        opts,
    )
    if report.phases:
        _ui.table(
            f"per reasoning phase ({report.shape}, temperature {report.temperature:g})",
            [
                "phase",
                "rounds",
                "acceptance length",
                *(f"accepted {i + 1}" for i in range(report.k)),
                "predicted by training",
            ],
            [
                [
                    name,
                    f["rounds"],
                    _rate(f["acceptance_length"]),
                    *(_rate(r) for r in f["per_position"]),
                    _trained_phase(report, name),
                ]
                for name, f in report.phases.items()
            ],
            opts,
        )
    depth_table(
        f"per context depth in tokens ({report.shape}, temperature {report.temperature:g})",
        report.depths,
        report.k,
        opts,
        lambda name: _trained_depth(report, name),
    )
    parted = [p for p in report.prompts if p.status in ("near-tie", "mismatch")]
    if parted:
        _ui.table(
            f"outputs that part from the target's own (tie epsilon {report.tie_epsilon:g})",
            ["prompt", "turn", "token", "logit gap", "verdict"],
            [[p.prompt, p.turn, p.diverged_at, p.margin, p.status] for p in parted],
            opts,
        )
    for note in report.warnings:
        _ui.warn(note)
    if report.lossless is False:
        _ui.error(
            f"{report.mismatches} output(s) differ from the target's own greedy decoding "
            f"where its logits were not nearly tied (gap > {report.tie_epsilon:g}): "
            "speculative decoding is not lossless here"
        )
    if plot is not None:
        plot_accept(report, Path(plot))
        _ui.info(f"figure: {plot}", opts)


def _accept_summary(report: AcceptReport) -> list[tuple[str, object]]:
    predicted = report.predicted or {}
    pred = report.predicted_acceptance_length
    pred_text = (
        "–"
        if pred is None
        else f"{pred:.3f} (k={predicted.get('k', '?')}, "
        f"temperature {predicted.get('temperature', '?')})"
    )
    if report.lossless is None:
        lossless = "not checked (temperature > 0: rejection sampling keeps the distribution)"
    else:
        lossless = (
            f"{'yes' if report.lossless else 'NO'}: {report.mismatches} mismatches, "
            f"{report.near_ties} near-ties (gap <= {report.tie_epsilon:g})"
        )
    return [
        ("target", report.target),
        ("drafter", report.drafter),
        ("device", f"{report.device} {report.dtype}"),
        (
            "generations",
            f"{len(report.prompts)} ({report.rounds} rounds, {report.tokens} tokens, "
            f"at most {report.max_new_tokens} new each)",
        ),
        (
            "acceptance length",
            f"{number_text(report.acceptance_length)} tokens per verification round"
            f"{_interval_text(report.interval)}",
        ),
        ("predicted by training", pred_text),
        ("lossless", lossless),
        (
            "tokens/s",
            f"{number_text(report.spec_tokens_per_s, 1)} speculative, "
            f"{number_text(report.plain_tokens_per_s, 1)} plain: "
            f"{number_text(report.speedup, 2)}x",
        ),
    ]


def _interval_text(interval: dict[str, Any] | None) -> str:
    """', 99% interval 1.912-2.031 (812 rounds in 24 generations)' (sampled runs)."""
    if not interval:
        return ""
    return (
        f", {interval['confidence']:.0%} interval {interval['low']:.3f}-"
        f"{interval['high']:.3f} ({interval['rounds']} rounds in "
        f"{interval['generations']} generations)"
    )


def _position_rows(report: AcceptReport) -> list[list[object]]:
    predicted = (report.predicted or {}).get("per_position")
    rows: list[list[object]] = []
    for n, (p, c) in enumerate(
        zip(report.per_position, report.per_position_conditional, strict=True)
    ):
        guess = predicted[n] if isinstance(predicted, list) and n < len(predicted) else None
        rows.append([n + 1, _rate(p), _rate(c), guess if isinstance(guess, int | float) else None])
    return rows


# bench server -------------------------------------------------------------------------------
def show_server(report: ServerReport, opts: _ui.OutputOptions, plot: Path | None) -> None:
    if opts.json:
        _ui.print_json(report.to_dict())
    title = f"bench server: {report.shape}, temperature {report.temperature:g}"
    pairs: list[tuple[str, object]] = [
        ("server", f"{report.server} ({report.api} {report.version or ''})".rstrip()),
        ("source of the figures", report.source),
        ("requests", f"{report.requests} ({report.errors} failed)"),
        (
            "acceptance length",
            f"{number_text(report.acceptance_length)} tokens per verification round",
        ),
    ]
    if report.acceptance_length_without_prefill is not None:
        pairs.append(
            ("without prefill tokens", number_text(report.acceptance_length_without_prefill))
        )
    if report.draft_acceptance_rate is not None:
        pairs.append(("draft acceptance rate", number_text(report.draft_acceptance_rate)))
    for name, run in (("speculative", report.run), ("baseline", report.baseline)):
        if run is not None:
            pairs.append(
                (
                    f"{name} throughput",
                    f"{number_text(run['tokens_per_s'], 1)} tok/s, latency p50 "
                    f"{number_text(run['latency_p50'], 3)} s, "
                    f"p90 {number_text(run['latency_p90'], 3)} s, "
                    f"p99 {number_text(run['latency_p99'], 3)} s",
                )
            )
    if report.speedup is not None:
        pairs.append(
            (
                "speedup",
                f"{report.speedup:.2f}x throughput, "
                f"{number_text(report.latency_speedup, 2)}x median latency",
            )
        )
    _ui.kv(title, pairs, opts)
    if report.per_position:
        _ui.table(
            "acceptance per draft position",
            ["position", "accepted", "conditional"],
            [
                [n + 1, _rate(p), _rate(c)]
                for n, (p, c) in enumerate(
                    zip(report.per_position, report.per_position_conditional, strict=True)
                )
            ],
            opts,
        )
    if report.categories:
        _ui.table(
            f"per category ({report.shape}, temperature {report.temperature:g})",
            ["category", "requests", "acceptance length"],
            [
                [name, c["requests"], _rate(c["acceptance_length"])]
                for name, c in report.categories.items()
            ],
            opts,
        )
    depth_table(
        f"per context depth in tokens ({report.shape}, temperature "
        f"{report.temperature:g}, the engine's rounds)",
        report.depths,
        report.k or 0,
        opts,
    )
    for note in report.warnings:
        _ui.warn(note)
    if plot is not None:
        plot_server(report, Path(plot))
        _ui.info(f"figure: {plot}", opts)


def plot_accept(report: AcceptReport, path: Path) -> None:
    acceptance_figure(
        f"{Path(report.drafter).name}: {report.shape}, temperature {report.temperature:g}, "
        f"acceptance length {number_text(report.acceptance_length)}",
        report.per_position,
        report.per_position_conditional,
        {name: c["acceptance_length"] for name, c in report.categories.items()},
        path,
        report.depths,
    )


def plot_server(report: ServerReport, path: Path) -> None:
    acceptance_figure(
        f"{report.server}: {report.shape}, temperature {report.temperature:g}, "
        f"acceptance length {number_text(report.acceptance_length)}",
        report.per_position,
        report.per_position_conditional,
        {name: c["acceptance_length"] for name, c in report.categories.items()},
        path,
        report.depths,
    )

"""What bench shows: JSON on stdout, tables on stderr, and an optional figure.

Every figure is printed with the drafting shape and temperature beside it: acceptance lengths
of different shapes or temperatures are not comparable (EAGLE3.md §4).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import eagle3kit.bench.diagnose as diagnose
from eagle3kit import _ui
from eagle3kit._plot import pyplot
from eagle3kit.bench.result import AcceptReport, ParityReport, ServerReport
from eagle3kit.bench.stats import likely_misconfigured


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


def _num(value: float | None, digits: int = 3) -> str:
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
            f"{_num(report.acceptance_length)} tokens per verification round"
            f"{_interval_text(report.interval)}",
        ),
        ("predicted by training", pred_text),
        ("lossless", lossless),
        (
            "tokens/s",
            f"{_num(report.spec_tokens_per_s, 1)} speculative, "
            f"{_num(report.plain_tokens_per_s, 1)} plain: "
            f"{_num(report.speedup, 2)}x",
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
        ("acceptance length", f"{_num(report.acceptance_length)} tokens per verification round"),
    ]
    if report.acceptance_length_without_prefill is not None:
        pairs.append(("without prefill tokens", _num(report.acceptance_length_without_prefill)))
    if report.draft_acceptance_rate is not None:
        pairs.append(("draft acceptance rate", _num(report.draft_acceptance_rate)))
    for name, run in (("speculative", report.run), ("baseline", report.baseline)):
        if run is not None:
            pairs.append(
                (
                    f"{name} throughput",
                    f"{_num(run['tokens_per_s'], 1)} tok/s, latency p50 "
                    f"{_num(run['latency_p50'], 3)} s, p90 {_num(run['latency_p90'], 3)} s,"
                    f" p99 {_num(run['latency_p99'], 3)} s",
                )
            )
    if report.speedup is not None:
        pairs.append(
            (
                "speedup",
                f"{report.speedup:.2f}x throughput, "
                f"{_num(report.latency_speedup, 2)}x median latency",
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


# bench parity -------------------------------------------------------------------------------
def _signed(value: float | None) -> str:
    return "–" if value is None else f"{value:+.3f}"


def show_parity(report: ParityReport, opts: _ui.OutputOptions) -> None:
    if opts.json:
        _ui.print_json(report.to_dict())
    verdict = "passed" if report.passed else "FAILED"
    engine, offline = report.engine, report.offline
    within = (
        f"tolerance {report.tolerance:g}"
        if report.interval is None
        else f"{report.interval['confidence']:.0%} interval"
    )
    _ui.kv(
        f"bench parity: {report.shape}, {sampling_label(report)}, {within}: {verdict}",
        [
            ("server", f"{report.server} ({report.api} {report.version or '?'})"),
            ("drafter", report.drafter),
            ("target", report.target),
            ("served", _served_line(report.served)),
            ("engine", f"{_num(engine['acceptance_length'])} ({engine['source']})"),
            (
                "bench accept",
                f"{_num(offline['acceptance_length'])} (lossless: {offline['lossless']})",
            ),
            (
                "difference",
                _signed(report.differences["acceptance_length"]) + _interval_note(report.interval),
            ),
        ],
        opts,
    )
    rows = [
        [
            "acceptance length",
            _num(engine["acceptance_length"]),
            _num(offline["acceptance_length"]),
            _signed(report.differences["acceptance_length"]),
        ]
    ]
    for i, off in enumerate(offline["per_position"]):
        eng = engine["per_position"][i] if i < len(engine["per_position"]) else None
        diff = (
            report.differences["per_position"][i]
            if i < len(report.differences["per_position"])
            else None
        )
        rows.append([f"accepted {i + 1}", _num(eng), _num(off), _signed(diff)])
    _ui.table(
        "engine and bench accept, side by side",
        ["figure", "engine", "bench accept", "engine - bench"],
        rows,
        opts,
    )
    if report.phases:
        _ui.table(
            "bench accept per reasoning phase",
            [
                "phase",
                "rounds",
                "acceptance length",
                *(f"accepted {i + 1}" for i in range(report.k)),
            ],
            [
                [
                    name,
                    f["rounds"],
                    round(f["acceptance_length"], 3),
                    *(round(r, 3) for r in f["per_position"]),
                ]
                for name, f in report.phases.items()
            ],
            opts,
        )
    if report.depths:
        _ui.table(
            "per context depth in tokens: engine and bench accept",
            [
                "context depth",
                "engine rounds",
                "engine",
                "bench rounds",
                "bench accept",
                "engine - bench",
            ],
            [
                [
                    name,
                    *_depth_cells(d["engine"]),
                    *_depth_cells(d["offline"]),
                    _signed(d["difference"]),
                ]
                for name, d in report.depths.items()
            ],
            opts,
        )
    for note in report.warnings:
        _ui.warn(note)
    for f in report.findings:
        _ui.warn(f"{diagnose.CAUSES[f['cause']]} [{f['cause']}]: {f['message']}")
    if not report.passed:
        near_one = likely_misconfigured(engine["acceptance_length"])
        interval = report.interval
        if interval is not None:
            apart = (
                f"by more than {interval['half_width']:.3f} (the "
                f"{interval['confidence']:.0%} interval of the sampled figures)"
            )
        elif report.temperature > 0:
            apart = "(bench accept measured no rounds to build an interval on)"
        else:
            apart = f"by more than {report.tolerance:g}"
        why = [
            text
            for failed, text in (
                (not report.agree, f"the engine and bench accept differ {apart}"),
                (near_one, "the engine accepts almost nothing"),
                (
                    any(
                        f["cause"] not in ("unexplained", "engine-sampling")
                        for f in report.findings
                    ),
                    "what is served differs from the run",
                ),
                (
                    any(f["cause"] == "engine-sampling" for f in report.findings),
                    "the engine's sampling at temperature > 0 is at fault",
                ),
            )
            if failed
        ]
        _ui.error(f"bench parity failed: {'; '.join(why)} (the causes found are above)")


def _depth_cells(side: dict[str, Any] | None) -> list[object]:
    return ["–", "–"] if side is None else [side["rounds"], _num(side["acceptance_length"])]


def _interval_note(interval: dict[str, Any] | None) -> str:
    """' (within ±0.084: 99% interval, 812 + 790 rounds)' at temperature > 0."""
    if not interval:
        return ""
    return (
        f" (within ±{interval['half_width']:.3f} passes: {interval['confidence']:.0%} "
        f"interval over {interval['offline_rounds']} offline and "
        f"{interval['engine_rounds'] or '?'} engine rounds)"
    )


def _served_line(served: dict[str, Any]) -> str:
    if not served.get("source"):
        return "speculative settings not exposed by the server"
    drafter = served.get("drafter") or "a drafter it does not name"
    return f"{served.get('method')} with {drafter}, k={served.get('k')} ({served['source']})"


# Figures ------------------------------------------------------------------------------------
def _figure(
    title: str,
    positions: list[float | None],
    conditional: list[float | None],
    categories: dict[str, float | None],
    path: Path,
    depths: dict[str, dict[str, Any]] | None = None,
) -> None:
    """Per position and per category; with `depths`, a third panel: acceptance length
    against context depth, one point a bucket."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3 if depths else 2, figsize=(16 if depths else 11, 4))
    left, right = axes[0], axes[1]
    xs = list(range(1, len(positions) + 1))
    left.bar([x - 0.2 for x in xs], [p or 0 for p in positions], 0.4, label="accepted")
    left.bar(
        [x + 0.2 for x in xs],
        [c or 0 for c in conditional],
        0.4,
        label="given all earlier accepted",
    )
    left.set(
        xlabel="draft position",
        ylabel="acceptance rate",
        ylim=(0, 1),
        xticks=xs,
        title="per position",
    )
    left.legend(fontsize="small")
    names = list(categories)
    right.barh(names, [categories[n] or 0 for n in names])
    right.set(xlabel="acceptance length (tokens per round)", title="per category")
    if depths:
        _depth_panel(axes[2], depths)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _depth_panel(ax: Any, depths: dict[str, dict[str, Any]]) -> None:
    names = list(depths)
    xs = list(range(len(names)))
    ax.plot(xs, [depths[n]["acceptance_length"] for n in names], marker="o")
    for x, name in zip(xs, names, strict=True):
        ax.annotate(
            f"{depths[name]['rounds']} rounds",
            (x, depths[name]["acceptance_length"]),
            textcoords="offset points",
            xytext=(0, 6),
            ha="center",
            fontsize="small",
        )
    ax.set(
        xlabel="context depth (tokens)",
        ylabel="acceptance length (tokens per round)",
        xticks=xs,
        xticklabels=names,
        title="against context depth",
    )
    ax.margins(x=0.1, y=0.15)  # room for the round counts above the points


def plot_accept(report: AcceptReport, path: Path) -> None:
    _figure(
        f"{Path(report.drafter).name}: {report.shape}, temperature {report.temperature:g}, "
        f"acceptance length {_num(report.acceptance_length)}",
        report.per_position,
        report.per_position_conditional,
        {name: c["acceptance_length"] for name, c in report.categories.items()},
        path,
        report.depths,
    )


def plot_server(report: ServerReport, path: Path) -> None:
    _figure(
        f"{report.server}: {report.shape}, temperature {report.temperature:g}, "
        f"acceptance length {_num(report.acceptance_length)}",
        report.per_position,
        report.per_position_conditional,
        {name: c["acceptance_length"] for name, c in report.categories.items()},
        path,
        report.depths,
    )

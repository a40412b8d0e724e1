"""What `bench parity` shows: the engine's acceptance beside the offline decoding's, per
position, per depth and per phase, what was served, and the verdict with its diagnosis.
"""

from __future__ import annotations

from typing import Any

import eagle3kit.bench.diagnose as diagnose
from eagle3kit import _ui
from eagle3kit.bench.report import number_text, sampling_label
from eagle3kit.bench.result import ParityReport
from eagle3kit.bench.stats import likely_misconfigured


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
            ("engine", f"{number_text(engine['acceptance_length'])} ({engine['source']})"),
            (
                "bench accept",
                f"{number_text(offline['acceptance_length'])} (lossless: {offline['lossless']})",
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
            number_text(engine["acceptance_length"]),
            number_text(offline["acceptance_length"]),
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
        rows.append([f"accepted {i + 1}", number_text(eng), number_text(off), _signed(diff)])
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
        if interval is not None and interval.get("positions"):
            apart = "at draft position " + "; ".join(
                f"{b['position']} (the engine kept {b['engine']:.3f} of the rounds that "
                f"reached it, bench accept {b['offline']:.3f}, ±{b['half_width']:.3f} passes)"
                for b in interval["positions"]
            )
        elif interval is not None:
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
    return ["–", "–"] if side is None else [side["rounds"], number_text(side["acceptance_length"])]


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

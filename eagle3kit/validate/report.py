"""validate's report: the rows of every check, the partitions table, and how they are shown
(a numbered ✓/✗ checklist on stderr, or JSON on stdout)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from eagle3kit import _ui
from eagle3kit.validate.checks import CheckResult
from eagle3kit.validate.figures import DatasetFigures


@dataclass
class ValidateReport:
    path: str
    samples: int
    tokens: int
    profile: dict[str, Any]
    checks: list[CheckResult]
    partitions: dict[str, dict]
    warnings: list[str] = field(default_factory=list)
    clean: dict | None = None
    damaged: bool = False
    """Shards could not be read (the integrity row names them): the input is unusable."""

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def exit_code(self) -> int:
        return 2 if self.damaged else 0 if self.passed else 1

    def check(self, name: str) -> CheckResult:
        return next(c for c in self.checks if c.name == name)

    def summary(self) -> str:
        failed = [c.name for c in self.checks if c.status == "fail"]
        skipped = sum(c.status == "skip" for c in self.checks)
        ran = len(self.checks) - skipped
        if self.damaged:
            return "damaged shards: the other checks need them (skipped)"
        if failed:
            return f"{len(failed)} of {ran} checks failed: {', '.join(failed)}"
        return f"all {ran} checks passed" + (f" ({skipped} skipped)" if skipped else "")

    def to_dict(self) -> dict:
        return {
            "path": self.path,
            "passed": self.passed,
            "summary": self.summary(),
            "samples": self.samples,
            "tokens": self.tokens,
            "profile": self.profile,
            "checks": [c.to_dict() for c in self.checks],
            "partitions": self.partitions,
            "warnings": self.warnings,
            "clean": self.clean,
            "damaged": self.damaged,
        }


def partitions(f: DatasetFigures) -> dict[str, dict]:
    out = {}
    lengths = f.prompt_len + f.comp_len
    for i, name in sorted(enumerate(f.partition_names), key=lambda kv: kv[1]):
        m = f.partition == i
        fin = m & (f.finish <= 1)
        lens = lengths[m]
        out[name] = {
            "samples": int(m.sum()),
            "tokens": int(lens.sum()),
            "loss_tokens": int(f.loss[m].sum()),
            "truncated": round(float((f.finish[m] == 1).sum() / max(fin.sum(), 1)), 4),
            "reasoning": (
                round(float((f.reasoning[fin] > 0).mean()), 4)
                if f.reasoning is not None and fin.any()
                else None
            ),
            "length_p50": int(np.percentile(lens, 50)) if len(lens) else 0,
            "length_p90": int(np.percentile(lens, 90)) if len(lens) else 0,
            "length_max": int(lens.max()) if len(lens) else 0,
            "histogram": _histogram(lens),
        }
    return out


def _histogram(lengths: np.ndarray) -> dict[str, int]:
    """Sample counts per power-of-two length bucket ("<=256", "<=512", ...)."""
    if not len(lengths):
        return {}
    edges = 2 ** np.arange(5, max(6, int(np.ceil(np.log2(max(lengths.max(), 2)))) + 1))
    counts = np.bincount(np.searchsorted(edges, lengths), minlength=len(edges))[: len(edges)]
    return {f"<={e}": int(c) for e, c in zip(edges, counts, strict=True)}


def _sparkline(hist: dict[str, int]) -> str:
    bars = " ▁▂▃▄▅▆▇█"
    top = max(hist.values(), default=0)
    if not top:
        return ""
    return "".join(bars[int(np.ceil(8 * v / top))] for v in hist.values())


def show(report: ValidateReport, opts: _ui.OutputOptions) -> None:
    prof = report.profile
    _ui.kv(
        f"{report.path}: {report.samples:,} samples, {report.tokens:,} tokens",
        [
            (k, repr(v) if k == "generation_prompt" else v)
            for k, v in prof.items()
            if v is not None and k != "stop_token_ids"
        ]
        + [("stop token ids", ", ".join(map(str, prof.get("stop_token_ids") or [])))],
        opts,
    )
    rows = []
    for name, p in report.partitions.items():
        hist = p["histogram"]
        span = f" {next(iter(hist))}..{list(hist)[-1]}" if hist else ""
        rows.append(
            [
                name,
                p["samples"],
                p["tokens"],
                p["loss_tokens"],
                f"{p['truncated']:.1%}",
                f"{p['reasoning']:.1%}" if p["reasoning"] is not None else None,
                p["length_p50"],
                p["length_p90"],
                p["length_max"],
                _sparkline(hist) + span,
            ]
        )
    _ui.table(
        "partitions",
        [
            "partition",
            "samples",
            "tokens",
            "loss tokens",
            "truncated",
            "reasoning",
            "p50",
            "p90",
            "max",
            "lengths (x2 buckets)",
        ],
        rows,
        opts,
    )
    items = []
    for c in report.checks:
        detail = c.detail
        if c.status != "skip":
            detail = f"{c.failing:,}/{c.total:,} flagged  {detail}"
            if c.reasons:
                detail += "  [" + ", ".join(f"{k} {v:,}" for k, v in c.reasons.items()) + "]"
            if c.examples and c.failing:
                detail += f"  e.g. {', '.join(c.examples[:3])}"
        items.append(({"pass": True, "fail": False}.get(c.status), c.title, detail))
    for w in report.warnings:
        _ui.warn(w)
    _ui.checklist(items, opts)
    _ui.info(report.summary(), opts)
    if report.clean:
        _ui.info(
            f"clean copy: {report.clean['kept']:,} samples written to "
            f"{report.clean['path']} ({report.clean['removed']:,} left out)",
            opts,
        )

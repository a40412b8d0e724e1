"""What a quickstart reports: the predicted and measured acceptance lengths, the dataset's
figures, where everything is and the command line of each stage, shown as one table."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from eagle3kit import _ui
from eagle3kit._options import OutputOptions
from eagle3kit.quickstart.config import K


@dataclass
class QuickstartResult:
    predicted_acceptance_length: float | None
    """Training's held-out forecast, chain k=3 at temperature 0."""
    measured_acceptance_length: float | None
    """bench accept's measurement with the exported vLLM checkpoint, k=3, temperature 0."""
    samples: int
    truncation_rate: float
    tokens: int
    """Tokens in the token dataset, prompts and completions."""
    completion_tokens: int
    final_loss: float | None
    validate_passed: bool
    validate_summary: str
    lossless: bool | None
    skipped: list[str]
    """Stages an earlier run had finished."""
    continued: dict[str, int]
    """Stages that continued what a killed run committed: samples (gen) or steps (train)."""
    seconds: dict[str, float]
    """Wall time of each stage (as first run) and in total for this invocation."""
    paths: dict[str, str]
    commands: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _fmt(value: float | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


PATH_LABELS = {
    "dir": "directory",
    "target": "target model",
    "prompts": "prompts (gen)",
    "bench_prompts": "prompts (bench)",
    "tokens": "token dataset",
    "validate_report": "validate report",
    "hidden": "hidden states",
    "run": "train run",
    "drafter": "drafter (eagle3kit)",
    "vllm": "drafter (vLLM)",
    "sglang": "drafter (SGLang)",
    "state": "quickstart record",
}


def show(r: QuickstartResult, opts: OutputOptions) -> None:
    measured = _fmt(r.measured_acceptance_length, ".2f")
    if r.lossless is not None:
        measured += "  (lossless)" if r.lossless else "  (NOT lossless: see bench above)"
    stages = sum(v for k, v in r.seconds.items() if k != "this run")
    spent = f"{stages:.0f} s"
    if r.skipped:
        spent += f"; this run {r.seconds['this run']:.0f} s ({', '.join(r.skipped)} done earlier)"
    if r.continued:
        spent += "; continued " + ", ".join(f"{k} from {v:,}" for k, v in r.continued.items())
    rows: list[Sequence[object]] = [
        ["predicted acceptance length", _fmt(r.predicted_acceptance_length, ".2f")],
        ["measured acceptance length", measured],
        ["samples", f"{r.samples:,}"],
        ["truncation rate", f"{r.truncation_rate:.1%}"],
        ["tokens", f"{r.tokens:,} ({r.completion_tokens:,} in completions)"],
        ["final training loss", _fmt(r.final_loss, ".3f")],
        ["validate", r.validate_summary],
        ["time", spent],
        *([PATH_LABELS.get(k, k), v] for k, v in r.paths.items()),
        *([f"by hand: {k}", v] for k, v in r.commands.items()),
    ]
    title = f"quickstart (acceptance lengths: chain k = {K}, temperature 0)"
    _ui.table(title, ["what", "value"], rows, opts, fold=True)

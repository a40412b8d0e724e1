"""Where each quickstart stage writes, under the quickstart directory, and the record that
lets a rerun continue."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from eagle3kit.checkpoints.rundir import RunDir

STATE = "quickstart.json"


@dataclass(frozen=True)
class Layout:
    """Where each stage writes, under the quickstart directory."""

    root: Path

    @property
    def target(self) -> Path:
        return self.root / "target"

    @property
    def train_prompts(self) -> Path:
        return self.root / "prompts" / "docstrings.jsonl"

    @property
    def bench_prompts(self) -> Path:
        return self.root / "prompts" / "heldout.jsonl"

    @property
    def tokens(self) -> Path:
        return self.root / "tokens"

    @property
    def hidden(self) -> Path:
        return self.root / "hidden"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def export(self) -> Path:
        return self.root / "export"

    def paths(self) -> dict[str, str]:
        return {
            "dir": str(self.root),
            "target": str(self.target),
            "prompts": str(self.train_prompts),
            "bench_prompts": str(self.bench_prompts),
            "tokens": str(self.tokens),
            "validate_report": str(self.root / "validate.json"),
            "hidden": str(self.hidden),
            "run": str(self.run),
            "drafter": str(RunDir(self.run).drafter),
            "vllm": str(self.export / "vllm"),
            "sglang": str(self.export / "sglang"),
            "state": str(self.root / STATE),
        }

"""What a training run returns: where it is, how far it got, its loss and held-out figures,
and how a stopped run continues."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class TrainResult:
    out: Path
    steps: int
    """Optimizer steps done in total (earlier runs included)."""
    total_steps: int
    tokens: int
    """Training tokens seen in total."""
    loss: float | None
    eval: dict | None
    """The last held-out evaluation (EvalResult.to_dict()), None without a held-out split."""
    initial_eval: dict | None
    """The evaluation of the drafter before training (None when resumed or no split)."""
    vocab_coverage: float | None
    resumed_from: int | None = None
    selection: dict | None = None
    """Which step RUN/drafter/ holds and why (run.json's `selection`, docs/train.md)."""
    metrics: dict = field(default_factory=dict)
    stopped: str | None = None
    """The signal that stopped the run before its last step (SIGTERM, SIGINT, SIGUSR1)."""
    exit_code: int = 0
    """0, or 143 / 130 when a signal stopped the run."""
    resume_command: str | None = None
    """The command that continues a stopped run."""
    patience_spent: bool = False
    """--patience ended training before its last step (a finished run, not a stopped one)."""

    def to_dict(self) -> dict:
        d = asdict(self)
        d["out"] = str(self.out)
        return d

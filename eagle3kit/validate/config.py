"""validate's settings: one dataclass that checks itself and names the flag in its errors."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from eagle3kit import _ui
from eagle3kit._options import arg, opt
from eagle3kit.errors import UserError

CHECKS = (
    "integrity",
    "structure",
    "literal_markers",
    "truncation",
    "reasoning",
    "degenerate",
    "round_trip",
    "coverage",
    "reconstructed",
    "vocabulary",
    "invariants",
)
"""Every check, in the order of the report: the names `--only` and `--skip` take (checks.py
registers one function under each, and refuses to load if the two lists part)."""


@dataclass
class ValidateConfig:
    path: Path = field(metadata=arg())
    """A token dataset directory."""
    tokenizer: Path | None = None
    """Tokenizer directory overriding the one stored in the dataset (DIR/tokenizer)."""
    chat_template: Path | None = None
    """Chat template file overriding the stored one."""
    think_start: str | None = field(default=None, metadata=opt(metavar="TOKEN"))
    """Reasoning start token, overriding what the tokenizer suggests."""
    think_end: str | None = field(default=None, metadata=opt(metavar="TOKEN"))
    """Reasoning end token, overriding what the tokenizer suggests."""
    max_truncation: float = field(default=0.05, metadata=opt(metavar="SHARE"))
    """Largest share of samples finished by length that passes."""
    min_reasoning: float = field(default=0.5, metadata=opt(metavar="SHARE"))
    """Smallest share of samples with a non-empty reasoning segment that passes."""
    only: list[str] | str | None = field(default=None, metadata=opt(metavar="A,B"))
    """Run only these checks."""
    skip: list[str] | str | None = field(default=None, metadata=opt(metavar="A,B"))
    """Leave out these checks."""
    write_clean: Path | None = field(default=None, metadata=opt(metavar="OUT"))
    """Write a new dataset without the samples any check flagged."""
    trust_remote_code: bool = field(
        default=False, metadata=opt("--trust-remote-code", cli_only="code")
    )
    """Run code the tokenizer ships (auto_map); only ever from the flag. Without it, a stored
    tokenizer that needs its code is not loaded and the checks needing it are skipped."""
    output: _ui.OutputOptions = field(default_factory=_ui.OutputOptions)

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        self.only, self.skip = _names(self.only), _names(self.skip)
        for flag, value in (
            ("--max-truncation", self.max_truncation),
            ("--min-reasoning", self.min_reasoning),
        ):
            if not 0.0 <= value <= 1.0:
                raise UserError(f"{flag} must be a share between 0 and 1 (got {value})")
        if (self.think_start is None) != (self.think_end is None):
            raise UserError("--think-start and --think-end go together: give both")
        for flag, names in (("--only", self.only), ("--skip", self.skip)):
            unknown = [n for n in names or [] if n not in CHECKS]
            if unknown:
                raise UserError(
                    f"{flag}: unknown check {', '.join(unknown)} (checks: {', '.join(CHECKS)})"
                )
        if self.write_clean is not None:
            self.write_clean = Path(self.write_clean)
            if self.write_clean.resolve() == self.path.resolve():
                raise UserError("--write-clean must name a new directory, not the input")

    def selected(self) -> list[str]:
        chosen = [c for c in CHECKS if self.only is None or c in self.only]
        return [c for c in chosen if c not in (self.skip or [])]


def _names(given: list[str] | str | None) -> list[str] | None:
    """--only/--skip: a list, or names separated by commas as the command line gives them."""
    if isinstance(given, str):
        return [n.strip() for n in given.split(",") if n.strip()]
    return given

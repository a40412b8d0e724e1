"""The options every stage shares, each declared once and embedded by the stage configs.

- `OutputOptions` (the field `output` of every config): --json, --quiet, --no-progress,
  --log-every.
- `WriteOptions` (the field `write` of every config whose stage writes a resumable output:
  gen, convert, extract, train, quickstart): how the output is opened (--resume,
  --overwrite, --force) and how often a dataset commits (--commit-every, --commit-interval).
  A stage with another cadence embeds it with its own default, e.g. extract's
  `WriteOptions(commit_every=256)`; `eagle3kit --help` shows that default (eagle3kit._help).

Light: configs import this before anything heavy loads.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from eagle3kit.errors import UserError

OPEN_MODES = ("auto", "resume", "overwrite")
WRITE_KEYS = ("mode", "force", "commit_every", "commit_interval")
"""WriteOptions' fields: the keyword arguments the format's dataset writers take for them."""


@dataclass(frozen=True)
class OutputOptions:
    """The shared output flags; cli.py builds one and every stage config carries it."""

    json: bool = False  # machine output on stdout
    quiet: bool = False  # only warnings and errors on stderr
    no_progress: bool = False  # no live display; plain status lines still appear
    log_every: float = 30.0  # seconds between plain status lines

    def __post_init__(self) -> None:
        if not self.log_every > 0:  # written this way so NaN is refused too
            raise UserError(f"--log-every must be > 0 seconds (got {self.log_every})")


@dataclass(frozen=True)
class WriteOptions:
    """How a stage opens its output and, for a dataset, how often it commits."""

    mode: str = "auto"
    """auto continues an output when there is one; resume requires one; overwrite starts
    afresh."""
    force: bool = False
    """Continue an output whose settings differ from this run's."""
    commit_every: int = 1000
    """Commit after this many samples..."""
    commit_interval: float = 60.0
    """...or after this many seconds, whichever comes first (a dataset's commits; train
    checkpoints on its own --checkpoint-every)."""

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise UserError("; ".join(problems))

    def problems(self) -> list[str]:
        found = []
        if self.mode not in OPEN_MODES:
            found.append(f"unknown open mode {self.mode!r} (one of {', '.join(OPEN_MODES)})")
        if not self.commit_every >= 1:
            found.append(f"--commit-every must be at least 1 (got {self.commit_every})")
        if not self.commit_interval > 0:
            found.append(f"--commit-interval must be > 0 seconds (got {self.commit_interval})")
        return found

    @classmethod
    def for_stage(cls, config: type, resume: bool = False, overwrite: bool = False,
                  force: bool = False, **given: Any) -> WriteOptions:
        """The options from --resume / --overwrite / --force and the commit flags given, on
        top of the defaults the stage's `config` class embeds (its `write` field)."""
        if resume and overwrite:
            raise UserError("--resume and --overwrite exclude each other")
        mode = "resume" if resume else "overwrite" if overwrite else "auto"
        factory = next(f for f in fields(config) if f.name == "write").default_factory
        assert callable(factory)  # every stage's `write` field has a default_factory
        base = factory()
        return replace(base, mode=mode, force=force, **given)

    def writer_options(self) -> dict[str, Any]:
        """The keyword arguments the format's dataset writers take for these options."""
        return {key: getattr(self, key) for key in WRITE_KEYS}

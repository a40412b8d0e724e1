"""The options every stage shares, each declared once and embedded by the stage configs.

- `OutputOptions` (the field `output` of every config): --json, --quiet, --no-progress,
  --log-every.
- `WriteOptions` (the field `write` of every config whose stage writes a resumable output:
  gen, convert, extract, train, quickstart): how the output is opened (--resume,
  --overwrite, --force) and how often a dataset commits (--commit-every, --commit-interval).
  A stage with another cadence embeds it with its own default, e.g. extract's
  `WriteOptions(commit_every=256)`; `eagle3kit --help` shows that default (eagle3kit._help).

Each option is declared once, on its config field: every field of a stage config is an option
(`--field-name`), its help the field's docstring and its default the field's default
(eagle3kit._command builds the command line from the configs). `metadata=opt(...)` gives it
other flag names, a metavar or a help panel; `arg(...)` makes it a positional, `embed(...)`
brings in another options dataclass's options, and `not_option()` keeps a field off the
command line.

Light: configs import this before anything heavy loads.
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass, field
from typing import Any

from eagle3kit.errors import UserError

CLI = "cli"
"""The key of a field's metadata that says how it is an option (its value: a `Cli`), or that
it is none (None)."""


@dataclass(frozen=True)
class Cli:
    """How a config field appears on the command line; help and default are the field's."""

    flags: tuple[str, ...] = ()
    """Its names (`--commit-every`, `-q`, `--fc-norm/--no-fc-norm`); none: `--field-name`."""
    metavar: str | None = None
    panel: str | None = None
    """The help panel it is listed in (Typer's rich_help_panel); none: Options."""
    envvar: str | None = None
    hidden: bool = False
    argument: bool = False
    """A positional argument rather than an option."""
    optional: bool = False
    """A positional that the command line may leave out although the field has no default
    (the config refuses the omission in its own words)."""
    negate: bool = False
    """A flag that turns the (true by default) field off, e.g. --no-verify for `verify`."""
    type: Any = None
    """What the command line parses the value as, when the field's type does not say."""
    last: str | None = None
    """A positional taking several values whose last one fills this other field
    (`PROMPTS... OUTPUT`)."""
    embed: bool = False
    """A field holding another options dataclass, whose options count as the config's own."""
    only: tuple[str, ...] = ()
    """embed: only these of the embedded options (none: all)."""
    cli_only: str | None = None
    """Why only the command line may give it (a key of `CLI_ONLY`): a settings file that sets
    it is refused, a recorded run's value is not replayed (docs/security.md)."""
    bounds: tuple[int, int] | None = None
    """The least and greatest integer the option takes (none: INT_BOUNDS)."""
    ints: bool = False
    """Text holding integers separated by commas (--depth-buckets 1024,4096), each bounded
    as an integer option is; a field typed as holding integers needs no telling."""


CLI_ONLY = {
    "code": "it lets a model's own code run",
    "destination": "it says where data and secrets are sent",
    "secret": "it is a secret",
    "deletion": "it gives leave to delete or replace what is there",
    "consent": "it consents to continuing an output or passing over a check",
}
"""What the options only the command line may give decide: a `--config` file may be someone
else's (a copied run.json or manifest.json), and only the person at the keyboard is trusted
with these (docs/security.md, "Settings files and copied directories")."""


def opt(*flags: str, **how: Any) -> dict[str, Cli]:
    """Field metadata making the field an option: `field(default=1, metadata=opt("--n"))`."""
    return {CLI: Cli(flags, **how)}


def not_option() -> dict[str, None]:
    """Field metadata keeping a config field off the command line (one another option fills,
    such as `out` from `PROMPTS... OUTPUT`)."""
    return {CLI: None}


def arg(**how: Any) -> dict[str, Cli]:
    """Field metadata making the field a positional argument."""
    return {CLI: Cli(argument=True, **how)}


def embed(*only: str, panel: str | None = None) -> dict[str, Cli]:
    """Field metadata embedding another options dataclass (`only` these of its options); its
    options without a panel of their own go to `panel`."""
    return {CLI: Cli(embed=True, only=only, panel=panel)}


INT_BOUNDS = (-(2**31), 2**31 - 1)
"""The integers an option takes unless its field says otherwise (`opt(bounds=...)`): int32,
which every count, length, layer and token id eagle3kit takes fits in (the format stores
ids and positions as int32, and torch and the engines take them so). A 23-digit
--sliding-window used to pass the config, create the run and end in torch's traceback."""
SEED_BOUNDS = (0, 2**31 - 1)
"""A seed: numpy's generators take no negative one, and a seed is mixed with sample numbers
into torch's 64 bits."""


def check_int_bounds(name: str, value: Any, hint: Any, cli: Cli) -> None:
    """Refuse, naming the flag, an integer outside the option's bounds: `value` itself, each
    of a list's, or each comma-separated number of text for a field holding integers
    (--layers 2,18,33, --tree 4,5). The command line checks every option given (or set by a
    --config file) so, as it builds the config: before anything is written or measured."""
    if not (cli.ints or _holds_ints(hint)):
        return
    low, high = cli.bounds or INT_BOUNDS
    for number in _integers(value):
        if not low <= number <= high:
            flag = next((f for f in cli.flags if f.startswith("--")), f"--{name.replace('_', '-')}")
            digits = str(abs(number))
            shown = (
                str(number)
                if len(digits) <= 20
                else f"{'-' if number < 0 else ''}{digits[:6]}... ({len(digits):,} digits)"
            )
            most = (
                f"the most it takes is {high:,}"
                if number > high
                else f"the least it takes is {low:,}"
            )
            raise UserError(f"{flag} {shown}: out of range ({most})")


def _holds_ints(hint: Any) -> bool:
    if hint is int:
        return True
    return typing.get_origin(hint) in (typing.Union, types.UnionType, list, tuple) and any(
        _holds_ints(arg) for arg in typing.get_args(hint)
    )


def _integers(value: Any) -> list[int]:
    """The integers in an option's value: an int, a list's, or text's comma-separated ones
    (text that is not a number is left to the config to refuse in its own words)."""
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list | tuple):
        return [n for item in value for n in _integers(item)]
    found = []
    for part in str(value).split(","):
        try:
            found.append(int(part))
        except ValueError:
            continue
    return found


OPEN_MODES = ("auto", "resume", "overwrite")
WRITE_KEYS = ("mode", "force", "commit_every", "commit_interval")
"""WriteOptions' fields: the keyword arguments the format's dataset writers take for them."""


@dataclass(frozen=True)
class OutputOptions:
    """The shared output flags; cli.py builds one and every stage config carries it."""

    json: bool = field(default=False, metadata=opt("--json", envvar="EAGLE3KIT_JSON"))
    """Print the result as JSON on stdout."""
    quiet: bool = field(default=False, metadata=opt("--quiet", "-q", envvar="EAGLE3KIT_QUIET"))
    """Only warnings and errors on stderr."""
    no_progress: bool = field(
        default=False, metadata=opt("--no-progress", envvar="EAGLE3KIT_NO_PROGRESS")
    )
    """No live display; plain status lines only."""
    log_every: float = field(
        default=30.0, metadata=opt("--log-every", envvar="EAGLE3KIT_LOG_EVERY", metavar="SECONDS")
    )
    """Seconds between status lines when stderr is not a terminal."""

    def __post_init__(self) -> None:
        if not self.log_every > 0:  # written this way so NaN is refused too
            raise UserError(f"--log-every must be > 0 seconds (got {self.log_every})")


@dataclass(frozen=True)
class WriteOptions:
    """How a stage opens its output and, for a dataset, how often it commits."""

    mode: str = field(default="auto", metadata=not_option())
    """auto continues an output when there is one; resume requires one; overwrite starts
    afresh (--resume, --overwrite)."""
    commit_every: int = field(default=1000, metadata=opt("--commit-every", metavar="N"))
    """Commit after N samples..."""
    commit_interval: float = field(
        default=60.0, metadata=opt("--commit-interval", metavar="SECONDS")
    )
    """...or after S seconds, whichever is first."""
    resume: bool = field(default=False, metadata=opt("--resume", cli_only="consent"))
    """Continue the output; fail if there is none."""
    overwrite: bool = field(default=False, metadata=opt("--overwrite", cli_only="deletion"))
    """Start the output afresh."""
    force: bool = field(default=False, metadata=opt("--force", cli_only="consent"))
    """Accept settings that differ from those the output was started with."""

    def __post_init__(self) -> None:
        # --resume and --overwrite are read into `mode` and cleared, so that replace() and
        # comparisons see the mode alone.
        if self.resume and self.overwrite:
            raise UserError("--resume and --overwrite exclude each other")
        if self.resume or self.overwrite:
            object.__setattr__(self, "mode", "resume" if self.resume else "overwrite")
            object.__setattr__(self, "resume", False)
            object.__setattr__(self, "overwrite", False)
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

    def writer_options(self) -> dict[str, Any]:
        """The keyword arguments the format's dataset writers take for these options."""
        return {key: getattr(self, key) for key in WRITE_KEYS}

"""`eagle3kit convert`'s options: what to convert, where, and the hidden-state flags."""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from eagle3kit import _ui
from eagle3kit._options import WriteOptions, arg, opt
from eagle3kit.errors import UserError
from eagle3kit.format import Dataset, HiddenDataset, is_dataset
from eagle3kit.target import parse_layer_ids

TOOLS = ("speculators", "specforge")
"""What `--to` exports to; hidden-state files of either are imported (convert/hidden.py)."""
NAMES = {"speculators": "speculators", "specforge": "SpecForge"}
HS_DIR = "hidden_states"
"""speculators' folder of hidden-state files, beside its token data."""
HS_FILE = re.compile(r"^hs_(\d+)\.safetensors$")
SF_FILE = re.compile(r"^data_(\d+)\.ckpt(\.gz)?$")


@dataclass
class ConvertConfig:
    src: Path = field(metadata=arg())
    """A dataset directory (exported to JSONL or Parquet), or a JSONL or .parquet file to
    import into a dataset."""
    dst: Path = field(metadata=arg())
    """The JSONL file to write ('-': stdout) or a .parquet file, or the dataset directory to
    write."""
    tokenizer: Path | None = None
    """Export: add decoded prompt_text and completion_text with this tokenizer."""
    partition: str | None = None
    """Export: only this partition."""
    skip_bad_lines: bool = field(default=False, metadata=opt("--skip-bad-lines"))
    """Import: skip and count malformed lines instead of stopping at the first."""
    to: str | None = None
    """Hidden states: export to speculators or specforge files (eagle3kit/convert/hidden.py)."""
    target: Path | None = None
    """Hidden states: the target model (its final norm for --to specforge; identity and
    default layers for an import)."""
    layers: list[int] | str | None = field(default=None, metadata=opt(metavar="2,18,33", type=str))
    """Hidden-state import: the aux layer ids, boundary convention."""
    trust_remote_code: bool = field(
        default=False, metadata=opt("--trust-remote-code", cli_only="code")
    )
    """Run the Python code a model or tokenizer directory ships (auto_map in its config), here
    the --tokenizer's on export. Only this flag allows it: what a dataset or run records
    never does."""
    write: WriteOptions = field(default_factory=WriteOptions)
    """Import: --resume/--overwrite/--force and the commit cadence."""
    output: _ui.OutputOptions = field(default_factory=_ui.OutputOptions)
    hidden: str | None = field(default=None, init=False)
    """"export" or "import" when the conversion is of hidden states, else None."""

    def __post_init__(self) -> None:
        self.src, self.dst = Path(self.src), Path(self.dst)
        if not self.src.exists():
            raise UserError(f"{self.src}: no such file or directory")
        self.layers = parse_layer_ids(self.layers)
        self.hidden = check_hidden(self)
        if str(self.dst) != "-":
            check_dst_kind(self.dst, file=not self.hidden and self.exporting)
        if self.hidden:
            return
        if self.parquet:
            check_pyarrow()
        if self.exporting:
            if self.skip_bad_lines or self.write.mode != "auto" or self.write.force:
                raise UserError(
                    "--skip-bad-lines, --resume, --overwrite and --force apply to import only"
                )
            if str(self.dst) == "-" and self.output.json:
                raise UserError(
                    "--json and '-' (samples to stdout) both write to stdout; choose one"
                )
        elif self.tokenizer or self.partition:
            raise UserError("--tokenizer and --partition apply to export (a dataset to JSONL) only")
        elif self.src.is_dir():
            raise UserError(f"{self.src}: a directory but not an eagle3kit dataset")

    @property
    def exporting(self) -> bool:
        return is_dataset(self.src)

    @property
    def parquet(self) -> bool:
        """Token samples to or from a .parquet file (convert/parquet.py), not JSONL."""
        return (self.dst if self.exporting else self.src).suffix.lower() == ".parquet"


# Hidden states: which conversion, if any ---------------------------------------------------
def detect(src: Path) -> str | None:
    """ "eagle3kit" (a hidden-state dataset), "speculators", "specforge", or None (not ours)."""
    if is_dataset(src):
        kind = Dataset(src, kind=None, verify_shards=False, warn_stray=False).kind
        return "eagle3kit" if kind == "hidden" else None
    if not src.is_dir():
        return None
    if (src / "state.json").is_file():
        if not (src / HS_DIR).is_dir():
            raise UserError(
                f"{src}: a Hugging Face dataset without a {HS_DIR}/ folder: no "
                "speculators hidden states to import (speculators' "
                "data_generation_offline.py writes them there)"
            )
        return "speculators"
    if any(HS_FILE.match(p.name) for p in src.iterdir()):
        raise UserError(
            f"{src}: speculators' {HS_DIR} folder; give its parent, the token data "
            "(what speculators' train reads as --data-path)"
        )
    if any(
        (p.is_dir() and p.name.startswith("rows_")) or SF_FILE.match(p.name) for p in src.iterdir()
    ):
        return "specforge"
    return None


def check_hidden(cfg: ConvertConfig) -> str | None:
    """ "export" or "import" for a hidden-state conversion, None for a token one; a flag that
    does not fit is refused here, before anything is read or written."""
    if cfg.to is not None and cfg.to not in TOOLS:
        raise UserError(f"--to must be one of {', '.join(TOOLS)} (got {cfg.to!r})")
    if cfg.target is not None and not Path(cfg.target).is_dir():
        raise UserError(f"--target {cfg.target}: no such directory")
    source = detect(cfg.src)
    if source is None:
        if cfg.to and is_dataset(cfg.src):
            raise UserError(
                f"--to {cfg.to}: {cfg.src} is a token dataset; --to converts a "
                "hidden-state dataset (from extract). A token dataset exports to "
                "JSONL without --to"
            )
        if cfg.to or cfg.target or cfg.layers:
            raise UserError(
                "--to, --target and --layers apply to hidden-state conversions "
                "(a hidden-state dataset, or speculators' or SpecForge's files)"
            )
        return None
    if cfg.tokenizer or cfg.partition:
        raise UserError("--tokenizer and --partition apply to token datasets exported to JSONL")
    if source != "eagle3kit":
        if cfg.to:
            raise UserError(
                f"--to {cfg.to}: {cfg.src} holds {NAMES[source]} files, which are "
                "imported into a hidden-state dataset: leave out --to"
            )
        return "import"
    if cfg.to is None:
        raise UserError(
            f"{cfg.src} is a hidden-state dataset: give --to speculators or "
            "--to specforge to export it"
        )
    if cfg.skip_bad_lines or cfg.write.mode != "auto" or cfg.write.force:
        raise UserError(
            "--skip-bad-lines, --resume, --overwrite and --force apply to import "
            "only (rerunning an export continues it)"
        )
    if cfg.layers:
        raise UserError("--layers applies to import: the dataset records its layers")
    if str(cfg.dst) == "-":
        raise UserError(f"--to {cfg.to} writes a directory; '-' (stdout) is for JSONL")
    last = HiddenDataset(cfg.src, verify_shards=False, warn_stray=False).last_state
    if cfg.to == "speculators":
        if last == "post_norm":
            raise UserError(
                f"{cfg.src} holds the last state after the final norm (imported "
                "from SpecForge); speculators needs it before the norm, which "
                "cannot be recovered: extract the states again with eagle3kit"
            )
        if cfg.target is not None:
            raise UserError(
                "--target is needed only with --to specforge (speculators keeps "
                "the last state before the norm, as the dataset does)"
            )
    elif last == "pre_norm" and cfg.target is None:
        raise UserError(
            "--to specforge needs --target (the target model directory): SpecForge "
            "stores the last state after the final norm, so export applies the "
            "target's norm weights"
        )
    return "export"


PARQUET_EXTRA = "pip install 'eagle3kit[hf]'"


def check_pyarrow() -> None:
    """Fail before any work when pyarrow (an optional extra) is missing."""
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise UserError(f"Parquet needs pyarrow, which is not installed: {PARQUET_EXTRA}") from None


_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISDIR, "a directory"),
)


def check_dst_kind(dst: Path, file: bool) -> None:
    """Refuse an OUT that convert would replace or write into and must not: a file is
    renamed over OUT, which turns a FIFO or a device (/dev/null, as root) into a plain file
    and a link into a file of its own, so it goes only over a regular file; a dataset goes
    only into a directory (a link to one is fine)."""
    try:
        mode = os.lstat(dst).st_mode
        if not file and stat.S_ISLNK(mode):
            mode = os.stat(dst).st_mode
    except OSError:
        return  # nothing there (or nothing that can be looked at): the stage says what
    if stat.S_ISREG(mode) or (not file and stat.S_ISDIR(mode)):
        return
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    if file:
        raise UserError(
            f"{dst}: {kind}, not a regular file; convert replaces OUT with the "
            "JSONL or Parquet file, so give a file path (or '-' for stdout)"
        )
    raise UserError(f"{dst}: {kind}, not a dataset directory; give a directory path")

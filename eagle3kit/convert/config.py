"""`eagle3kit convert`'s options: what to convert, where, and the hidden-state flags."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from eagle3kit import _ui
from eagle3kit._options import WriteOptions, arg, opt
from eagle3kit.errors import UserError
from eagle3kit.format import is_dataset
from eagle3kit.target import parse_layer_ids


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
    layers: list[int] | str | None = field(default=None, metadata=opt(
        metavar="2,18,33", type=str))
    """Hidden-state import: the aux layer ids, boundary convention."""
    trust_remote_code: bool = field(default=False, metadata=opt("--trust-remote-code",
                                                                  cli_only="code"))
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
        from eagle3kit.convert.hidden import check_config

        self.hidden = check_config(self)
        if str(self.dst) != "-":
            check_dst_kind(self.dst, file=not self.hidden and self.exporting)
        if self.hidden:
            return
        if self.parquet:
            check_pyarrow()
        if self.exporting:
            if self.skip_bad_lines or self.write.mode != "auto" or self.write.force:
                raise UserError("--skip-bad-lines, --resume, --overwrite and --force apply to "
                                "import only")
            if str(self.dst) == "-" and self.output.json:
                raise UserError("--json and '-' (samples to stdout) both write to stdout; "
                                "choose one")
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


PARQUET_EXTRA = "pip install 'eagle3kit[hf]'"


def check_pyarrow() -> None:
    """Fail before any work when pyarrow (an optional extra) is missing."""
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise UserError(f"Parquet needs pyarrow, which is not installed: {PARQUET_EXTRA}"
                        ) from None


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"))


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
        raise UserError(f"{dst}: {kind}, not a regular file; convert replaces OUT with the "
                        "JSONL or Parquet file, so give a file path (or '-' for stdout)")
    raise UserError(f"{dst}: {kind}, not a dataset directory; give a directory path")

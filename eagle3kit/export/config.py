"""`eagle3kit export`'s options: one dataclass that checks itself and names the flag."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from eagle3kit import _ui
from eagle3kit._options import arg, opt
from eagle3kit.checkpoints.rundir import RunDir
from eagle3kit.errors import UserError
from eagle3kit.target import check_layer_ids, parse_dtype, parse_layer_ids

FORMATS = ("vllm", "sglang", "both")
DTYPES = ("bfloat16", "float16", "float32")


@dataclass
class ExportConfig:
    run: Path = field(metadata=arg(metavar="RUN"))
    """A train run directory (RUN/run.json + RUN/drafter/), or any EAGLE-3 checkpoint
    directory."""
    out: Path = field(metadata=arg(metavar="OUT"))
    """The directory to write; with --format both, OUT/vllm and OUT/sglang."""
    format: str = "vllm"
    """vllm (speculators layout), sglang (LlamaForCausalLMEagle3), or both."""
    verifier: str | None = field(default=None, metadata=opt(metavar="NAME_OR_PATH"))
    """The model `vllm serve <draft>` loads; default: the target recorded in the run."""
    num_speculative_tokens: int = 3
    """Draft tokens per step in the vLLM config (its
    proposal_methods[0].speculative_tokens)."""
    dtype: str = "bfloat16"
    """Floating-point weights as bfloat16, float16 or float32 (d2t stays int64, t2d bool)."""
    target: Path | None = None
    """The target model directory; default: the path the run recorded, when it exists."""
    with_embedding: bool = field(default=False, metadata=opt("--with-embedding"))
    """vLLM export: add a bit-exact copy of the target's input embedding."""
    layers: list[int] | str | None = field(default=None, metadata=opt(metavar="A,B,C", type=str))
    """Boundary aux layer ids, only for a source checkpoint that records none."""
    trust_remote_code: bool = field(
        default=False, metadata=opt("--trust-remote-code", cli_only="code")
    )
    """Run code the target directory ships (auto_map); only ever from the flag, never from
    run.json."""
    overwrite: bool = field(default=False, metadata=opt("--overwrite", cli_only="deletion"))
    """Replace an OUT that holds an earlier export."""
    overwrite_dir: Path | None = field(
        default=None, metadata=opt(metavar="OUT", cli_only="deletion")
    )
    """Replace OUT even when it is not an earlier export, deleting what it holds: name OUT
    again here, so that no folder is emptied by a mistyped OUT."""
    output: _ui.OutputOptions = field(default_factory=_ui.OutputOptions)

    def __post_init__(self) -> None:
        self.run, self.out = Path(self.run), Path(self.out)
        self.target = None if self.target is None else Path(self.target)
        if self.format not in FORMATS:
            raise UserError(f"--format {self.format!r}: expected one of {', '.join(FORMATS)}")
        self.dtype, note = parse_dtype(self.dtype, allowed=DTYPES)
        if note:
            _ui.warn(note)
        if self.num_speculative_tokens < 1:
            raise UserError(
                f"--num-speculative-tokens must be >= 1 (got {self.num_speculative_tokens})"
            )
        if self.with_embedding and self.format == "sglang":
            raise UserError(
                "--with-embedding: the SGLang layout never has an embedding "
                "(SGLang always uses the target's)"
            )
        self.layers = parse_layer_ids(self.layers)
        if self.layers is not None:
            check_layer_ids(self.layers)
        if self.verifier is not None and not self.verifier.strip():
            raise UserError("--verifier: empty")
        if self.overwrite_dir is not None:
            self.overwrite_dir = Path(self.overwrite_dir)
            if self.overwrite_dir.resolve() != self.out.resolve():
                raise UserError(
                    f"--overwrite-dir {self.overwrite_dir}: not OUT ({self.out}); "
                    "name the output directory itself to replace it"
                )
        run = RunDir(self.run)
        check_out_spares(self.out, "the run directory", self.run)
        if run.exists():
            check_out_spares(self.out, "the run's drafter", run.drafter)
        if self.target is not None:
            check_out_spares(self.out, "the target (--target)", self.target)
        # Here, not in the stage: a mistyped path is refused in a second, before torch loads.
        if not self.run.is_dir():
            raise UserError(f"{self.run}: no such run directory")
        if self.target is not None and not (self.target / "config.json").is_file():
            raise UserError(f"--target {self.target}: not a model directory (no config.json)")


def check_out_spares(out: Path, what: str, path: Path) -> None:
    """Refuse an OUT that is or holds `path`: OUT is replaced whole, and the export would
    delete what it reads (real paths, so no link or `..` hides it)."""
    out_real, real = out.resolve(), Path(path).resolve()
    if out_real == real or out_real in real.parents:
        verb = "is" if out_real == real else "contains"
        raise UserError(
            f"{out}: {verb} {what} {path}; export replaces OUT whole, so write it "
            "to another directory"
        )

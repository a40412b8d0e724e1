"""`eagle3kit quickstart`'s settings: the directory, the sizes of each stage and the target's
shape, checked when made."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from eagle3kit._options import OutputOptions, WriteOptions, arg, embed, opt
from eagle3kit.errors import UserError

ARCHS = ("llama", "kimi")
KIMI_LAYERS = [1, 2, 3]
"""Aux layer ids of the 4-layer Kimi target (the default 2, N//2, N-3 needs 8 layers); all
below its depth, as vLLM captures only the states entering a layer."""
STATE_VERSION = 1
K = 3
"""Draft chain length of the predicted and the measured acceptance length."""


@dataclass
class QuickstartConfig:
    out: Path = field(default=Path("eagle3kit-quickstart"), metadata=arg(metavar="[DIR]"))
    """Where everything goes (continued when it holds a quickstart)."""
    prompts: int = 96
    """Held-out docstring prompts gen answers: the drafter's training data."""
    bench_prompts: int = 24
    """Further held-out prompts bench accept measures on."""
    target_steps: int = 300
    """Training (optimizer) steps of the tiny target."""
    target_arch: str = field(default="llama", metadata=opt(metavar="ARCH"))
    """The tiny target's architecture: llama (8 layers, hidden 64), or kimi: Kimi-K2's
    (DeepSeek-V3's) shape at 4 layers, hidden 256: Multi-head Latent Attention, routed and
    shared experts, YaRN, Kimi's chat markers and a tokenizer loaded through its own code,
    which every stage runs as if given --trust-remote-code (the quickstart wrote that code,
    and checks, byte for byte, that DIR holds no other before any stage runs)."""
    trust_remote_code: bool = field(default=False, metadata=opt(cli_only="code"))
    """Run code DIR holds that quickstart did not write (a Kimi quickstart directory copied
    from elsewhere, or edited): without it, such a directory is refused, naming the file."""
    train_steps: int = 60
    """Training (optimizer) steps of the drafter."""
    max_tokens: int = 256
    """Longest completion gen asks for."""
    threads: int = 1
    """torch threads: matrices this small gain little from more, and lose a lot on a busy
    machine where threads spin waiting for each other."""
    write: WriteOptions = field(
        default_factory=lambda: WriteOptions(commit_every=16, commit_interval=10.0),
        metadata=embed("overwrite"),
    )
    """--overwrite: start afresh, removing what an earlier quickstart left in `out`; the
    commit cadence gen uses (small: the quickstart's datasets are small)."""
    output: OutputOptions = field(default_factory=OutputOptions)

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        for flag, value, least in (
            ("--prompts", self.prompts, 4),
            ("--bench-prompts", self.bench_prompts, 1),
            ("--target-steps", self.target_steps, 1),
            ("--train-steps", self.train_steps, 1),
            ("--max-tokens", self.max_tokens, 16),
            ("--threads", self.threads, 1),
        ):
            if value < least:
                raise UserError(f"{flag} must be at least {least} (got {value})")
        if self.target_arch not in ARCHS:
            raise UserError(f"--target-arch {self.target_arch}: choose {' or '.join(ARCHS)}")

    @property
    def kimi(self) -> bool:
        return self.target_arch == "kimi"

    @property
    def trust(self) -> bool:
        """Only the Kimi target ships code of its own (its tokenizer), which quickstart wrote
        (`check_code` holds that), or the person allowed any code with the flag."""
        return self.kimi or self.trust_remote_code

    def artifact_options(self) -> dict[str, int | str]:
        """What decides the artifacts: a rerun with others would mix two quickstarts."""
        return {
            "prompts": self.prompts,
            "bench_prompts": self.bench_prompts,
            "target_steps": self.target_steps,
            "train_steps": self.train_steps,
            "max_tokens": self.max_tokens,
            "target_arch": self.target_arch,
        }

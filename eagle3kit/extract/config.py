"""`eagle3kit extract`'s options: one dataclass that checks itself and names the flag."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from eagle3kit import _ui
from eagle3kit._options import OutputOptions, WriteOptions, arg, opt
from eagle3kit._served_files import served_dir_problems
from eagle3kit._urls import server_url
from eagle3kit.errors import UserError
from eagle3kit.format import CODECS
from eagle3kit.target import check_layer_ids, parse_layer_ids
from eagle3kit.target.device import device_problem, parse_dtype

ENGINES = ("hf", "vllm")


@dataclass
class ExtractConfig:
    tokens: Path = field(metadata=arg(metavar="TOKENS"))
    """The token dataset to extract states for (written by gen or convert)."""
    out: Path = field(metadata=arg(metavar="OUTPUT"))
    """The hidden-state dataset to write or continue."""
    target: Path | None
    """The target model directory (HF); with --engine vllm, its config.json and tokenizer."""
    # Required, yet it may be None: the command line gives None when --target is left out,
    # and __post_init__ refuses it by name alongside any other problem of the command line.
    layers: list[int] | str | None = field(default=None, metadata=opt(metavar="2,18,33"))
    """Auxiliary layer ids, boundary convention ("2,18,33"); default (2, N//2, N-3)."""
    tokenizer: Path | None = None
    """The tokenizer the token ids came from; default the one stored in the token dataset."""
    engine: str = "hf"
    """hf: transformers in this process; vllm: a vLLM server with extract_hidden_states."""
    server: str | None = field(default=None, metadata=opt(metavar="URL", cli_only="destination"))
    """--engine vllm: the server's URL."""
    model: str | None = None
    """--engine vllm: the served model name (default: the server's first)."""
    concurrency: int = 8
    """--engine vllm: requests in flight."""
    request_timeout: float = field(default=600.0, metadata=opt(metavar="SECONDS"))
    """--engine vllm: seconds one request may take."""
    hidden_states_dir: Path | None = field(
        default=None, metadata=opt(metavar="DIR", cli_only="deletion")
    )
    """--engine vllm: the server's shared_storage_path as this machine sees it; only
    `.safetensors` files inside it that the server names are read, then deleted. Required."""
    api_key: str | None = field(
        default=None, repr=False, metadata=opt(envvar="EAGLE3KIT_API_KEY", cli_only="secret")
    )
    """--engine vllm: bearer token for the server (never stored)."""
    device: str = "auto"
    """cpu, cuda, cuda:N; auto: cuda when there is one (under torchrun, the rank's)."""
    dtype: str = "auto"
    """bfloat16, float16, float32; auto: bfloat16 on GPU, float32 on CPU."""
    device_map: str | None = None
    """Spread a model bigger than one GPU with accelerate (e.g. auto); replaces --device."""
    batch_tokens: int = field(default=8192, metadata=opt(metavar="N"))
    """Tokens per forward pass, padding included; a longer sample runs alone."""
    codec: str = "raw"
    """raw (bf16), fp8 (e4m3, a scale per token and state) or zstd (bf16 byte planes)."""
    trust_remote_code: bool = field(default=False, metadata=opt(cli_only="code"))
    """Run code the target directory or the dataset's stored tokenizer ships (auto_map);
    only ever from the flag, never from what the token dataset records."""
    ignore_disk_check: bool = field(default=False, metadata=opt(cli_only="consent"))
    """Start even when the free disk is short of the estimate."""
    dry_run: bool = False
    """Print the estimate and exit; nothing is written."""
    write: WriteOptions = field(default_factory=lambda: WriteOptions(commit_every=256))
    """--resume/--overwrite/--force and the commit cadence (256 samples: states are big)."""
    output: OutputOptions = field(default_factory=OutputOptions)

    def __post_init__(self) -> None:
        self.tokens, self.out = Path(self.tokens), Path(self.out)
        problems = self._problems()
        if problems:
            raise UserError("; ".join(problems))

    def _problems(self) -> list[str]:
        found = []
        try:
            self.layers = parse_layer_ids(self.layers)
            if self.layers is not None:
                check_layer_ids(self.layers)
        except UserError as exc:
            found.append(str(exc))
        if self.target is None:
            found.append("--target is required (the target model directory)")
        elif not Path(self.target).is_dir():
            found.append(f"--target {self.target}: no such directory")
        if self.engine not in ENGINES:
            found.append(f"--engine must be one of {', '.join(ENGINES)} (got {self.engine!r})")
        if self.engine == "vllm" and not self.server:
            found.append("--engine vllm needs --server URL")
        elif self.server:
            try:
                self.server = server_url(self.server)
            except UserError as exc:
                found.append(str(exc))
        if self.hidden_states_dir is not None:
            self.hidden_states_dir = Path(self.hidden_states_dir)
        if self.engine == "hf" and self.server:
            found.append("--server applies to --engine vllm only")
        found += served_dir_problems(self.hidden_states_dir, self.engine == "vllm", "--engine vllm")
        if self.codec not in CODECS:
            found.append(f"--codec must be one of {', '.join(CODECS)} (got {self.codec!r})")
        in_process = self.engine == "hf" and not self.device_map
        device = device_problem(self.device) if in_process else None
        if device:
            found.append(device)
        try:
            self.dtype, note = parse_dtype(self.dtype)
            if note:
                _ui.warn(note)
        except UserError as exc:
            found.append(str(exc))
        for flag, value in (
            ("--batch-tokens", self.batch_tokens),
            ("--concurrency", self.concurrency),
        ):
            if value < 1:
                found.append(f"{flag} must be at least 1 (got {value})")
        if not (self.request_timeout > 0 and math.isfinite(self.request_timeout)):
            found.append(
                f"--request-timeout must be a finite number > 0 of seconds (got "
                f"{self.request_timeout})"
            )
        return found

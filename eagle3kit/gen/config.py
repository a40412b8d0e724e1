"""Every setting of `eagle3kit gen`, with its default and its own validation."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, cast

from eagle3kit import _json
from eagle3kit._options import (
    INT_BOUNDS,
    SEED_BOUNDS,
    OutputOptions,
    WriteOptions,
    arg,
    embed,
    not_option,
    opt,
)
from eagle3kit.errors import UserError

PATHS_LAST = (
    "give the prompt files, then the output directory last (or --dataset NAME, then "
    "the output directory)"
)
_SLOTS = re.compile(r"^(?P<url>.*?)@(?P<slots>\d+)$")


_DURATION = re.compile(
    r"^(?:(?P<h>\d+(?:\.\d+)?)h)?(?:(?P<m>\d+(?:\.\d+)?)m)?"
    r"(?:(?P<s>\d+(?:\.\d+)?)s?)?$"
)


def parse_duration(value: float | str, flag: str) -> float:
    """Seconds from 900, '900', '90s', '15m', '1h' or '1h30m'."""
    if isinstance(value, int | float):
        return float(value)
    match = _DURATION.match(value.strip().lower())
    if not value.strip() or not match:
        raise UserError(f"{flag} {value}: expected a duration like 90s, 15m, 1h30m or seconds")
    h, m, sec = (float(match[k] or 0) for k in "hms")
    return h * 3600 + m * 60 + sec


@dataclass(frozen=True)
class ServerSpec:
    url: str
    concurrency: int | None = None
    """Slots for this server; None takes --concurrency."""


def json_object(value: dict | str, flag: str) -> dict:
    """A JSON object given as text on the command line (a dict passes through)."""
    if isinstance(value, dict):
        return value
    return _json.json_object(value, flag, example="'{\"enable_thinking\": false}'")


def parse_server(text: str) -> ServerSpec:
    """'http://host:30000' or 'http://host:30000@128' (that server's own concurrency)."""
    from eagle3kit._urls import server_url

    match = _SLOTS.match(text.strip())
    url, slots = (match["url"], int(match["slots"])) if match else (text, None)
    if slots is not None and slots < 1:
        raise UserError(f"--server {text}: concurrency must be at least 1")
    if slots is not None and slots > INT_BOUNDS[1]:  # bounded as --concurrency is
        raise UserError(
            f"--server {text}: concurrency out of range (the most it takes is {INT_BOUNDS[1]:,})"
        )
    return ServerSpec(server_url(url, "--server", concurrency=True), slots)


# gen's help groups its options by what they are about (Typer's rich_help_panel).
INPUT, SERVERS, RENDER, SAMPLING, RUN = (
    "Prompts",
    "Servers",
    "Rendering the prompts",
    "Sampling and lengths",
    "The run",
)


@dataclass
class GenConfig:
    prompts: list[Path] = field(
        metadata=arg(metavar="PROMPTS... OUTPUT", last="out", type=list[Path])
    )
    """Prompt files (JSONL, JSON, parquet), then the output dataset directory last."""
    out: Path = field(metadata=not_option())  # filled by PROMPTS... OUTPUT's last value
    """The token dataset to write (created, or continued when it exists)."""
    dataset: str | None = field(default=None, metadata=opt(metavar="NAME_OR_PATH", panel=INPUT))
    """Read prompts through HF datasets (the hf extra): a dataset name or path."""
    dataset_split: str = field(default="train", metadata=opt(panel=INPUT))
    """The --dataset split to read."""
    format: str = field(default="auto", metadata=opt(panel=INPUT))
    """Prompt file shape: auto, messages, sharegpt, conversations, prompt, mtbench."""
    partition_field: str | None = field(default=None, metadata=opt(panel=INPUT))
    """Record field naming each prompt's partition (default: the file name)."""
    partition: str | None = field(default=None, metadata=opt(panel=INPUT))
    """Only this partition, or all."""
    max_samples: int | None = field(default=None, metadata=opt(panel=INPUT))
    """At most N conversations (after --partition and --shuffle-seed)."""
    shuffle_seed: int | None = field(default=None, metadata=opt(panel=INPUT, bounds=SEED_BOUNDS))
    """Shuffle the conversations with this seed before --max-samples picks."""
    skip_bad_lines: bool = field(default=False, metadata=opt("--skip-bad-lines", panel=INPUT))
    """Skip and count malformed prompt lines instead of stopping at the first."""
    servers: list[ServerSpec | str] = field(
        default_factory=list,
        metadata=opt("--server", metavar="URL[@N]", panel=SERVERS, cli_only="destination"),
    )
    """An SGLang or vLLM server; repeat for several; @N sets its own concurrency. Required
    unless --engine hf."""
    api: str = field(default="auto", metadata=opt(panel=SERVERS))
    """auto, sglang, vllm, or openai-chat (text fallback, marked reconstructed)."""
    api_key: str | None = field(
        default=None,
        repr=False,
        metadata=opt(envvar="EAGLE3KIT_API_KEY", panel=SERVERS, cli_only="secret"),
    )
    """Bearer token for the servers (never stored)."""
    engine: Literal["server", "hf"] = field(default="server", metadata=opt(panel=SERVERS))
    """server, or hf: transformers in-process with --target."""
    target: Path | None = field(default=None, metadata=opt(panel=SERVERS))
    """The target model directory (for --engine hf)."""
    concurrency: int = field(default=64, metadata=opt(panel=SERVERS))
    """Requests in flight per server."""
    request_timeout: float | None = field(
        default=None, metadata=opt(metavar="SECONDS", panel=SERVERS)
    )
    """Limit on one whole generation (default none: long reasoning takes long)."""
    max_attempts: int | None = field(default=None, metadata=opt(panel=SERVERS))
    """Attempts per request on a server that is up (default: no limit, --retry-for bounds
    it)."""
    retry_for: float | str = field(default=900.0, metadata=opt(metavar="DURATION", panel=SERVERS))
    """Retry a failing request for this long, e.g. 15m, 1h, 900 (seconds): the backoff between
    its attempts adds up to at most this; time its server is down does not count."""
    stall_after: float | str = field(default=600.0, metadata=opt(metavar="DURATION", panel=SERVERS))
    """Warn about a request with no answer for this long."""
    long_threshold: int | None = field(default=None, metadata=opt(panel=SERVERS))
    """Prompts with at least N tokens use the --long-* settings, others --short-*."""
    short_concurrency: int | None = field(default=None, metadata=opt(panel=SERVERS))
    """Requests in flight per server for short prompts (default --concurrency)."""
    long_concurrency: int | None = field(default=None, metadata=opt(panel=SERVERS))
    """Requests in flight per server for long prompts (default --concurrency)."""
    tokenizer: Path | None = field(default=None, metadata=opt(panel=RENDER))
    """The target's tokenizer directory. Required, except with --engine hf (then --target's)."""
    trust_remote_code: bool = field(
        default=False, metadata=opt("--trust-remote-code", panel=RENDER, cli_only="code")
    )
    """Run the Python code the tokenizer or target ships (auto_map); recorded in the dataset,
    so later stages need it no more."""
    chat_template: Path | None = field(default=None, metadata=opt(panel=RENDER))
    """A Jinja chat template file (default: the tokenizer's)."""
    chat_template_kwargs: dict | str = field(
        default_factory=dict, metadata=opt(metavar="JSON", panel=RENDER)
    )
    """Template variables, e.g. '{"enable_thinking": false}'."""
    system: str | None = field(default=None, metadata=opt(metavar="PROMPT", panel=RENDER))
    """System prompt for conversations without one."""
    history: Literal["own", "dataset"] = field(default="own", metadata=opt(panel=RENDER))
    """Later turns see the model's own answers (own) or the dataset's (dataset)."""
    tokenizer_check: bool = field(
        default=True, metadata=opt("--no-tokenizer-check", negate=True, panel=RENDER)
    )
    """Skip checking that each server tokenizes a probe text as --tokenizer does (checked by
    default)."""
    max_tokens: int = field(default=4096, metadata=opt(panel=SAMPLING))
    """Longest completion asked for."""
    max_seq_len: int | None = field(default=None, metadata=opt(panel=SAMPLING))
    """Prompt + completion cap (default the server's context length)."""
    short_max_tokens: int | None = field(default=None, metadata=opt(panel=SAMPLING))
    """--max-tokens for short prompts (with --long-threshold)."""
    long_max_tokens: int | None = field(default=None, metadata=opt(panel=SAMPLING))
    """--max-tokens for long prompts (with --long-threshold)."""
    min_completion_tokens: int = field(default=0, metadata=opt(panel=SAMPLING))
    """Shorter completions are recorded as filtered."""
    temperature: float = field(default=0.7, metadata=opt(panel=SAMPLING))
    """Sampling temperature; 0 is greedy."""
    top_p: float = field(default=1.0, metadata=opt(panel=SAMPLING))
    """Nucleus sampling: the smallest set of tokens holding this much probability."""
    top_k: int = field(default=-1, metadata=opt(panel=SAMPLING))
    """Sample among the k likeliest tokens; -1 off."""
    min_p: float = field(default=0.0, metadata=opt(panel=SAMPLING))
    """Drop tokens less likely than this share of the likeliest one's probability."""
    n: int = field(default=1, metadata=opt("--n", panel=SAMPLING))
    """Samples per prompt; each has its own seed derived from its sample id."""
    sampling_seed: int | None = field(
        default=None, metadata=opt(panel=SAMPLING, bounds=SEED_BOUNDS)
    )
    """Each sample's seed derives from it and the sample id (default: unseeded)."""
    strict: bool = field(default=False, metadata=opt("--strict", panel=RUN))
    """Stop at the first response that breaks an invariant."""
    grace: float = field(default=30.0, metadata=opt(metavar="SECONDS", panel=RUN))
    """Time in-flight requests get to finish after Ctrl-C (SIGINT) or SIGTERM."""
    write: WriteOptions = field(default_factory=WriteOptions, metadata=embed(panel=RUN))
    """--resume/--overwrite/--force and the commit cadence."""
    retry_failed: bool = field(default=True, metadata=opt("--keep-failed", negate=True, panel=RUN))
    """Leave the samples an earlier run recorded as skipped:failed (by default a rerun retries
    them)."""
    output: OutputOptions = field(default_factory=OutputOptions)

    def __post_init__(self) -> None:
        if self.out is None:  # a single path on the command line
            raise UserError(PATHS_LAST)
        self.prompts = [Path(p) for p in self.prompts]
        self.out = Path(self.out)
        self.servers = [s if isinstance(s, ServerSpec) else parse_server(s) for s in self.servers]
        self.chat_template_kwargs = json_object(self.chat_template_kwargs, "--chat-template-kwargs")
        self.retry_for = parse_duration(self.retry_for, "--retry-for")
        self.stall_after = parse_duration(self.stall_after, "--stall-after")
        self._check_inputs()
        self._check_engine()
        self._check_numbers()

    def _check_inputs(self) -> None:
        if not self.prompts and not self.dataset:
            raise UserError(PATHS_LAST)
        for path in self.prompts:
            if not path.is_file():
                raise UserError(f"{path}: no such prompt file")
        if self.history not in ("own", "dataset"):
            raise UserError(f"--history must be own or dataset (got {self.history})")

    @property
    def tokenizer_flag(self) -> str:
        """The flag that named the tokenizer: --target when --engine hf took it from there."""
        return (
            "--target" if self.engine == "hf" and self.tokenizer == self.target else "--tokenizer"
        )

    def _check_engine(self) -> None:
        from eagle3kit.gen.servers import API_CHOICES

        if self.engine == "hf":
            if self.target is None:
                raise UserError("--engine hf needs --target PATH (a transformers model directory)")
            if self.servers:
                raise UserError("--server and --engine hf exclude each other")
            self.tokenizer = self.tokenizer or self.target
        elif self.engine == "server":
            if not self.servers:
                raise UserError("give at least one --server URL (or --engine hf --target PATH)")
            from eagle3kit._urls import server_url

            # (cast: __post_init__ parsed every --server before this check)
            self.servers = [
                ServerSpec(server_url(s.url, concurrency=True), s.concurrency)
                for s in cast(list[ServerSpec], self.servers)
            ]
            if self.api not in API_CHOICES:
                raise UserError(f"--api must be one of {', '.join(API_CHOICES)} (got {self.api})")
        else:
            raise UserError(f"--engine must be server or hf (got {self.engine})")
        if self.tokenizer is None:
            raise UserError(
                "--tokenizer PATH is needed: prompts are rendered client-side with "
                "the target's own tokenizer"
            )

    def _check_numbers(self) -> None:
        at_least_one = {
            "--concurrency": self.concurrency,
            "--max-tokens": self.max_tokens,
            "--n": self.n,
            "--max-attempts": self.max_attempts,
            "--max-seq-len": self.max_seq_len,
            "--long-threshold": self.long_threshold,
            "--max-samples": self.max_samples,
            "--short-concurrency": self.short_concurrency,
            "--long-concurrency": self.long_concurrency,
            "--short-max-tokens": self.short_max_tokens,
            "--long-max-tokens": self.long_max_tokens,
        }
        for flag, value in at_least_one.items():
            if value is not None and value < 1:
                raise UserError(f"{flag} must be at least 1 (got {value})")
        # Each test is written to fail on NaN, which passes a plain `<`: its requests would
        # carry `null` (JSON has no NaN), the server's own default, recorded nowhere.
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise UserError(f"--temperature must be a finite number >= 0 (got {self.temperature})")
        if not 0 < self.top_p <= 1:
            raise UserError(f"--top-p must be in (0, 1] (got {self.top_p})")
        if not 0 <= self.min_p <= 1:
            raise UserError(f"--min-p must be in [0, 1] (got {self.min_p})")
        if self.min_completion_tokens < 0:
            raise UserError("--min-completion-tokens must be >= 0")
        # (cast: __post_init__ parsed --retry-for and --stall-after to seconds before this)
        seconds = {
            "--grace": self.grace,
            "--request-timeout": self.request_timeout,
            "--retry-for": cast(float, self.retry_for),
            "--stall-after": cast(float, self.stall_after),
        }
        for flag, secs in seconds.items():
            if secs is not None and not (secs > 0 and math.isfinite(secs)):
                raise UserError(f"{flag} must be a finite number > 0 of seconds (got {secs})")
        long_flags = (
            self.short_concurrency,
            self.long_concurrency,
            self.short_max_tokens,
            self.long_max_tokens,
        )
        if self.long_threshold is None and any(v is not None for v in long_flags):
            raise UserError("--short-*/--long-* settings need --long-threshold")

    def identity(self) -> dict:
        """The settings a rerun must keep (or pass --force): they change what gets stored."""
        return {
            "stage": "gen",
            "history": self.history,
            "system": self.system,
            "chat_template_kwargs": self.chat_template_kwargs,
            "api_family": "text" if self.api == "openai-chat" else "ids",
            "max_tokens": self.max_tokens,
            "max_seq_len": self.max_seq_len,
            "long_threshold": self.long_threshold,
            "short_max_tokens": self.short_max_tokens,
            "long_max_tokens": self.long_max_tokens,
            "min_completion_tokens": self.min_completion_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "n": self.n,
            "sampling_seed": self.sampling_seed,
        }

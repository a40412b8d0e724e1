"""Every setting of `eagle3kit gen`, with its default and its own validation."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

from eagle3kit import _json
from eagle3kit._options import OutputOptions, WriteOptions
from eagle3kit.errors import UserError

_SLOTS = re.compile(r"^(?P<url>.*?)@(?P<slots>\d+)$")


_DURATION = re.compile(r"^(?:(?P<h>\d+(?:\.\d+)?)h)?(?:(?P<m>\d+(?:\.\d+)?)m)?"
                       r"(?:(?P<s>\d+(?:\.\d+)?)s?)?$")


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
    return ServerSpec(server_url(url, "--server", concurrency=True), slots)


@dataclass
class GenConfig:
    prompts: list[Path]
    """Prompt files: JSONL, JSON or parquet."""
    out: Path
    """The token dataset to write (created, or continued when it exists)."""
    dataset: str | None = None
    """An HF dataset name or path, read with the `hf` extra."""
    dataset_split: str = "train"
    format: str = "auto"
    """Prompt file shape: auto, messages, sharegpt, conversations, prompt, mtbench."""
    partition_field: str | None = None
    """Record field naming each prompt's partition (default: the file name)."""
    partition: str | None = None
    """Only this partition ('all' for every one)."""
    max_samples: int | None = None
    """At most this many conversations (after --partition and --shuffle-seed)."""
    shuffle_seed: int | None = None
    skip_bad_lines: bool = False
    tokenizer: Path | None = None
    """The target's tokenizer directory (default: --target with --engine hf)."""
    trust_remote_code: bool = False
    """Run code the tokenizer or target directory ships (auto_map); recorded in the dataset,
    so later stages run it without being told again."""
    chat_template: Path | None = None
    chat_template_kwargs: dict | str = field(default_factory=dict)
    system: str | None = None
    """A system prompt for conversations that have none."""
    history: Literal["own", "dataset"] = "own"
    """Later turns see the model's own earlier answers, or the dataset's."""
    servers: list[ServerSpec | str] = field(default_factory=list)
    api: str = "auto"
    engine: Literal["server", "hf"] = "server"
    target: Path | None = None
    api_key: str | None = field(default=None, repr=False)
    tokenizer_check: bool = True
    concurrency: int = 64
    max_tokens: int = 4096
    max_seq_len: int | None = None
    """Prompt + completion cap (default: the server's context length)."""
    long_threshold: int | None = None
    """Prompts with at least this many tokens use the long settings."""
    short_concurrency: int | None = None
    long_concurrency: int | None = None
    short_max_tokens: int | None = None
    long_max_tokens: int | None = None
    min_completion_tokens: int = 0
    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    n: int = 1
    """Samples per prompt; each has its own seed derived from its sample id."""
    sampling_seed: int | None = None
    request_timeout: float | None = None
    """Seconds for one whole generation; none by default (long reasoning takes long)."""
    max_attempts: int | None = None
    """Attempts per request on a server that is up; none by default: --retry-for bounds it."""
    retry_for: float | str = 900.0
    """How long one request is retried (the backoff between its attempts adds up to at most
    this; time its server spends down does not count): seconds, or '15m', '1h'."""
    retry_failed: bool = True
    """A rerun retries the samples an earlier run recorded as skipped:failed (--keep-failed:
    leave them)."""
    stall_after: float | str = 600.0
    """Warn when a request has had no answer for this long."""
    strict: bool = False
    grace: float = 30.0
    """Seconds in-flight requests get to finish after SIGINT/SIGTERM."""
    write: WriteOptions = field(default_factory=WriteOptions)
    """--resume/--overwrite/--force and the commit cadence."""
    output: OutputOptions = field(default_factory=OutputOptions)

    @classmethod
    def from_paths(cls, paths: list[Path], **options: Any) -> GenConfig:
        """PROMPTS... OUTPUT as the command line gives them: the output directory last."""
        if len(paths) < 2 and not (options.get("dataset") and paths):
            raise UserError("give the prompt files, then the output directory last")
        *inputs, out = paths
        return cls(inputs, out, **options)

    def __post_init__(self) -> None:
        self.prompts = [Path(p) for p in self.prompts]
        self.out = Path(self.out)
        self.servers = [s if isinstance(s, ServerSpec) else parse_server(s)
                        for s in self.servers]
        self.chat_template_kwargs = json_object(self.chat_template_kwargs,
                                                "--chat-template-kwargs")
        self.retry_for = parse_duration(self.retry_for, "--retry-for")
        self.stall_after = parse_duration(self.stall_after, "--stall-after")
        self._check_inputs()
        self._check_engine()
        self._check_numbers()

    def _check_inputs(self) -> None:
        if not self.prompts and not self.dataset:
            raise UserError("give at least one prompt file, or --dataset")
        for path in self.prompts:
            if not path.is_file():
                raise UserError(f"{path}: no such prompt file")
        if self.history not in ("own", "dataset"):
            raise UserError(f"--history must be own or dataset (got {self.history})")

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
            self.servers = [ServerSpec(server_url(s.url, concurrency=True), s.concurrency)
                            for s in cast(list[ServerSpec], self.servers)]
            if self.api not in API_CHOICES:
                raise UserError(f"--api must be one of {', '.join(API_CHOICES)} (got {self.api})")
        else:
            raise UserError(f"--engine must be server or hf (got {self.engine})")
        if self.tokenizer is None:
            raise UserError("--tokenizer PATH is needed: prompts are rendered client-side with "
                            "the target's own tokenizer")

    def _check_numbers(self) -> None:
        at_least_one = {
            "--concurrency": self.concurrency, "--max-tokens": self.max_tokens,
            "--n": self.n, "--max-attempts": self.max_attempts,
            "--max-seq-len": self.max_seq_len,
            "--long-threshold": self.long_threshold, "--max-samples": self.max_samples,
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
            raise UserError(f"--temperature must be a finite number >= 0 (got "
                            f"{self.temperature})")
        if not 0 < self.top_p <= 1:
            raise UserError(f"--top-p must be in (0, 1] (got {self.top_p})")
        if not 0 <= self.min_p <= 1:
            raise UserError(f"--min-p must be in [0, 1] (got {self.min_p})")
        if self.min_completion_tokens < 0:
            raise UserError("--min-completion-tokens must be >= 0")
        # (cast: __post_init__ parsed --retry-for and --stall-after to seconds before this)
        seconds = {"--grace": self.grace, "--request-timeout": self.request_timeout,
                   "--retry-for": cast(float, self.retry_for),
                   "--stall-after": cast(float, self.stall_after)}
        for flag, secs in seconds.items():
            if secs is not None and not (secs > 0 and math.isfinite(secs)):
                raise UserError(f"{flag} must be a finite number > 0 of seconds (got {secs})")
        long_flags = (self.short_concurrency, self.long_concurrency, self.short_max_tokens,
                      self.long_max_tokens)
        if self.long_threshold is None and any(v is not None for v in long_flags):
            raise UserError("--short-*/--long-* settings need --long-threshold")

    def identity(self) -> dict:
        """The settings a rerun must keep (or pass --force): they change what gets stored."""
        return {
            "stage": "gen", "history": self.history, "system": self.system,
            "chat_template_kwargs": self.chat_template_kwargs,
            "api_family": "text" if self.api == "openai-chat" else "ids",
            "max_tokens": self.max_tokens, "max_seq_len": self.max_seq_len,
            "long_threshold": self.long_threshold, "short_max_tokens": self.short_max_tokens,
            "long_max_tokens": self.long_max_tokens,
            "min_completion_tokens": self.min_completion_tokens,
            "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
            "min_p": self.min_p, "n": self.n, "sampling_seed": self.sampling_seed,
        }

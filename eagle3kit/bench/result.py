"""What each bench command returns: `AcceptReport` (with a `PromptResult` per turn) for
`bench accept`, `ServerReport` for `bench server`, `ParityReport` for `bench parity`; their
`to_dict()` is the --json output.

Their own module so the command that makes one and `report.py`, which shows it, both import
it and neither the other.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class PromptResult:
    prompt: str
    """FILE:LINE of the conversation."""
    turn: int
    category: str
    prompt_tokens: int
    tokens: int
    rounds: list[int]
    spec_seconds: float
    plain_seconds: float
    status: str
    """identical, near-tie or mismatch (temperature 0); sampled otherwise."""
    diverged_at: int | None = None
    margin: float | None = None
    """Top-1 logit minus the logit of the token speculation chose, where the outputs part."""
    phases: list[str] = field(default_factory=list)
    """The reasoning phase of each round (eagle3kit.chat.phases): think, answer, tool_call."""
    depths: list[int] = field(default_factory=list)
    """The context depth of each round in tokens (eagle3kit.model.depth)."""


@dataclass
class AcceptReport:
    target: str
    drafter: str
    device: str
    dtype: str
    shape: str
    k: int
    temperature: float
    max_new_tokens: int
    tie_epsilon: float
    acceptance_length: float | None
    per_position: list[float | None]
    """Unconditional acceptance rate of draft positions 1..k."""
    per_position_conditional: list[float | None]
    rounds: int
    tokens: int
    spec_tokens_per_s: float | None
    plain_tokens_per_s: float | None
    speedup: float | None
    lossless: bool | None
    """Temperature 0: every output equals the target's own up to near-ties; else None."""
    near_ties: int
    mismatches: int
    categories: dict[str, dict[str, Any]]
    phases: dict[str, dict[str, Any]] = field(default_factory=dict)
    """think / answer / tool_call -> rounds, acceptance_length, per_position (only phases
    that had rounds; empty when the tokenizer has no think or tool-call markers)."""
    depth_edges: list[int] = field(default_factory=list)
    """The depth buckets' edges in tokens (--depth-buckets)."""
    depths: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Context-depth bucket ('<1K', '1K-4K', ...) -> from, to, rounds, acceptance_length,
    per_position: where in the sequence each verification round happened (only buckets
    that had rounds)."""
    verify: str | None = None
    """The verification rule at temperature > 0 (--verify); None at temperature 0."""
    top_p: float = 1.0
    top_k: int = -1
    interval: dict[str, Any] | None = None
    """Temperature > 0: the confidence interval around acceptance_length (low, high,
    standard_error, rounds, generations, confidence); None at temperature 0."""
    predicted_acceptance_length: float | None = None
    predicted: dict[str, Any] | None = None
    """The drafter's eagle3kit.eval block (what training predicted), when it has one."""
    warnings: list[str] = field(default_factory=list)
    prompts: list[PromptResult] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 1 if self.lossless is False else 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ServerReport:
    server: str
    api: str
    version: str | None
    model: str
    shape: str
    k: int | None
    temperature: float
    source: str
    """Where the acceptance figures come from."""
    requests: int
    errors: int
    acceptance_length: float | None
    per_position: list[float | None]
    per_position_conditional: list[float | None]
    draft_acceptance_rate: float | None
    run: dict[str, Any]
    """tokens, seconds, tokens_per_s, latency_p50/p90/p99 of the speculating server."""
    categories: dict[str, dict[str, Any]]
    baseline: dict[str, Any] | None = None
    speedup: float | None = None
    """Throughput (tokens/s) of the server over the baseline's."""
    latency_speedup: float | None = None
    """Median request latency of the baseline over the server's."""
    rounds: int | None = None
    """Verification rounds the figures rest on: vLLM's num_drafts, SGLang's Σ
    spec_verify_ct."""
    acceptance_length_without_prefill: float | None = None
    """SGLang: the same without each request's first token, which prefill made: tokens per
    verification round as bench accept counts them."""
    lossless: None = None
    """Not checkable from a server: present so the JSON keys match bench accept's."""
    near_ties: None = None
    depth_edges: list[int] = field(default_factory=list)
    """The depth buckets' edges in tokens (--depth-buckets)."""
    depths: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Context-depth bucket -> from, to, rounds, acceptance_length, per_position, from the
    engine's own rounds of each request (vLLM started with --per-request-spec-decode-metrics
    detailed); empty when the server does not report them."""
    warnings: list[str] = field(default_factory=list)
    findings: list[dict[str, str]] = field(default_factory=list)
    """Causes named (cause, message; eagle3kit.bench.diagnose): at temperature > 0 an engine
    that keeps almost no drafts yet keeps them at temperature 0 is `engine-sampling`."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ParityReport:
    server: str
    api: str
    version: str | None
    drafter: str
    target: str
    shape: str
    k: int
    temperature: float
    tolerance: float
    passed: bool
    agree: bool
    """Engine and bench accept within the tolerance, overall and per position."""
    engine: dict[str, Any]
    """acceptance_length, per_position (vLLM; empty for SGLang), source, requests, errors."""
    offline: dict[str, Any]
    """bench accept: acceptance_length, per_position, lossless, predicted_acceptance_length."""
    differences: dict[str, Any]
    """acceptance_length and per_position: engine minus offline."""
    phases: dict[str, dict[str, Any]]
    """Offline acceptance per reasoning phase (a server's counters cannot be split so)."""
    served: dict[str, Any]
    findings: list[dict[str, str]]
    warnings: list[str] = field(default_factory=list)
    depths: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Context-depth bucket -> from, to, engine and offline (rounds, acceptance_length,
    per_position; engine None where the server does not report rounds per request: vLLM's
    --per-request-spec-decode-metrics detailed), difference (engine minus offline)."""
    verify: str | None = None
    """bench accept's verification rule at temperature > 0; None at temperature 0."""
    top_p: float = 1.0
    top_k: int = -1
    interval: dict[str, Any] | None = None
    """Temperature > 0: the range around the offline acceptance length the engine's must
    fall in (low, high, half_width, confidence, offline_rounds, engine_rounds)."""

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

"""The values that pass between gen's parts: requests out, completions back (prompts come in
as `eagle3kit.chat.conversation.Conversation`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class GenRequest:
    """One generation: exact prompt ids and the sampling settings to send."""

    sample_id: str
    prompt_ids: list[int]
    max_tokens: int
    stop_token_ids: list[int]
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int | None = None
    messages: list[dict[str, Any]] | None = None
    """The rendered history, for the openai-chat fallback only (it cannot take ids)."""
    tools: list[dict[str, Any]] | None = None


@dataclass
class Completion:
    """What a server produced for one request, after the invariant checks."""

    output_ids: list[int]
    finish_reason: str
    """stop, length or abort."""
    prompt_tokens: int
    completion_tokens: int
    latency: float
    server: dict[str, Any]
    """url, api, model, and engine version when known."""
    counts: dict[str, int] = field(default_factory=dict)
    """Other counts the server reported (cached_tokens, reasoning_tokens, spec_verify_ct)."""
    violations: list[str] = field(default_factory=list)
    """Invariants of SERVER_APIS.md §4 the response broke (empty when it is sound)."""
    reconstructed: bool = False
    """True when the ids were rebuilt from text (the openai-chat fallback)."""
    spec_steps: list[int] | None = None
    """Accepted drafts of each verification round, in order, where the server reports them
    per request (vLLM's --per-request-spec-decode-metrics detailed): bench's depth buckets."""

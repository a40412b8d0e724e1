"""What every server API shares: the server's description, a parsed answer, and the small
protocol a token-id API (sglang.py, vllm.py) implements for `servers.generate`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from eagle3kit.gen.types import Completion, GenRequest

API_CHOICES = ("auto", "sglang", "vllm", "openai-chat")


def sampling(req: GenRequest) -> dict[str, Any]:
    """The sampling settings every API takes under the same names; each adds its own."""
    return {
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": req.top_k,
        "min_p": req.min_p,
        "stop_token_ids": req.stop_token_ids,
    }


@dataclass
class ServerInfo:
    """What `probe` learned about one server; gen records it with every sample it produced."""

    url: str
    api: str
    """sglang, vllm or openai-chat: never auto."""
    model: str
    """The served model name (`/v1/models` id; SGLang's model_path when that is missing)."""
    max_model_len: int | None
    version: str | None
    speculative: bool | None = None
    """Whether the server runs a speculative algorithm (SGLang's server info); None: unknown."""
    vocab_size: int | None = None
    """Set by the caller from its tokenizer: output ids are checked against [0, vocab_size)."""


@dataclass
class Reply:
    """One generation answer, parsed but not yet checked."""

    output_ids: list[int]
    finish_reason: str | None
    matched: int | str | None = None
    """The stop token id (or stop string) the server reports having matched."""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_ids: list[int] | None = None
    """The prompt ids the server echoed (vLLM), to compare with those sent."""
    rid: str | None = None
    """The request id the server echoed (SGLang meta_info.id)."""
    results: int = 1
    counts: dict[str, int] = field(default_factory=dict)
    has_spec: bool | None = None
    """Whether the answer carried speculative-decoding counters (SGLang only)."""
    spec_steps: list[int] | None = None
    """Accepted drafts of each verification round, in order (vLLM started with
    --per-request-spec-decode-metrics detailed); None when the answer does not say."""


class TokenIdApi(Protocol):
    """A server API that takes prompt ids and answers with output ids (a module implements it:
    eagle3kit/gen/servers/sglang.py, vllm.py)."""

    PATH: str
    """The generation endpoint."""
    ECHOES_RID: bool
    """The answer carries the request id sent (checked as an invariant)."""

    def payload(self, req: GenRequest, info: ServerInfo, rid: str) -> dict[str, Any]: ...

    def headers(self, rid: str) -> dict[str, str] | None: ...

    def parse(self, body: Any, url: str = "") -> Reply: ...

    async def abandon(
        self, client: httpx.AsyncClient, info: ServerInfo, rid: str, api_key: str | None
    ) -> None:
        """Tell the server to drop a request the client stopped waiting for."""


def completion(
    reply: Reply,
    req: GenRequest,
    info: ServerInfo,
    ids: list[int],
    latency: float,
    counts: dict[str, int],
    violations: list[str],
    reconstructed: bool = False,
) -> Completion:
    return Completion(
        output_ids=ids,
        finish_reason=reply.finish_reason or "unknown",
        prompt_tokens=reply.prompt_tokens
        if reply.prompt_tokens is not None
        else len(req.prompt_ids),
        completion_tokens=reply.completion_tokens
        if reply.completion_tokens is not None
        else len(ids),
        latency=latency,
        server={"url": info.url, "api": info.api, "model": info.model, "version": info.version},
        counts=counts,
        violations=violations,
        reconstructed=reconstructed,
        spec_steps=reply.spec_steps,
    )

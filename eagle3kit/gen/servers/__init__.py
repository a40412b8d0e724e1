"""Clients for the inference servers gen and bench talk to: probe a server, send one
generation, check the answer.

One file per API behind a small protocol (`api.TokenIdApi`: sglang.py, vllm.py; the text
fallback in openai_chat.py), the transport (transport.py: httpx over aiohttp, one client per
server), the error classes that tell the scheduler what to do (errors.py), probing
(probe.py) and the invariants checked on every answer (invariants.py). Wire formats, retry
policy and invariants follow `reference/SERVER_APIS.md`.
"""

from __future__ import annotations

import time

import httpx

import eagle3kit.gen.servers.sglang as sglang
import eagle3kit.gen.servers.vllm as vllm
from eagle3kit.gen.servers.api import API_CHOICES, Reply, ServerInfo, TokenIdApi, completion
from eagle3kit.gen.servers.errors import (
    BadAnswer,
    RequestRejected,
    RetryableError,
    ServerError,
    ServerFatal,
)
from eagle3kit.gen.servers.invariants import check_invariants, id_violation, refuse_bad_ids
from eagle3kit.gen.servers.openai_chat import generate as chat_generate
from eagle3kit.gen.servers.probe import PROBE_TIMEOUT_S, health, probe, tokenize
from eagle3kit.gen.servers.transport import (
    SPARE_CONNECTIONS,
    load_json,
    make_client,
    normalize_url,
    post_within,
    raise_for_status,
    request_id,
    scrub,
    sent_key,
)
from eagle3kit.gen.types import Completion, GenRequest

__all__ = [
    "API_CHOICES",
    "PROBE_TIMEOUT_S",
    "SPARE_CONNECTIONS",
    "BadAnswer",
    "Reply",
    "RequestRejected",
    "RetryableError",
    "ServerError",
    "ServerFatal",
    "ServerInfo",
    "chat_generate",
    "check_invariants",
    "generate",
    "health",
    "id_violation",
    "make_client",
    "normalize_url",
    "probe",
    "tokenize",
]

TOKEN_ID_APIS: dict[str, TokenIdApi] = {"sglang": sglang, "vllm": vllm}


async def generate(
    client: httpx.AsyncClient,
    info: ServerInfo,
    req: GenRequest,
    *,
    api_key: str | None = None,
    timeout: float | None = None,
    attempt: int = 0,
) -> Completion:
    """One generation by token ids (SGLang `/generate`, vLLM `/v1/completions`), checked.

    `timeout` bounds the whole exchange (none by default); on expiry the server is told to
    drop the request where it can (SGLang). Raises RetryableError, RequestRejected or
    ServerFatal; a sound or unsound answer alike comes back as a Completion whose
    `violations` list what is wrong."""
    api = TOKEN_ID_APIS.get(info.api)
    if api is None:
        raise ValueError(
            f"generate() speaks sglang and vllm, not {info.api!r}: use chat_generate()"
        )
    rid = request_id(req.sample_id, attempt)
    path = api.PATH

    async def abandon() -> None:
        await api.abandon(client, info, rid, api_key)

    t0 = time.perf_counter()
    resp = await post_within(
        client, info, path, api.payload(req, info, rid), api_key, api.headers(rid), timeout, abandon
    )
    latency = time.perf_counter() - t0
    raise_for_status(resp, info.url)
    body = load_json(resp, info.url)
    try:
        reply = api.parse(body, info.url)
    except ServerError as e:  # an abort message is the server's text: it may quote the key
        e.args = (scrub(str(e), sent_key(resp.request.headers)),)
        raise
    refuse_bad_ids(reply.output_ids, info, path)
    answered_by = body.get("model") if isinstance(body, dict) else None
    if info.api == "vllm" and answered_by is not None and answered_by != info.model:
        raise RetryableError(
            f"POST {info.url}{path}: answered by model {answered_by!r}, not {info.model!r}",
            url=info.url,
            reason="model_changed",
        )
    ids, violations, repaired = check_invariants(reply, req, info, rid if api.ECHOES_RID else None)
    counts = dict(reply.counts)
    if repaired:
        counts["repaired_prefix_ids"] = repaired
    return completion(reply, req, info, ids, latency, counts, violations)

"""The openai-chat fallback: `/v1/chat/completions`, where the server renders and parses and
the ids are rebuilt from the text (marked reconstructed)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from eagle3kit.gen.servers.api import Reply, ServerInfo, completion, sampling
from eagle3kit.gen.servers.errors import RetryableError
from eagle3kit.gen.servers.invariants import check_invariants, refuse_bad_ids
from eagle3kit.gen.servers.transport import (
    json_dict,
    json_int,
    load_json,
    malformed,
    post_within,
    raise_for_status,
    request_id,
)
from eagle3kit.gen.types import Completion, GenRequest

PATH = "/v1/chat/completions"


def payload(
    messages: Sequence[dict[str, Any]],
    req: GenRequest,
    model: str,
    extra_body: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`/v1/chat/completions` with the same sampling settings; extra_body adds e.g.
    chat_template_kwargs."""
    body: dict[str, Any] = {
        "model": model,
        "messages": list(messages),
        "max_tokens": req.max_tokens,
        **sampling(req),
    }
    if req.seed is not None:
        body["seed"] = req.seed
    return {**body, **(extra_body or {})}


async def generate(
    client: httpx.AsyncClient,
    info: ServerInfo,
    messages: Sequence[dict[str, Any]],
    req: GenRequest,
    rebuild: Callable[[str | None, str], list[int]],
    *,
    api_key: str | None = None,
    timeout: float | None = None,
    attempt: int = 0,
    extra_body: dict[str, Any] | None = None,
) -> Completion:
    """The text fallback: the server renders and parses; ids are rebuilt, marked reconstructed.

    The reasoning is read from `reasoning`, else `reasoning_content`; `rebuild(reasoning,
    content)` wraps it in the model's think tokens and tokenizes. When the server stopped on a
    token, that token is appended (its stop_reason, else the first of req.stop_token_ids, which
    gen lists EOS-first). `req.prompt_ids`, when given, are the client's rendering: a server
    that counts a different prompt length is reported as a violation."""
    rid = request_id(req.sample_id, attempt)
    path = PATH
    t0 = time.perf_counter()
    sent = payload(messages, req, info.model, extra_body)
    resp = await post_within(client, info, path, sent, api_key, {"X-Request-Id": rid}, timeout)
    latency = time.perf_counter() - t0
    raise_for_status(resp, info.url)
    body = load_json(resp, info.url)
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise malformed(info.url, path, "no choices")
    choice = choices[0]
    finish = choice.get("finish_reason")
    if finish is not None and not isinstance(finish, str):
        raise malformed(info.url, path, f"finish_reason {finish!r} is not a string")
    if finish in ("error", "abort"):
        raise RetryableError(
            f"POST {info.url}{path}: finish_reason {finish}", url=info.url, reason=finish
        )
    message = choice.get("message") or {}
    reasoning = message.get("reasoning") if isinstance(message, dict) else None
    if reasoning is None and isinstance(message, dict):
        reasoning = message.get("reasoning_content")
    content = (message.get("content") if isinstance(message, dict) else None) or ""
    if not isinstance(content, str) or not isinstance(reasoning, str | None):
        raise malformed(info.url, path, "message content or reasoning is not text")
    ids = list(rebuild(reasoning, content))
    matched = choice.get("stop_reason")
    if finish == "stop" and matched is None and req.stop_token_ids:
        matched = req.stop_token_ids[0]
    if finish == "stop" and type(matched) is int and (not ids or ids[-1] != matched):
        ids.append(matched)
    usage = json_dict(body.get("usage"))
    reply = Reply(
        output_ids=ids,
        finish_reason=finish,
        matched=matched,
        prompt_tokens=json_int(usage.get("prompt_tokens")),
        completion_tokens=json_int(usage.get("completion_tokens")),
        results=len(choices),
    )
    refuse_bad_ids(ids, info, path)
    ids, violations, _ = check_invariants(reply, req, info)
    return completion(reply, req, info, ids, latency, {}, violations, reconstructed=True)

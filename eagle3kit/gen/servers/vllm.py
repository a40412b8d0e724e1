"""vLLM's `/v1/completions` with a token-id prompt and `return_token_ids`, and its answer."""

from __future__ import annotations

from typing import Any

import httpx

from eagle3kit.gen.servers.api import Reply, ServerInfo, sampling
from eagle3kit.gen.servers.errors import RetryableError, ServerFatal
from eagle3kit.gen.servers.transport import json_dict, json_int, malformed
from eagle3kit.gen.types import GenRequest

PATH = "/v1/completions"
ECHOES_RID = False


def payload(req: GenRequest, info: ServerInfo, rid: str) -> dict[str, Any]:
    """vLLM `/v1/completions` with a token-id prompt and return_token_ids."""
    payload: dict[str, Any] = {
        "model": info.model,
        "prompt": req.prompt_ids,
        "max_tokens": req.max_tokens,
        **sampling(req),
        "skip_special_tokens": False,
        "include_stop_str_in_output": True,
        "return_token_ids": True,
    }
    if req.seed is not None:
        payload["seed"] = req.seed
    return payload


def headers(rid: str) -> dict[str, str] | None:
    return {"X-Request-Id": rid}


async def abandon(
    client: httpx.AsyncClient, info: ServerInfo, rid: str, api_key: str | None
) -> None:
    """vLLM drops a request when its connection closes: nothing to send."""


def parse(body: Any, url: str = "") -> Reply:
    """A vLLM `/v1/completions` answer; finish_reason error or abort becomes RetryableError."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise malformed(url, "/v1/completions", "no choices")
    choice = choices[0]
    finish = choice.get("finish_reason")
    if finish is not None and not isinstance(finish, str):
        raise malformed(url, "/v1/completions", f"finish_reason {finish!r} is not a string")
    if finish in ("error", "abort"):
        raise RetryableError(
            f"POST {url}/v1/completions: finish_reason {finish}", url=url, reason=finish
        )
    ids = choice.get("token_ids")
    if ids is None:
        raise ServerFatal(
            f"POST {url}/v1/completions returned no token_ids: the server ignores return_token_ids "
            "(vLLM before 0.10.2?); upgrade it, or use --api openai-chat",
            url=url,
            reason="no_token_ids",
        )
    if not isinstance(ids, list):
        raise malformed(url, "/v1/completions", "token_ids is not a list")
    usage = json_dict(body.get("usage"))
    counts = {}
    for details, key in (
        ("prompt_tokens_details", "cached_tokens"),
        ("completion_tokens_details", "reasoning_tokens"),
    ):
        value = json_dict(usage.get(details)).get(key)
        if type(value) is int:
            counts[key] = value
    return Reply(
        output_ids=ids,
        finish_reason=finish,
        matched=choice.get("stop_reason"),
        prompt_tokens=json_int(usage.get("prompt_tokens")),
        completion_tokens=json_int(usage.get("completion_tokens")),
        prompt_ids=choice.get("prompt_token_ids"),
        results=len(choices),
        counts=counts,
        spec_steps=_spec_steps(body),
    )


def _spec_steps(body: dict) -> list[int] | None:
    """`metrics.speculative_decoding.per_step_accepted` of a server started with
    --per-request-spec-decode-metrics detailed (vLLM 0.32+), when it is a list of counts."""
    spec = json_dict(json_dict(body.get("metrics")).get("speculative_decoding"))
    steps = spec.get("per_step_accepted")
    if isinstance(steps, list) and all(type(s) is int and s >= 0 for s in steps):
        return steps
    return None

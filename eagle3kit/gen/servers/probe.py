"""Probing: tell SGLang from vLLM, read the served model, context length and version;
health checks and the server's own tokenization."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx
import orjson

from eagle3kit.errors import UserError
from eagle3kit.gen.servers.api import API_CHOICES, ServerInfo
from eagle3kit.gen.servers.errors import RetryableError
from eagle3kit.gen.servers.transport import (
    json_int,
    json_str,
    load_json,
    malformed,
    normalize_url,
    raise_for_status,
    send,
)

PROBE_TIMEOUT_S = 30.0
"""Newest SGLang answers /health with a 1-token generation that may take up to 20 s."""


async def probe(
    client: httpx.AsyncClient,
    url: str,
    api: str = "auto",
    api_key: str | None = None,
    *,
    timeout: float = PROBE_TIMEOUT_S,
) -> ServerInfo:
    """Check the server answers, tell SGLang from vLLM (api="auto"), read model, context
    length and version. Any failure is a UserError naming the URL and what failed."""
    if api not in API_CHOICES:
        raise UserError(f"--api must be one of {', '.join(API_CHOICES)}, not {api!r}")
    url = normalize_url(url)
    health = await _probe_get(client, url, "/health", api_key, timeout)
    if health.status_code not in (200, 404):
        raise UserError(
            f"the server at {url} is not ready: GET /health answered HTTP {health.status_code}"
        )
    if api in ("auto", "sglang"):
        info = await _probe_sglang(client, url, api_key, timeout)
        if info is not None:
            return info
        if api == "sglang":
            raise UserError(
                f"the server at {url} does not answer SGLang's /model_info or /get_model_info: "
                "is it an SGLang server? (--api)"
            )
    version = await _probe_json(client, url, ("/version",), api_key, timeout)
    card = _model_card(await _probe_json(client, url, ("/v1/models",), api_key, timeout))
    if api == "vllm" and card.get("owned_by") == "sglang":
        raise UserError(f"the server at {url} is SGLang, not vLLM: use --api sglang or auto")
    if api == "auto" and card.get("owned_by") != "vllm" and version is None:
        raise UserError(
            f"cannot tell which server answers at {url}: neither SGLang's /model_info nor vLLM's "
            "/version answered; pass --api sglang, vllm or openai-chat"
        )
    if not card.get("id"):
        raise UserError(f"the server at {url} lists no model at GET /v1/models")
    return ServerInfo(
        url=url,
        api="vllm" if api == "auto" else api,
        model=str(card["id"]),
        max_model_len=json_int(card.get("max_model_len")),
        version=json_str((version or {}).get("version")),
    )


async def _probe_sglang(
    client: httpx.AsyncClient, url: str, api_key: str | None, timeout: float
) -> ServerInfo | None:
    model_info = await _probe_json(
        client, url, ("/model_info", "/get_model_info"), api_key, timeout
    )
    if model_info is None or "model_path" not in model_info:
        return None
    server = (
        await _probe_json(client, url, ("/server_info", "/get_server_info"), api_key, timeout) or {}
    )
    card = _model_card(await _probe_json(client, url, ("/v1/models",), api_key, timeout))
    return ServerInfo(
        url=url,
        api="sglang",
        model=str(card.get("id") or model_info["model_path"]),
        max_model_len=json_int(card.get("max_model_len")) or json_int(server.get("context_length")),
        version=json_str(server.get("version")),
        speculative=(server["speculative_algorithm"] is not None)
        if "speculative_algorithm" in server
        else None,
    )


async def _probe_get(
    client: httpx.AsyncClient, url: str, path: str, api_key: str | None, timeout: float
) -> httpx.Response:
    try:
        resp = await send(client, "GET", url, path, api_key=api_key, timeout=httpx.Timeout(timeout))
    except RetryableError as e:
        if e.reason == "refused":
            raise UserError(f"no server answers at {url} (--server): connection refused") from None
        text = str(e).split(": ", 1)[-1]
        raise UserError(f"no usable answer from {url} (--server): GET {path}: {text}") from None
    if resp.status_code in (401, 403):
        raise UserError(
            f"the server at {url} refused the API key on GET {path} (HTTP {resp.status_code}): "
            "check --api-key or EAGLE3KIT_API_KEY"
        )
    return resp


async def _probe_json(
    client: httpx.AsyncClient, url: str, paths: Sequence[str], api_key: str | None, timeout: float
) -> dict[str, Any] | None:
    """The first of paths that answers 200 with a JSON object; None when none does."""
    for path in paths:
        resp = await _probe_get(client, url, path, api_key, timeout)
        if resp.status_code != 200:
            continue
        try:
            body = orjson.loads(resp.content)
        except orjson.JSONDecodeError:
            continue
        if isinstance(body, dict):
            return body
    return None


def _model_card(models: dict[str, Any] | None) -> dict[str, Any]:
    data = (models or {}).get("data")
    return data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}


async def health(
    client: httpx.AsyncClient,
    url: str,
    *,
    api_key: str | None = None,
    timeout: float = PROBE_TIMEOUT_S,
) -> bool:
    """True when GET /health answers 200; any failure is False."""
    try:
        resp = await send(
            client, "GET", normalize_url(url), "/health", api_key=api_key, timeout=timeout
        )
    except RetryableError:
        return False
    return resp.status_code == 200


async def tokenize(
    client: httpx.AsyncClient,
    info: ServerInfo,
    text: str,
    *,
    api_key: str | None = None,
    add_special_tokens: bool = False,
) -> list[int] | None:
    """The server's own tokenization of text (for the tokenizer agreement check); None when
    the server has no /tokenize. Other failures raise like `generate`."""
    payload: dict[str, Any] = {"prompt": text, "add_special_tokens": add_special_tokens}
    if info.api != "sglang":
        payload["model"] = info.model
    resp = await send(
        client,
        "POST",
        info.url,
        "/tokenize",
        payload=payload,
        api_key=api_key,
        timeout=PROBE_TIMEOUT_S,
    )
    if resp.status_code in (404, 405, 501):
        return None
    raise_for_status(resp, info.url)
    body = load_json(resp, info.url)
    tokens = body.get("tokens") if isinstance(body, dict) else None
    if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
        raise malformed(info.url, "/tokenize", "no list of token ids under 'tokens'")
    return tokens

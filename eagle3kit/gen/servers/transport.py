"""The transport: one `httpx.AsyncClient` per server over the aiohttp transport (as
DESIGN.md decides), one exchange with transport failures and HTTP statuses turned into the
error classes of errors.py, and the API key kept out of every message (it travels only in
the `Authorization` header)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import httpx
import orjson
from httpx_aiohttp import AiohttpTransport

from eagle3kit._urls import bearer_header
from eagle3kit.gen.servers.api import ServerInfo
from eagle3kit.gen.servers.errors import (
    RequestRejected,
    RetryableError,
    ServerFatal,
    rejection_reason,
)

KEEPALIVE_EXPIRY_S = 4.0
"""Idle connections are dropped before both servers' own 5 s keep-alive close can race a send."""


SPARE_CONNECTIONS = 4
"""Beyond the generation slots, so /health, /abort_request and probes never wait for the pool."""


RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})


_TRANSPORT_TEXT = {
    "refused": "connection refused",
    "connect": "cannot connect",
    "reset": "connection reset",
    "timeout": "no answer in time",
}


_CONNECT_TIMEOUT = getattr(aiohttp, "ConnectionTimeoutError", ())


def make_client(
    concurrency: int, connect_timeout: float = 10.0, api_key: str | None = None
) -> httpx.AsyncClient:
    """One client per server: httpx over aiohttp, pool sized to concurrency, no read timeout.

    With `api_key`, every request carries `Authorization: Bearer`. Close it with `aclose()`.
    """
    limits = httpx.Limits(
        max_connections=concurrency + SPARE_CONNECTIONS,
        max_keepalive_connections=concurrency + SPARE_CONNECTIONS,
        keepalive_expiry=KEEPALIVE_EXPIRY_S,
    )
    return httpx.AsyncClient(
        transport=AiohttpTransport(limits=limits),
        timeout=httpx.Timeout(None, connect=connect_timeout),
        headers=bearer_header(api_key),
    )


def normalize_url(url: str) -> str:
    """`host:port`, `http://host:port/` and `http://host:port/v1` all become `http://host:port`."""
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return url[:-3] if url.endswith("/v1") else url


def request_id(sample_id: str, attempt: int) -> str:
    """A fresh id per attempt, unique even across reruns: `{sample_id}-a{attempt}-{random}`."""
    return f"{sample_id}-a{attempt}-{secrets.token_hex(4)}"


def scrub(text: str, api_key: str | None) -> str:
    return text.replace(api_key, "***") if api_key else text


def sent_key(headers: httpx.Headers | dict[str, str]) -> str | None:
    """The bearer token a request carried, whether from the client or the call."""
    auth = headers.get("Authorization") or headers.get("authorization") or ""
    if not auth.startswith("Bearer "):
        return None
    return auth[len("Bearer ") :].strip() or None


async def send(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    path: str,
    *,
    payload: Any = None,
    api_key: str | None = None,
    headers: dict[str, str] | None = None,
    timeout: float | httpx.Timeout | None = None,
) -> httpx.Response:
    """One request; a transport failure becomes RetryableError with reason refused, connect,
    reset or timeout."""
    h = {**bearer_header(api_key), **(headers or {})}
    content = None
    if payload is not None:
        content = orjson.dumps(payload)
        h["Content-Type"] = "application/json"
    try:
        return await client.request(
            method,
            url + path,
            content=content,
            headers=h,
            timeout=httpx.USE_CLIENT_DEFAULT if timeout is None else timeout,
        )
    except (httpx.TransportError, aiohttp.ClientError, OSError) as e:
        reason, detail = _transport_reason(e)
        secret = api_key or sent_key(client.headers)
        text = _TRANSPORT_TEXT[reason] + (f" ({scrub(detail, secret)})" if detail else "")
        raise RetryableError(f"{method} {url}{path}: {text}", url=url, reason=reason) from e


def _transport_reason(exc: BaseException) -> tuple[str, str]:
    """(reason, detail). httpx-aiohttp maps refused and reset alike to httpx.ConnectTimeout,
    so the aiohttp cause decides."""
    chain: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    for e in chain:
        if isinstance(e, aiohttp.ClientConnectorError):
            refused = isinstance(e.os_error, ConnectionRefusedError)
            return ("refused", "") if refused else ("connect", str(e.os_error))
        if isinstance(e, ConnectionRefusedError):
            return "refused", ""
        if isinstance(e, _CONNECT_TIMEOUT):
            return "connect", "connect timeout"
        if isinstance(e, (aiohttp.ServerTimeoutError, asyncio.TimeoutError)):
            return "timeout", ""
        if isinstance(e, (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError)):
            return "reset", type(e).__name__
        if isinstance(e, (aiohttp.ClientOSError, ConnectionError)):
            return "reset", str(e)
    if isinstance(exc, httpx.ConnectError):
        return "connect", str(exc)
    if isinstance(exc, httpx.TimeoutException):
        return ("connect" if isinstance(exc, httpx.ConnectTimeout) else "timeout"), ""
    return "reset", type(exc).__name__


def raise_for_status(resp: httpx.Response, url: str) -> None:
    """Classify an HTTP error status: 5xx/429 retryable, 401/403/404/405 fatal, 4xx rejected."""
    status = resp.status_code
    if status < 400:
        return
    where = f"{resp.request.method} {resp.request.url}"
    detail = scrub(_error_text(resp), sent_key(resp.request.headers))
    if status in RETRY_STATUSES or (status >= 500 and status != 501):
        raise RetryableError(
            f"{where}: HTTP {status}: {detail}", url=url, reason=f"http_{status}", status=status
        )
    if status in (401, 403):
        msg = (
            f"{where}: HTTP {status}: the server refused the API key (--api-key, EAGLE3KIT_API_KEY)"
        )
        raise ServerFatal(msg, url=url, reason="auth", status=status)
    if status in (404, 405, 501):
        msg = f"{where}: HTTP {status}: wrong model name or endpoint (check --api): {detail}"
        raise ServerFatal(msg, url=url, reason="not_found", status=status)
    reason = rejection_reason(detail)
    raise RequestRejected(
        f"{where}: HTTP {status}: {detail}", url=url, reason=reason, status=status
    )


def _error_text(resp: httpx.Response, limit: int = 500) -> str:
    """The message of an error body in SGLang's, vLLM's (flat or nested) or FastAPI's shape."""
    try:
        body = orjson.loads(resp.content)
    except orjson.JSONDecodeError:
        return resp.text[:limit] or resp.reason_phrase
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):
            body = err
        elif isinstance(err, str):
            return err[:limit]
        for key in ("message", "detail"):
            if body.get(key):
                return str(body[key])[:limit]
    return str(body)[:limit]


def load_json(resp: httpx.Response, url: str) -> Any:
    try:
        return orjson.loads(resp.content)
    except orjson.JSONDecodeError:
        where = f"{resp.request.method} {resp.request.url}"
        raise RetryableError(f"{where}: answer is not JSON", url=url, reason="malformed") from None


def malformed(url: str, path: str, what: str) -> RetryableError:
    return RetryableError(
        f"POST {url}{path}: malformed answer: {what}", url=url, reason="malformed"
    )


async def post_within(
    client: httpx.AsyncClient,
    info: ServerInfo,
    path: str,
    payload: dict[str, Any],
    api_key: str | None,
    headers: dict[str, str] | None,
    timeout: float | None,
    abandon: Callable[[], Awaitable[None]] | None = None,
) -> httpx.Response:
    """POST within `timeout` seconds (none: no limit); on expiry `abandon()` tells the server."""
    sent = send(client, "POST", info.url, path, payload=payload, api_key=api_key, headers=headers)
    try:
        return await asyncio.wait_for(sent, timeout)
    except asyncio.TimeoutError:
        if abandon is not None:
            await abandon()
        msg = f"POST {info.url}{path}: no answer within {timeout:g} s (--request-timeout)"
        raise RetryableError(msg, url=info.url, reason="timeout") from None


def json_dict(value: Any) -> dict[str, Any]:
    """A JSON object from a server's answer, or {} for anything else (it may send null)."""
    return value if isinstance(value, dict) else {}


def json_int(value: Any) -> int | None:
    return value if type(value) is int else None


def json_str(value: Any) -> str | None:
    return None if value is None else str(value)

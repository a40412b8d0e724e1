"""HTTP clients for SGLang and vLLM: probe a server, send one generation, check the answer.

Plain functions over one `httpx.AsyncClient` per server, built by `make_client` (httpx's API
over the aiohttp transport, as DESIGN.md decides). Wire formats, retry policy and the
invariants checked on every answer follow `reference/SERVER_APIS.md`. The three error classes
tell the scheduler what to do: retry with a fresh attempt (`RetryableError`), record the
sample as rejected (`RequestRejected`), or stop using that server (`ServerFatal`). The API key
travels only in the `Authorization` header and is scrubbed from every message made here.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx
import orjson
from httpx_aiohttp import AiohttpTransport

from eagle3kit.errors import UserError
from eagle3kit.gen.types import Completion, GenRequest

API_CHOICES = ("auto", "sglang", "vllm", "openai-chat")
KEEPALIVE_EXPIRY_S = 4.0
"""Idle connections are dropped before both servers' own 5 s keep-alive close can race a send."""
SPARE_CONNECTIONS = 4
"""Beyond the generation slots, so /health, /abort_request and probes never wait for the pool."""
PROBE_TIMEOUT_S = 30.0
"""Newest SGLang answers /health with a 1-token generation that may take up to 20 s."""
ABORT_TIMEOUT_S = 5.0
RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
_CONTEXT_RE = re.compile(
    r"context length|maximum model length|max_model_len|too large|longer than|too long", re.I
)
_TRANSPORT_TEXT = {
    "refused": "connection refused",
    "connect": "cannot connect",
    "reset": "connection reset",
    "timeout": "no answer in time",
}
_CONNECT_TIMEOUT = getattr(aiohttp, "ConnectionTimeoutError", ())


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


class ServerError(Exception):
    """A failed exchange with one server. `reason` is a short tag for counting and logs."""

    def __init__(self, message: str, *, url: str, reason: str, status: int | None = None):
        super().__init__(message)
        self.url = url
        self.reason = reason
        self.status = status


class RetryableError(ServerError):
    """Transient: connect errors, resets, timeouts, 429 and 5xx, server-side aborts. Retry it."""


class RequestRejected(ServerError):
    """The server refused this request (400: `reason` context_length or bad_request). Never
    retried: record the sample with the reason."""


class BadAnswer(RetryableError):
    """An answer whose output ids cannot be stored (not integers, negative, past int32 or the
    vocabulary): a violation that is counted and retried, never written as data."""

    def __init__(self, message: str, *, url: str, violations: list[str]):
        super().__init__(message, url=url, reason="bad_ids")
        self.violations = violations


class ServerFatal(ServerError):
    """The server cannot serve this run (wrong model name or endpoint, API key refused, no
    token ids): stop sending to it. The message names the URL."""


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


# Clients and URLs -------------------------------------------------------------------------
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
        headers=_auth(api_key),
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


def _auth(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _scrub(text: str, api_key: str | None) -> str:
    return text.replace(api_key, "***") if api_key else text


def _sent_key(headers: httpx.Headers | dict[str, str]) -> str | None:
    """The bearer token a request carried, whether from the client or the call."""
    auth = headers.get("Authorization") or headers.get("authorization") or ""
    if not auth.startswith("Bearer "):
        return None
    return auth[len("Bearer ") :].strip() or None


# One exchange -----------------------------------------------------------------------------
async def _send(
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
    h = {**_auth(api_key), **(headers or {})}
    content = None
    if payload is not None:
        content = orjson.dumps(payload)
        h["Content-Type"] = "application/json"
    extra = {} if timeout is None else {"timeout": timeout}
    try:
        return await client.request(method, url + path, content=content, headers=h, **extra)
    except (httpx.TransportError, aiohttp.ClientError, OSError) as e:
        reason, detail = _transport_reason(e)
        secret = api_key or _sent_key(client.headers)
        text = _TRANSPORT_TEXT[reason] + (f" ({_scrub(detail, secret)})" if detail else "")
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


def _raise_for_status(resp: httpx.Response, url: str) -> None:
    """Classify an HTTP error status: 5xx/429 retryable, 401/403/404/405 fatal, 4xx rejected."""
    status = resp.status_code
    if status < 400:
        return
    where = f"{resp.request.method} {resp.request.url}"
    detail = _scrub(_error_text(resp), _sent_key(resp.request.headers))
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
    reason = "context_length" if _CONTEXT_RE.search(detail) else "bad_request"
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


def _load(resp: httpx.Response, url: str) -> Any:
    try:
        return orjson.loads(resp.content)
    except orjson.JSONDecodeError:
        where = f"{resp.request.method} {resp.request.url}"
        raise RetryableError(f"{where}: answer is not JSON", url=url, reason="malformed") from None


def _malformed(url: str, path: str, what: str) -> RetryableError:
    return RetryableError(
        f"POST {url}{path}: malformed answer: {what}", url=url, reason="malformed"
    )


# Probing ----------------------------------------------------------------------------------
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
        max_model_len=_int(card.get("max_model_len")),
        version=_str((version or {}).get("version")),
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
        max_model_len=_int(card.get("max_model_len")) or _int(server.get("context_length")),
        version=_str(server.get("version")),
        speculative=(server["speculative_algorithm"] is not None)
        if "speculative_algorithm" in server
        else None,
    )


async def _probe_get(
    client: httpx.AsyncClient, url: str, path: str, api_key: str | None, timeout: float
) -> httpx.Response:
    try:
        resp = await _send(
            client, "GET", url, path, api_key=api_key, timeout=httpx.Timeout(timeout)
        )
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


def _dict(value: Any) -> dict[str, Any]:
    """A JSON object from a server's answer, or {} for anything else (it may send null)."""
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int | None:
    return value if type(value) is int else None


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


async def health(
    client: httpx.AsyncClient,
    url: str,
    *,
    api_key: str | None = None,
    timeout: float = PROBE_TIMEOUT_S,
) -> bool:
    """True when GET /health answers 200; any failure is False."""
    try:
        resp = await _send(
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
    resp = await _send(
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
    _raise_for_status(resp, info.url)
    body = _load(resp, info.url)
    tokens = body.get("tokens") if isinstance(body, dict) else None
    if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
        raise _malformed(info.url, "/tokenize", "no list of token ids under 'tokens'")
    return tokens


async def abort_request(
    client: httpx.AsyncClient, info: ServerInfo, rid: str, *, api_key: str | None = None
) -> bool:
    """Ask SGLang to drop a request the client gave up on; best effort, True when accepted."""
    try:
        resp = await _send(
            client,
            "POST",
            info.url,
            "/abort_request",
            payload={"rid": rid},
            api_key=api_key,
            timeout=ABORT_TIMEOUT_S,
        )
    except RetryableError:
        return False
    return resp.status_code == 200


# Generation -------------------------------------------------------------------------------
def sglang_payload(req: GenRequest, rid: str) -> dict[str, Any]:
    """SGLang `/generate` with input_ids: every sampling knob sent, text flags off."""
    sp: dict[str, Any] = {
        "max_new_tokens": req.max_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": req.top_k,
        "min_p": req.min_p,
        "stop_token_ids": req.stop_token_ids,
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
        "no_stop_trim": True,
    }
    if req.seed is not None:
        sp["sampling_seed"] = req.seed
    return {"rid": rid, "input_ids": req.prompt_ids, "sampling_params": sp, "stream": False}


def vllm_payload(req: GenRequest, model: str) -> dict[str, Any]:
    """vLLM `/v1/completions` with a token-id prompt and return_token_ids."""
    payload: dict[str, Any] = {
        "model": model,
        "prompt": req.prompt_ids,
        "max_tokens": req.max_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": req.top_k,
        "min_p": req.min_p,
        "stop_token_ids": req.stop_token_ids,
        "skip_special_tokens": False,
        "include_stop_str_in_output": True,
        "return_token_ids": True,
    }
    if req.seed is not None:
        payload["seed"] = req.seed
    return payload


def parse_sglang(body: Any, url: str = "") -> Reply:
    """An SGLang `/generate` answer; an abort becomes RetryableError (or RequestRejected on 400)."""
    results = body if isinstance(body, list) else [body]
    first = results[0] if results else None
    if not isinstance(first, dict) or not isinstance(first.get("meta_info"), dict):
        raise _malformed(url, "/generate", "no meta_info")
    meta = first["meta_info"]
    reason = meta.get("finish_reason")
    finish = reason.get("type") if isinstance(reason, dict) else reason
    if finish is not None and not isinstance(finish, str):
        raise _malformed(url, "/generate", f"finish_reason {finish!r} is not a string")
    if finish == "abort":
        _raise_abort(reason if isinstance(reason, dict) else {}, url)
    ids = first.get("output_ids")
    if not isinstance(ids, list):
        raise _malformed(url, "/generate", "no output_ids")
    core = {"id", "prompt_tokens", "completion_tokens"}
    return Reply(
        output_ids=ids,
        finish_reason=finish,
        matched=reason.get("matched") if isinstance(reason, dict) else None,
        prompt_tokens=_int(meta.get("prompt_tokens")),
        completion_tokens=_int(meta.get("completion_tokens")),
        rid=meta.get("id"),
        results=len(results),
        counts={k: v for k, v in meta.items() if type(v) is int and k not in core},
        has_spec=any(k.startswith("spec_") for k in meta),
    )


def _raise_abort(reason: dict[str, Any], url: str) -> None:
    status = reason.get("status_code")
    message = f"POST {url}/generate: aborted by the server ({status}): {reason.get('message')}"
    if status == 400:
        kind = "context_length" if _CONTEXT_RE.search(str(reason.get("message"))) else "bad_request"
        raise RequestRejected(message, url=url, reason=kind, status=400)
    raise RetryableError(message, url=url, reason="abort", status=_int(status))


def parse_vllm(body: Any, url: str = "") -> Reply:
    """A vLLM `/v1/completions` answer; finish_reason error or abort becomes RetryableError."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise _malformed(url, "/v1/completions", "no choices")
    choice = choices[0]
    finish = choice.get("finish_reason")
    if finish is not None and not isinstance(finish, str):
        raise _malformed(url, "/v1/completions", f"finish_reason {finish!r} is not a string")
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
        raise _malformed(url, "/v1/completions", "token_ids is not a list")
    usage = _dict(body.get("usage"))
    counts = {}
    for details, key in (
        ("prompt_tokens_details", "cached_tokens"),
        ("completion_tokens_details", "reasoning_tokens"),
    ):
        value = _dict(usage.get(details)).get(key)
        if type(value) is int:
            counts[key] = value
    return Reply(
        output_ids=ids,
        finish_reason=finish,
        matched=choice.get("stop_reason"),
        prompt_tokens=_int(usage.get("prompt_tokens")),
        completion_tokens=_int(usage.get("completion_tokens")),
        prompt_ids=choice.get("prompt_token_ids"),
        results=len(choices),
        counts=counts,
    )


def check_invariants(
    reply: Reply, req: GenRequest, info: ServerInfo, rid: str | None = None
) -> tuple[list[int], list[str], int]:
    """SERVER_APIS.md §4 on one answer: (output ids, violations, prompt ids repaired away).

    SGLang's prompt-prefix bug is repaired: output ids longer than completion_tokens whose
    excess prefix equals the tail of the prompt lose that prefix; any other excess is a
    violation."""
    v: list[str] = []
    ids = reply.output_ids
    if reply.results != 1:
        v.append(f"{reply.results} results for one request")
    if rid is not None and reply.rid != rid:
        v.append(f"answer id {reply.rid!r} is not the rid sent {rid!r}")
    if set(map(type, ids)) - {int}:  # C-level passes: this runs on every answer
        return ids, [*v, "output ids are not all integers"], 0
    repaired = 0
    ct = reply.completion_tokens
    if ct is None:
        v.append("no completion_tokens reported")
    elif info.api == "sglang" and len(ids) > ct:
        excess = len(ids) - ct
        if ids[:excess] == req.prompt_ids[-excess:]:
            ids, repaired = ids[excess:], excess
        else:
            v.append(
                f"{len(ids)} output ids but completion_tokens = {ct}, "
                "and the excess is not the prompt's tail"
            )
    elif len(ids) != ct:
        v.append(f"{len(ids)} output ids but completion_tokens = {ct}")
    if info.api == "vllm" and reply.prompt_ids is None:
        v.append("no prompt_token_ids echoed")
    elif reply.prompt_ids is not None and reply.prompt_ids != req.prompt_ids:
        v.append("echoed prompt_token_ids differ from the ids sent")
    if (
        reply.prompt_tokens is not None
        and req.prompt_ids
        and reply.prompt_tokens != len(req.prompt_ids)
    ):
        v.append(
            f"prompt_tokens = {reply.prompt_tokens} but {len(req.prompt_ids)} prompt ids were sent"
        )
    if (problem := id_violation(ids, info.vocab_size)) is not None:
        v.append(problem)
    v.extend(_finish_violations(reply, req, info, ids))
    if (
        info.speculative is not None
        and reply.has_spec is not None
        and info.speculative != reply.has_spec
    ):
        v.append(
            "spec_* counters present"
            if reply.has_spec
            else "no spec_* counters from a speculative server"
        )
    return ids, v, repaired


INT32_END = 1 << 31


def id_violation(ids: list[Any], vocab_size: int | None) -> str | None:
    """Why these output ids cannot be stored as data, or None: every one must be an int in
    [0, vocab_size) (in int32 when the vocabulary is unknown)."""
    if set(map(type, ids)) - {int}:
        odd = next(t for t in ids if type(t) is not int)
        return f"output ids are not all integers (e.g. {odd!r})"
    top = INT32_END if vocab_size is None else min(vocab_size, INT32_END)
    if ids and (min(ids) < 0 or max(ids) >= top):
        bad = [t for t in ids if t < 0 or t >= top]
        return f"{len(bad)} output ids outside [0, {top}), e.g. {bad[0]}"
    return None


def _refuse_bad_ids(ids: list[Any], info: ServerInfo, path: str) -> None:
    problem = id_violation(ids, info.vocab_size)
    if problem is not None:
        raise BadAnswer(f"POST {info.url}{path}: {problem}", url=info.url, violations=[problem])


def _finish_violations(
    reply: Reply, req: GenRequest, info: ServerInfo, ids: list[int]
) -> list[str]:
    finish, matched = reply.finish_reason, reply.matched
    last = ids[-1] if ids else None
    if finish is None:
        return ["no finish_reason"]
    if finish == "stop":
        if isinstance(matched, str):
            return [f"stopped on the string {matched!r}, but only stop token ids were sent"]
        if type(matched) is int and last != matched:
            return [f"finish stop on {matched} but the last output id is {last}"]
        if req.stop_token_ids and last not in req.stop_token_ids:
            return [f"finish stop on {last}, which is not among the stop_token_ids sent"]
    if finish == "length":
        at_context = (
            info.max_model_len is not None and len(req.prompt_ids) + len(ids) == info.max_model_len
        )
        if len(ids) != req.max_tokens and not at_context:
            return [
                f"finish length after {len(ids)} ids: "
                f"neither max_tokens ({req.max_tokens}) nor the context length"
            ]
    return []


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

    `timeout` bounds the whole exchange (none by default); on expiry SGLang is told to abort
    the request. Raises RetryableError, RequestRejected or ServerFatal; a sound or unsound
    answer alike comes back as a Completion whose `violations` list what is wrong."""
    rid = request_id(req.sample_id, attempt)
    if info.api == "sglang":
        path, payload, headers = "/generate", sglang_payload(req, rid), None
    elif info.api == "vllm":
        path, payload, headers = (
            "/v1/completions",
            vllm_payload(req, info.model),
            {"X-Request-Id": rid},
        )
    else:
        raise ValueError(
            f"generate() speaks sglang and vllm, not {info.api!r}: use chat_generate()"
        )
    t0 = time.perf_counter()
    resp = await _post_within(client, info, path, payload, api_key, headers, timeout, rid)
    latency = time.perf_counter() - t0
    _raise_for_status(resp, info.url)
    body = _load(resp, info.url)
    try:
        reply = parse_sglang(body, info.url) if info.api == "sglang" else parse_vllm(body, info.url)
    except ServerError as e:  # an abort message is the server's text: it may quote the key
        e.args = (_scrub(str(e), _sent_key(resp.request.headers)),)
        raise
    _refuse_bad_ids(reply.output_ids, info, path)
    answered_by = body.get("model") if isinstance(body, dict) else None
    if info.api == "vllm" and answered_by is not None and answered_by != info.model:
        raise RetryableError(
            f"POST {info.url}{path}: answered by model {answered_by!r}, not {info.model!r}",
            url=info.url, reason="model_changed")
    ids, violations, repaired = check_invariants(
        reply, req, info, rid if info.api == "sglang" else None
    )
    counts = dict(reply.counts)
    if repaired:
        counts["repaired_prefix_ids"] = repaired
    return _completion(reply, req, info, ids, latency, counts, violations)


async def _post_within(
    client: httpx.AsyncClient,
    info: ServerInfo,
    path: str,
    payload: dict[str, Any],
    api_key: str | None,
    headers: dict[str, str] | None,
    timeout: float | None,
    rid: str,
) -> httpx.Response:
    send = _send(client, "POST", info.url, path, payload=payload, api_key=api_key, headers=headers)
    try:
        return await asyncio.wait_for(send, timeout)
    except asyncio.TimeoutError:
        if info.api == "sglang":
            await abort_request(client, info, rid, api_key=api_key)
        msg = f"POST {info.url}{path}: no answer within {timeout:g} s (--request-timeout)"
        raise RetryableError(msg, url=info.url, reason="timeout") from None


def _completion(
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
    )


# The openai-chat fallback -----------------------------------------------------------------
def chat_payload(
    messages: Sequence[dict[str, Any]],
    req: GenRequest,
    model: str,
    extra_body: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`/v1/chat/completions` with the same sampling settings; extra_body adds e.g.
    chat_template_kwargs."""
    payload: dict[str, Any] = {
        "model": model,
        "messages": list(messages),
        "max_tokens": req.max_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": req.top_k,
        "min_p": req.min_p,
        "stop_token_ids": req.stop_token_ids,
    }
    if req.seed is not None:
        payload["seed"] = req.seed
    return {**payload, **(extra_body or {})}


async def chat_generate(
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
    path = "/v1/chat/completions"
    t0 = time.perf_counter()
    payload = chat_payload(messages, req, info.model, extra_body)
    resp = await _post_within(
        client, info, path, payload, api_key, {"X-Request-Id": rid}, timeout, rid
    )
    latency = time.perf_counter() - t0
    _raise_for_status(resp, info.url)
    body = _load(resp, info.url)
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise _malformed(info.url, path, "no choices")
    choice = choices[0]
    finish = choice.get("finish_reason")
    if finish is not None and not isinstance(finish, str):
        raise _malformed(info.url, path, f"finish_reason {finish!r} is not a string")
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
        raise _malformed(info.url, path, "message content or reasoning is not text")
    ids = list(rebuild(reasoning, content))
    matched = choice.get("stop_reason")
    if finish == "stop" and matched is None and req.stop_token_ids:
        matched = req.stop_token_ids[0]
    if finish == "stop" and type(matched) is int and (not ids or ids[-1] != matched):
        ids.append(matched)
    usage = _dict(body.get("usage"))
    reply = Reply(
        output_ids=ids,
        finish_reason=finish,
        matched=matched,
        prompt_tokens=_int(usage.get("prompt_tokens")),
        completion_tokens=_int(usage.get("completion_tokens")),
        results=len(choices),
    )
    _refuse_bad_ids(ids, info, path)
    ids, violations, _ = check_invariants(reply, req, info)
    return _completion(reply, req, info, ids, latency, {}, violations, reconstructed=True)

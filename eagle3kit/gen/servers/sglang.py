"""SGLang's native API: `/generate` with input_ids, its answer, and `/abort_request`."""

from __future__ import annotations

from typing import Any

import httpx

from eagle3kit.gen.servers.api import Reply, ServerInfo, sampling
from eagle3kit.gen.servers.errors import RequestRejected, RetryableError, rejection_reason
from eagle3kit.gen.servers.transport import json_int, malformed, send
from eagle3kit.gen.types import GenRequest

PATH = "/generate"
ECHOES_RID = True
ABORT_TIMEOUT_S = 5.0


def payload(req: GenRequest, info: ServerInfo, rid: str) -> dict[str, Any]:
    """SGLang `/generate` with input_ids: every sampling knob sent, text flags off."""
    sp: dict[str, Any] = {
        "max_new_tokens": req.max_tokens,
        **sampling(req),
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
        "no_stop_trim": True,
    }
    if req.seed is not None:
        sp["sampling_seed"] = req.seed
    return {"rid": rid, "input_ids": req.prompt_ids, "sampling_params": sp, "stream": False}


def headers(rid: str) -> dict[str, str] | None:
    return None  # the rid travels in the payload


async def abandon(
    client: httpx.AsyncClient, info: ServerInfo, rid: str, api_key: str | None
) -> None:
    await abort_request(client, info, rid, api_key=api_key)


def parse(body: Any, url: str = "") -> Reply:
    """An SGLang `/generate` answer; an abort becomes RetryableError (or RequestRejected on 400)."""
    results = body if isinstance(body, list) else [body]
    first = results[0] if results else None
    if not isinstance(first, dict) or not isinstance(first.get("meta_info"), dict):
        raise malformed(url, "/generate", "no meta_info")
    meta = first["meta_info"]
    reason = meta.get("finish_reason")
    finish = reason.get("type") if isinstance(reason, dict) else reason
    if finish is not None and not isinstance(finish, str):
        raise malformed(url, "/generate", f"finish_reason {finish!r} is not a string")
    if finish == "abort":
        _raise_abort(reason if isinstance(reason, dict) else {}, url)
    ids = first.get("output_ids")
    if not isinstance(ids, list):
        raise malformed(url, "/generate", "no output_ids")
    core = {"id", "prompt_tokens", "completion_tokens"}
    return Reply(
        output_ids=ids,
        finish_reason=finish,
        matched=reason.get("matched") if isinstance(reason, dict) else None,
        prompt_tokens=json_int(meta.get("prompt_tokens")),
        completion_tokens=json_int(meta.get("completion_tokens")),
        rid=meta.get("id"),
        results=len(results),
        counts={k: v for k, v in meta.items() if type(v) is int and k not in core},
        has_spec=any(k.startswith("spec_") for k in meta),
    )


def _raise_abort(reason: dict[str, Any], url: str) -> None:
    status = reason.get("status_code")
    message = f"POST {url}/generate: aborted by the server ({status}): {reason.get('message')}"
    if status == 400:
        kind = rejection_reason(str(reason.get("message")))
        raise RequestRejected(message, url=url, reason=kind, status=400)
    raise RetryableError(message, url=url, reason="abort", status=json_int(status))


async def abort_request(
    client: httpx.AsyncClient, info: ServerInfo, rid: str, *, api_key: str | None = None
) -> bool:
    """Ask SGLang to drop a request the client gave up on; best effort, True when accepted."""
    try:
        resp = await send(
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

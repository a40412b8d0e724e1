"""What a speculating server says it serves, for `bench parity`'s diagnosis: SGLang's
/server_info, vLLM's /v1/models and /server_info (with VLLM_SERVER_DEV_MODE=1), and vLLM's
/tokenize for the template check. A server that says nothing leaves the field None; nothing
here fails the gate by itself (eagle3kit.bench.diagnose judges what was found)."""

from __future__ import annotations

from typing import Any

import eagle3kit.bench.diagnose as diagnose
from eagle3kit._urls import bearer_header


def _get_json(client: Any, url: str, api_key: str | None) -> Any:
    try:
        resp = client.get(url, headers=bearer_header(api_key))
    except Exception:  # transport errors: the measurement already talked to it
        return None
    if resp.status_code != 200:
        return None
    try:
        return resp.json()
    except ValueError:
        return None


def inspect_server(
    url: str,
    api_key: str | None,
    api: str,
    first_messages: list[dict] | None,
    speculative_config: dict[str, Any] | None = None,
) -> diagnose.Served:
    """What the server at `url` says it serves (drafter, method, k, verification, its
    template's ids for `first_messages` on vLLM); `speculative_config` (--speculative-config)
    where it says nothing."""
    import httpx

    served = diagnose.Served(api=api)
    with httpx.Client(timeout=30.0) as client:
        if api == "sglang":
            _sglang_served(served, client, url, api_key)
        else:
            _vllm_served(served, client, url, api_key, first_messages)
    if served.source is None and speculative_config:
        _from_speculative_config(served, speculative_config, "--speculative-config")
    return served


def _sglang_served(served: diagnose.Served, client: Any, url: str, api_key: str | None) -> None:
    info = None
    for path in ("/server_info", "/get_server_info"):
        info = _get_json(client, url + path, api_key)
        if isinstance(info, dict):
            break
    if not isinstance(info, dict):
        return
    served.model = info.get("model_path")
    served.context_length = _int(info.get("context_length"))
    if info.get("speculative_algorithm"):
        served.method = str(info["speculative_algorithm"]).lower()
        served.drafter = info.get("speculative_draft_model_path")
        served.k = _int(info.get("speculative_num_steps"))
        served.source = "SGLang /server_info"
        served.verify = "sglang"
        served.thresholds = (
            _float(info.get("speculative_accept_threshold_single")),
            _float(info.get("speculative_accept_threshold_acc")),
        )


def _vllm_served(
    served: diagnose.Served,
    client: Any,
    url: str,
    api_key: str | None,
    first_messages: list[dict] | None,
) -> None:
    models = _get_json(client, url + "/v1/models", api_key)
    cards = models.get("data") if isinstance(models, dict) else None
    card = cards[0] if isinstance(cards, list) and cards and isinstance(cards[0], dict) else {}
    served.model = card.get("root") or card.get("id")
    served.context_length = _int(card.get("max_model_len"))
    dev = _get_json(client, url + "/server_info?config_format=json", api_key)
    vllm_config = dev.get("vllm_config") if isinstance(dev, dict) else None
    spec = vllm_config.get("speculative_config") if isinstance(vllm_config, dict) else None
    if isinstance(spec, dict):
        _from_speculative_config(served, spec, "vLLM /server_info")
    if first_messages is not None:
        body = {"messages": first_messages, "add_generation_prompt": True}
        if served.model:
            body["model"] = card.get("id") or served.model
        try:
            resp = client.post(url + "/tokenize", json=body, headers=bearer_header(api_key))
            tokens = resp.json().get("tokens") if resp.status_code == 200 else None
        except Exception:  # an older server without /tokenize: the template goes unchecked
            tokens = None
        if isinstance(tokens, list):
            served.template_ids = [int(t) for t in tokens]


def _from_speculative_config(served: diagnose.Served, spec: dict[str, Any], source: str) -> None:
    if spec.get("method") is not None:
        served.method = str(spec["method"]).lower()
    if spec.get("model") is not None:
        served.drafter = str(spec["model"])
    served.k = _int(spec.get("num_speculative_tokens")) or served.k
    served.source = source
    # vLLM's defaults where the JSON leaves them out (vllm/config/speculative.py)
    method = spec.get("draft_sample_method", "greedy")
    rejection = spec.get("rejection_sample_method", "standard")
    served.verify = VLLM_RULES.get(str(method)) if rejection == "standard" else None
    if rejection != "standard":
        served.extra["rejection_sample_method"] = rejection


VLLM_RULES = {"greedy": "onehot", "probabilistic": "probabilistic"}
"""vLLM's draft_sample_method -> the rule (eagle3kit.model.verification.RULES) it runs."""


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: Any) -> float:
    """An SGLang accept threshold, 1 (its default) where the server does not say."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 1.0

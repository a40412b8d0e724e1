"""`bench server`'s figures from the server's own accounting (module docstring of
eagle3kit.bench.server: where they come from): vLLM's Prometheus counters scraped and
differenced, SGLang's per-request spec_verify_ct summed and its /server_info's draft shape,
the run's timing, and acceptance per context depth.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from eagle3kit._urls import bearer_header
from eagle3kit.bench.stats import percentile
from eagle3kit.errors import UserError

VLLM_PREFIX = "vllm:spec_decode_"
VLLM_COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
PER_POS = "num_accepted_tokens_per_pos"
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


# Prometheus -------------------------------------------------------------------------------
def parse_metrics(text: str) -> dict[str, Any]:
    """vLLM's spec-decode counters, summed over engines: num_drafts, num_draft_tokens,
    num_accepted_tokens, and per_pos {position: count}. Missing counters are absent."""
    found: dict[str, Any] = {}
    per_pos: dict[int, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if not match or not match[1].startswith(VLLM_PREFIX):
            continue
        name = match[1][len(VLLM_PREFIX) :].removesuffix("_total")
        try:
            value = float(match[3])
        except ValueError:
            continue
        if name == PER_POS:
            labels = dict(_LABEL.findall(match[2] or ""))
            if labels.get("position", "").isdigit():
                pos = int(labels["position"])
                per_pos[pos] = per_pos.get(pos, 0.0) + value
        elif name in VLLM_COUNTERS:
            found[name] = found.get(name, 0.0) + value
    if per_pos:
        found["per_pos"] = per_pos
    return found


def metrics_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    delta = {n: after.get(n, 0.0) - before.get(n, 0.0) for n in VLLM_COUNTERS}
    positions = sorted(set(before.get("per_pos", {})) | set(after.get("per_pos", {})))
    delta["per_pos"] = {
        p: after.get("per_pos", {}).get(p, 0.0) - before.get("per_pos", {}).get(p, 0.0)
        for p in positions
    }
    return delta


def vllm_acceptance(delta: dict[str, Any]) -> dict[str, Any]:
    """Acceptance length, per-position and draft acceptance rates from counter deltas."""
    drafts, accepted = delta["num_drafts"], delta["num_accepted_tokens"]
    if drafts <= 0:
        return {
            "acceptance_length": None,
            "per_position": [],
            "conditional": [],
            "draft_acceptance_rate": None,
            "drafts": 0,
        }
    counts = [delta["per_pos"][p] for p in sorted(delta["per_pos"])]
    rates = [c / drafts for c in counts]
    before = [drafts, *counts[:-1]]
    return {
        "acceptance_length": 1 + accepted / drafts,
        "per_position": rates,
        "conditional": [c / b if b else None for c, b in zip(counts, before, strict=True)],
        "draft_acceptance_rate": (
            accepted / delta["num_draft_tokens"] if delta["num_draft_tokens"] > 0 else None
        ),
        "drafts": drafts,
    }


# What each request and the server report ------------------------------------------------
@dataclass
class RequestResult:
    """One request's answer as the figures need it."""

    category: str
    tokens: int
    latency: float
    verify: int | None
    prompt_tokens: int = 0
    steps: list[int] | None = None
    """Accepted drafts per verification round, where the server reports them per request."""


async def _get(client: Any, url: str, paths: tuple[str, ...], api_key: str | None) -> Any:
    """The first path that answers 200: its response; None when none does."""
    for path in paths:
        try:
            resp = await client.get(url + path, headers=bearer_header(api_key))
        except Exception as exc:  # transport errors of httpx or aiohttp alike
            raise UserError(f"GET {url}{path}: {exc}") from None
        if resp.status_code == 200:
            return resp
    return None


async def scrape(client: Any, url: str, api_key: str | None) -> dict[str, Any]:
    resp = await _get(client, url, ("/metrics",), api_key)
    if resp is None:
        raise UserError(
            f"--server {url}: GET /metrics did not answer 200: vLLM's acceptance "
            "figures come from its Prometheus counters (is --disable-log-stats set?)"
        )
    return parse_metrics(resp.text)


async def sglang_shape(client: Any, url: str, api_key: str | None) -> dict[str, Any]:
    resp = await _get(client, url, ("/server_info", "/get_server_info"), api_key)
    if resp is None:
        return {}
    try:
        info = resp.json()
    except ValueError:
        return {}
    return info if isinstance(info, dict) else {}


def sglang_draft_shape(info: dict[str, Any], k: int | None) -> tuple[str, int | None]:
    steps, topk = info.get("speculative_num_steps"), info.get("speculative_eagle_topk")
    tokens = info.get("speculative_num_draft_tokens")
    if isinstance(topk, int) and topk > 1:
        return f"tree top-{topk} depth {steps}, {tokens} draft tokens", steps
    steps = steps if isinstance(steps, int) else k
    return (f"chain k={steps}" if steps else "chain (k unknown: pass --k)"), steps


# Summarizing ------------------------------------------------------------------------------
def timing_figures(out: dict[str, Any]) -> dict[str, Any]:
    results = [r for c in out["categories"].values() for r in c["results"] if r is not None]
    latencies = [r.latency for r in results]
    tokens = sum(r.tokens for r in results)
    seconds = out["seconds"]
    return {
        "requests": len(results),
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds if seconds > 0 else None,
        "latency_p50": percentile(latencies, 50),
        "latency_p90": percentile(latencies, 90),
        "latency_p99": percentile(latencies, 99),
    }


def _sglang_length(results: list[RequestResult], prefill: bool = True) -> float | None:
    """Σ completion_tokens / Σ spec_verify_ct; without `prefill`, the first token of each
    request (made by prefill, not by a verification round) is left out."""
    verify = sum(r.verify or 0 for r in results)
    tokens = sum(r.tokens - (not prefill) for r in results if r.verify)
    return tokens / verify if verify else None


def acceptance_figures(info: Any, out: dict[str, Any]) -> dict[str, Any]:
    """Acceptance over the run and per category, by the server's own accounting."""
    categories: dict[str, dict[str, Any]] = {}
    if info.api == "vllm":
        total: dict[str, Any] = {n: 0.0 for n in VLLM_COUNTERS} | {"per_pos": {}}
        for name, c in out["categories"].items():
            delta = metrics_delta(c["before"], c["after"])
            for n in VLLM_COUNTERS:
                total[n] += delta[n]
            for p, v in delta["per_pos"].items():
                total["per_pos"][p] = total["per_pos"].get(p, 0.0) + v
            figures = vllm_acceptance(delta)
            categories[name] = {
                "requests": sum(r is not None for r in c["results"]),
                "acceptance_length": figures["acceptance_length"],
                "per_position": figures["per_position"],
            }
        overall = vllm_acceptance(total)
        return {
            "source": "vLLM /metrics counter deltas (vllm:spec_decode_*), summed over engines",
            **overall,
            "categories": categories,
            "found": bool(overall["drafts"]),
        }
    results: list[RequestResult] = []
    for name, c in out["categories"].items():
        done = [r for r in c["results"] if r is not None]
        results += done
        categories[name] = {"requests": len(done), "acceptance_length": _sglang_length(done)}
    length = _sglang_length(results)
    return {
        "source": "SGLang meta_info.spec_verify_ct (Σ completion_tokens / Σ spec_verify_ct)",
        "acceptance_length": length,
        "per_position": [],
        "conditional": [],
        "without_prefill": _sglang_length(results, prefill=False),
        "drafts": sum(r.verify or 0 for r in results),
        "draft_acceptance_rate": None,
        "categories": categories,
        "found": any(r.verify for r in results),
    }


def depth_figures(
    out: dict[str, Any], k: int | None, edges: tuple[int, ...]
) -> dict[str, dict[str, Any]]:
    """Acceptance per context-depth bucket over the rounds the engine reported per request
    (eagle3kit.model.depth, as bench accept counts its own); empty without them."""
    from eagle3kit.model.depth import by_depth

    decodes = [
        (r.prompt_tokens, r.steps)
        for c in out["categories"].values()
        for r in c["results"]
        if r is not None and r.steps is not None
    ]
    if not decodes:
        return {}
    return by_depth(decodes, k or max(max(s, default=0) for _, s in decodes), edges)


def speculates(info: Any, out: dict[str, Any]) -> bool:
    if info.api == "sglang":
        return bool(out.get("server_info", {}).get("speculative_algorithm"))
    deltas = [metrics_delta(c["before"], c["after"]) for c in out["categories"].values()]
    return any(d["num_drafts"] > 0 for d in deltas)

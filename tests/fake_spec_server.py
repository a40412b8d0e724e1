"""A loopback SGLang / vLLM server that runs "speculative decoding", for `bench server` tests.

It is testkit/fakeserver.py's FakeServer (same endpoints, probing, ids and faults) with an
acceptance model on top: each request's tokens after the first (which prefill makes) come in
verification rounds whose accepted drafts are drawn position by position with fixed
conditional rates. The server reports them in the shapes SERVER_APIS.md §6 gives:

- SGLang: `meta_info.spec_verify_ct` (rounds) and `spec_accept_length`
  (completion_tokens / spec_verify_ct); `/server_info` names EAGLE3 and the chain length.
- vLLM: Prometheus counters at `/metrics`, one series per engine label:
  `vllm:spec_decode_num_drafts_total`, `..._num_draft_tokens_total`,
  `..._num_accepted_tokens_total` and `..._num_accepted_tokens_per_pos_total{position="i"}`,
  requests spread over the engines in turn; with `per_request_metrics` (vLLM's
  `--per-request-spec-decode-metrics detailed`) each answer also carries
  `metrics.speculative_decoding` with the accepted drafts of every round in order.

Decoding takes `step_s` per target forward: per round when speculating, per token otherwise,
so a speculating server is faster by about its acceptance length. `log` keeps (tokens,
rounds, accepted per round) of every generation, for the exact figures a test expects.

`sampled_accept` gives requests with temperature > 0 rates of their own: (0, 0, 0) is the
signature of vLLM 0.32.0's CPU build (vllm#55005), which verifies sampled drafts against
uninitialised memory and keeps almost none while temperature 0 keeps its rates.

    with SpecServer("vllm", k=3, accept=(0.8, 0.6, 0.4)) as srv: ...
    with SpecServer("sglang", speculative=False) as baseline: ...
"""

from __future__ import annotations

import asyncio
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

# testkit/ (pytest's pythonpath) also when run by hand as a script
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "testkit"))
from fakeserver import FakeServer, _json


class SpecServer(FakeServer):
    def __init__(
        self,
        api: str = "sglang",
        *,
        k: int = 3,
        accept: Sequence[float] = (0.8, 0.6, 0.4),
        speculative: bool = True,
        step_s: float = 0.0,
        engines: int = 2,
        spec_seed: int = 0,
        served: dict[str, Any] | None = None,
        chat_tokenizer: Any = None,
        chat_prefix: Sequence[int] = (),
        per_request_metrics: bool = False,
        sampled_accept: Sequence[float] | None = None,
        **options: Any,
    ) -> None:
        options.setdefault("eos_token_id", None)  # lengths set by max_tokens: easy to predict
        super().__init__(api, speculative=speculative, **options)
        if len(accept) != k or (sampled_accept is not None and len(sampled_accept) != k):
            raise ValueError("accept needs one conditional rate per draft position")
        self.k = k
        self.accept = list(accept)
        self.sampled_accept = None if sampled_accept is None else list(sampled_accept)
        """The rates of requests with temperature > 0 (None: `accept`'s)."""
        self.step_s = step_s
        self.engines = engines
        self._rng = random.Random(spec_seed)
        self.log: list[tuple[int, int, list[int]]] = []
        """(tokens, rounds, accepted per round) of each generation."""
        self.counters = [
            {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "per_pos": [0] * k}
            for _ in range(engines)
        ]
        self._rounds: dict[asyncio.Task, int] = {}
        self.served = dict(served or {})
        """SGLang: fields over /server_info's; vLLM: the speculative_config its dev-mode
        /server_info shows (none when empty, as without VLLM_SERVER_DEV_MODE=1)."""
        self.chat_tokenizer = chat_tokenizer
        """vLLM /tokenize of messages: this transformers tokenizer's chat template (the one
        the server was started with), with `chat_prefix` ids before it (a BOS it adds)."""
        self.chat_prefix = list(chat_prefix)
        self.per_request_metrics = per_request_metrics
        self.per_request: list[tuple[int, list[int]]] = []
        """vLLM with per_request_metrics: (prompt tokens, accepted per round) of each answer."""
        self._steps: dict[asyncio.Task, list[int]] = {}

    # The acceptance model ---------------------------------------------------------------
    def simulate(self, tokens: int, sampled: bool = False) -> list[int]:
        """Accepted drafts of each round for a generation of `tokens` tokens (`sampled`: at
        temperature > 0)."""
        rates = self.sampled_accept if sampled and self.sampled_accept is not None else self.accept
        made, rounds = 1, []
        while made < tokens:
            accepted = 0
            while accepted < self.k and self._rng.random() < rates[accepted]:
                accepted += 1
            rounds.append(accepted)
            made += accepted + 1
        return rounds

    def _count(self, rounds: list[int]) -> None:
        c = self.counters[len(self.log) % self.engines]
        c["num_drafts"] += len(rounds)
        c["num_draft_tokens"] += self.k * len(rounds)
        c["num_accepted_tokens"] += sum(rounds)
        for accepted in rounds:
            for i in range(accepted):
                c["per_pos"][i] += 1

    # Overrides of FakeServer ------------------------------------------------------------
    async def _decode(self, rec: dict, n_tokens: int, live: Any = None) -> int:
        if not self.speculative or n_tokens == 0:
            await asyncio.sleep(self.step_s * n_tokens)
            return await super()._decode(rec, n_tokens, live)
        with self._lock:
            rounds = self.simulate(n_tokens, _temperature(rec.get("body")) > 0)
            if self.api == "vllm":
                self._count(rounds)
            self.log.append((n_tokens, len(rounds), rounds))
        self._rounds[asyncio.current_task()] = len(rounds)
        self._steps[asyncio.current_task()] = rounds
        await asyncio.sleep(self.step_s * (1 + len(rounds)))
        return await super()._decode(rec, n_tokens, live)

    def _spec(self, n: int) -> dict[str, Any]:
        rounds = self._rounds.pop(asyncio.current_task(), 0)
        if not self.speculative or not rounds:
            return {}
        return {"spec_verify_ct": rounds, "spec_accept_length": n / rounds}

    async def _send(self, request: web.Request, payload: Any, rec: dict) -> web.StreamResponse:
        steps = self._steps.pop(asyncio.current_task(), None)
        if (
            self.per_request_metrics
            and self.api == "vllm"
            and steps is not None
            and isinstance(payload, dict)
            and "choices" in payload
        ):
            accepted = sum(steps)
            payload["metrics"] = {
                "speculative_decoding": {
                    "mean_acceptance_length": 1 + accepted / len(steps) if steps else 1.0,
                    "num_spec_steps": len(steps),
                    "num_accepted_draft_tokens": accepted,
                    "num_draft_tokens": self.k * len(steps),
                    "num_spec_tokens": self.k,
                    "per_step_accepted": steps,
                    "per_step_drafted": [self.k] * len(steps),
                }
            }
            with self._lock:
                self.per_request.append((payload["usage"]["prompt_tokens"], steps))
        return await super()._send(request, payload, rec)

    def _routes(self) -> dict[tuple[str, str], Any]:
        routes = super()._routes()
        if self.api == "vllm":
            routes[("GET", "/metrics")] = self._metrics
            if self.served:
                routes[("GET", "/server_info")] = self._vllm_server_info
        return routes

    async def _vllm_server_info(self, request: web.Request, body: Any, rec: dict) -> web.Response:
        return _json({"vllm_config": {"speculative_config": self.served}, "vllm_env": {}})

    async def _tokenize(self, request: web.Request, body: dict, rec: dict) -> web.Response:
        if self.chat_tokenizer is None or "messages" not in body:
            return await super()._tokenize(request, body, rec)
        ids = self.chat_tokenizer.apply_chat_template(
            body["messages"], tokenize=True, add_generation_prompt=True
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        tokens = self.chat_prefix + [int(t) for t in ids]
        return _json({"tokens": tokens, "count": len(tokens), "max_model_len": self.context_length})

    async def _server_info(self, request: web.Request, body: Any, rec: dict) -> web.Response:
        spec = self.speculative
        return _json(
            {
                "model_path": self.model_name,
                "context_length": None,
                "speculative_algorithm": "EAGLE3" if spec else None,
                "speculative_num_steps": self.k if spec else None,
                "speculative_eagle_topk": 1 if spec else None,
                "speculative_num_draft_tokens": self.k + 1 if spec else None,
                "reasoning_parser": None,
                "max_req_input_len": self.context_length - 1,
                "internal_states": [{}],
                "version": self.version,
            }
            | self.served
        )

    async def _metrics(self, request: web.Request, body: Any, rec: dict) -> web.Response:
        return web.Response(text=self.metrics_text(), content_type="text/plain")

    def metrics_text(self) -> str:
        """Prometheus exposition text as vLLM writes it (counters only when speculating)."""
        lines = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
        ]
        lines += [
            f'vllm:num_requests_running{{engine="{e}",model_name="{self.model_name}"}} 0.0'
            for e in range(self.engines)
        ]
        if not self.speculative:
            return "\n".join(lines) + "\n"
        for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
            lines += [
                f"# HELP vllm:spec_decode_{name}_total Number of spec decoding {name}.",
                f"# TYPE vllm:spec_decode_{name}_total counter",
            ]
            lines += [
                f'vllm:spec_decode_{name}_total{{engine="{e}",model_name='
                f'"{self.model_name}"}} {float(c[name])}'
                for e, c in enumerate(self.counters)
            ]
        name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
        lines += [f"# HELP {name} Accepted tokens per draft position.", f"# TYPE {name} counter"]
        for e, c in enumerate(self.counters):
            lines += [
                f'{name}{{engine="{e}",model_name="{self.model_name}",position="{i}"}} {float(v)}'
                for i, v in enumerate(c["per_pos"])
            ]
        return "\n".join(lines) + "\n"

    # What a test expects ----------------------------------------------------------------
    def expected_sglang_length(self) -> float:
        """Σ tokens / Σ rounds over the generations that had a round (a one-token answer
        is prefill's alone: bench server leaves it out, as it has no spec_verify_ct)."""
        return sum(t for t, r, _ in self.log if r) / sum(r for _, r, _ in self.log)

    def expected_vllm_length(self) -> float:
        rounds = [a for _, _, rs in self.log for a in rs]
        return 1 + sum(rounds) / len(rounds)

    def expected_per_position(self) -> list[float]:
        rounds = [a for _, _, rs in self.log for a in rs]
        return [sum(a > i for a in rounds) / len(rounds) for i in range(self.k)]


def _temperature(body: Any) -> float:
    """A generation request's temperature: vLLM's top-level field, SGLang's in
    sampling_params; 1.0 (both servers' default) where it is left out."""
    if not isinstance(body, dict):
        return 1.0
    params = body.get("sampling_params")
    where = params if isinstance(params, dict) else body
    value = where.get("temperature", 1.0)
    return float(value) if isinstance(value, int | float) else 1.0


if __name__ == "__main__":  # a server for trying `eagle3kit bench server` by hand
    import argparse
    import time

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api", choices=("sglang", "vllm"), default="sglang")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--tokenizer", default=None)
    parser.add_argument("--no-spec", action="store_true")
    parser.add_argument("--step-s", type=float, default=0.002)
    args = parser.parse_args()
    with SpecServer(
        args.api,
        port=args.port,
        tokenizer=args.tokenizer,
        speculative=not args.no_spec,
        step_s=args.step_s,
    ) as srv:
        print(srv.url, flush=True)
        while True:
            time.sleep(3600)

"""`eagle3kit bench server`: acceptance length, throughput and latency of a live SGLang or
vLLM server that runs speculative decoding, and with --baseline the speedup over the same
model served without it.

Where the figures come from (SERVER_APIS.md §6):
- SGLang reports per request `meta_info.spec_verify_ct` (target verify forwards); acceptance
  length = Σ completion_tokens / Σ spec_verify_ct over the run (it counts the prefill token
  too, so it reads slightly high).
- vLLM keeps Prometheus counters at /metrics, one series per engine (summed here). They are
  scraped before and after each category's requests: acceptance length = 1 + Δaccepted /
  Δdrafts, per-position rate p_i = Δaccepted_per_pos[i] / Δdrafts. Other traffic to the same
  server during the run would be counted too.

Requests send token ids rendered with the target's tokenizer and chat template, as gen does;
each category runs on its own (so vLLM's counters can be split by category), its conversations
`--concurrency` at a time, the turns of one conversation in order.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import Any

import eagle3kit.bench.prompts as bench_prompts
from eagle3kit import _ui
from eagle3kit._options import SEED_BOUNDS, embed, opt
from eagle3kit.bench.contexts import DepthOptions
from eagle3kit.bench.result import ServerReport
from eagle3kit.bench.server_figures import (
    RequestResult,
    acceptance_figures,
    depth_figures,
    scrape,
    sglang_draft_shape,
    sglang_shape,
    speculates,
    timing_figures,
)
from eagle3kit.bench.stats import likely_misconfigured
from eagle3kit.errors import UserError

ATTEMPTS = 3


@dataclass
class ServerBenchConfig:
    server: str = field(metadata=opt(metavar="URL", cli_only="destination"))
    """An SGLang or vLLM server running speculative decoding: its URL."""
    prompts: list[Path] = field(metadata=bench_prompts.PROMPTS_ARG)
    """Prompt files, as gen takes them (JSONL, JSON, parquet); EAGLE/MT-bench question.jsonl."""
    tokenizer: Path
    """The target's tokenizer directory (prompts are rendered client-side and sent as ids)."""
    baseline: str | None = field(default=None, metadata=opt(metavar="URL", cli_only="destination"))
    """The same model served without speculation: the speedup."""
    api: str = "auto"
    """auto, sglang or vllm."""
    chat_template: Path | None = None
    """A Jinja chat template file."""
    max_new_tokens: int = 256
    """Tokens generated per turn."""
    temperature: float = 0.0
    """Sampling temperature; 0 is greedy."""
    top_p: float = 1.0
    """Top-p sent with each request."""
    top_k: int = -1
    """Top-k sent with each request; -1 off."""
    concurrency: int = 1
    """Conversations in flight (1 measures batch-1 latency and acceptance)."""
    max_samples: int | None = None
    """At most N conversations."""
    max_turns: int | None = None
    """At most N turns of each."""
    format: str = "auto"
    """Prompt file shape (as gen's --format)."""
    k: int | None = field(default=None, metadata=opt("--k"))
    """Draft tokens per round, when the server does not say (shown beside the figures)."""
    api_key: str | None = field(
        default=None, repr=False, metadata=opt(envvar="EAGLE3KIT_API_KEY", cli_only="secret")
    )
    """Bearer token for the servers (never stored)."""
    request_timeout: float | None = field(default=None, metadata=opt(metavar="SECONDS"))
    """Limit on one request (default none)."""
    seed: int = field(default=0, metadata=opt(bounds=SEED_BOUNDS))
    """Sampling seed."""
    plot: Path | None = field(default=None, metadata=opt(metavar="FILE.png"))
    """Draw acceptance per position and category, and against context depth (plot extra)."""
    trust_remote_code: bool = field(default=False, metadata=opt(cli_only="code"))
    """Run code the tokenizer directory ships (auto_map in its tokenizer_config.json); only
    ever from the flag."""
    depth: DepthOptions = field(default_factory=DepthOptions, metadata=embed())
    output: _ui.OutputOptions = field(default_factory=_ui.OutputOptions)
    prompts_alias: InitVar[list[Path] | None] = field(
        default=None, metadata=bench_prompts.PROMPTS_ALIAS
    )
    """Deprecated: give the prompt files positionally."""

    def __post_init__(self, prompts_alias: list[Path] | None) -> None:
        from eagle3kit._urls import server_url
        from eagle3kit.gen.servers import API_CHOICES

        bench_prompts.required(server=self.server)
        self.prompts = bench_prompts.prompt_files(
            self.prompts, prompts_alias, optional=self.depth.context_from is not None
        )
        bench_prompts.required(tokenizer=self.tokenizer)
        for path in self.prompts:
            if not path.is_file():
                raise UserError(f"{path}: no such prompt file")
        if self.api not in API_CHOICES or self.api == "openai-chat":
            raise UserError(f"--api must be auto, sglang or vllm (got {self.api})")
        self.server = server_url(self.server, "--server")
        self.baseline = server_url(self.baseline, "--baseline") if self.baseline else None
        for flag, value in (
            ("--max-new-tokens", self.max_new_tokens),
            ("--concurrency", self.concurrency),
            ("--k", self.k),
            ("--max-samples", self.max_samples),
            ("--max-turns", self.max_turns),
        ):
            if value is not None and value < 1:
                raise UserError(f"{flag} must be at least 1 (got {value})")
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise UserError(f"--temperature must be >= 0 (got {self.temperature})")
        if not (0 < self.top_p <= 1):
            raise UserError(f"--top-p must be in (0, 1] (got {self.top_p})")
        if self.top_k == 0 or self.top_k < -1:
            raise UserError(f"--top-k must be -1 (off) or at least 1 (got {self.top_k})")
        if self.request_timeout is not None and not (
            self.request_timeout > 0 and math.isfinite(self.request_timeout)
        ):
            raise UserError(
                f"--request-timeout must be a finite number > 0 of seconds (got "
                f"{self.request_timeout})"
            )
        if self.plot is not None:
            from eagle3kit._plot import check_plotting

            check_plotting(Path(self.plot))


# Running ----------------------------------------------------------------------------------
async def _generate_all(
    cfg: ServerBenchConfig,
    url: str,
    renderer: Any,
    convs: list[Any],
    progress: _ui.Progress,
    role: str,
) -> tuple[Any, dict[str, Any]]:
    """Probe `url`, run every category in turn; (server info, per-category results)."""
    from eagle3kit.gen.servers import make_client, probe

    client = make_client(cfg.concurrency, api_key=cfg.api_key)
    try:
        info = await probe(client, url, cfg.api, cfg.api_key)
        info.vocab_size = renderer.vocab_size
        if info.api == "sglang":
            info.speculative = None  # checked here, not as an invariant: the baseline has none
        categories: dict[str, list[Any]] = {}
        for conv in convs:
            categories.setdefault(conv.category, []).append(conv)
        out: dict[str, Any] = {"started": time.perf_counter(), "categories": {}}
        if info.api == "sglang":
            out["server_info"] = await sglang_shape(client, url, cfg.api_key)
        for name, group in categories.items():
            before = await scrape(client, url, cfg.api_key) if info.api == "vllm" else None
            results = await _run_group(cfg, client, info, renderer, group, name, progress, role)
            after = await scrape(client, url, cfg.api_key) if info.api == "vllm" else None
            out["categories"][name] = {"results": results, "before": before, "after": after}
        out["seconds"] = time.perf_counter() - out["started"]
        return info, out
    finally:
        await client.aclose()


async def _run_group(
    cfg: ServerBenchConfig,
    client: Any,
    info: Any,
    renderer: Any,
    convs: list[Any],
    category: str,
    progress: _ui.Progress,
    role: str,
) -> list[RequestResult | None]:
    slots = asyncio.Semaphore(cfg.concurrency)

    async def conversation(number: int, conv: Any) -> list[RequestResult | None]:
        async with slots:
            done: list[RequestResult | None] = []
            for turn, answered, ids in conv.turns(renderer, cfg.max_turns):
                completion = await _one(
                    cfg,
                    client,
                    info,
                    renderer,
                    ids,
                    request_seed(cfg.seed, number, turn),
                    f"bench-{role}-{number}-{turn}",
                )
                if completion is None:
                    done.append(None)
                    break
                done.append(
                    RequestResult(
                        category,
                        completion.completion_tokens,
                        completion.latency,
                        completion.counts.get("spec_verify_ct"),
                        len(ids),
                        completion.spec_steps,
                    )
                )
                answered(completion.output_ids)
            progress.add(
                1,
                rows=f"server:{role}",
                tokens=sum(r.tokens for r in done if r),
                errors=sum(r is None for r in done),
            )
            return done

    groups = await asyncio.gather(*(conversation(i, c) for i, c in enumerate(convs)))
    return [r for g in groups for r in g]


def request_seed(seed: int, number: int, turn: int) -> int:
    """Each request's own sampling seed, derived from --seed as bench accept derives each
    generation's: one seed for every request would give them one random stream, and a
    sampled acceptance length measured on it would rest on one draw, not on each request's
    (vLLM seeds each request's generator with it)."""
    return seed * 1_000_003 + number * 101 + turn


async def _one(
    cfg: ServerBenchConfig,
    client: Any,
    info: Any,
    renderer: Any,
    ids: list[int],
    seed: int,
    sample_id: str,
) -> Any:
    """One generation, retried on transient failures; None when it never succeeded."""
    from eagle3kit.gen import GenRequest
    from eagle3kit.gen.servers import RequestRejected, RetryableError, ServerFatal, generate

    req = GenRequest(
        sample_id,
        ids,
        cfg.max_new_tokens,
        renderer.stop_token_ids,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        top_k=cfg.top_k,
        seed=seed,
    )
    for attempt in range(ATTEMPTS):
        try:
            return await generate(
                client, info, req, api_key=cfg.api_key, timeout=cfg.request_timeout, attempt=attempt
            )
        except ServerFatal as exc:
            raise UserError(str(exc)) from None
        except RequestRejected as exc:
            _ui.warn(f"{sample_id}: {exc}")
            return None
        except RetryableError as exc:
            if attempt == ATTEMPTS - 1:
                _ui.warn(f"{sample_id}: {exc}")
                return None
            await asyncio.sleep(0.5 * 2**attempt)
    return None


def run(cfg: ServerBenchConfig) -> ServerReport:
    report = measure(cfg)
    length = report.acceptance_length_without_prefill or report.acceptance_length
    if not sampling_probe(cfg, report) and likely_misconfigured(length):
        report.warnings.append(
            f"acceptance length {length:.3f}: drafts are almost never "
            "accepted; check the aux layer ids and their convention, the algorithm (EAGLE3, "
            "not EAGLE) and that the drafter was trained for this target"
        )
    from eagle3kit.bench.report import show_server

    show_server(report, cfg.output, cfg.plot)
    return report


def sampling_probe(cfg: ServerBenchConfig, report: ServerReport) -> bool:
    """At temperature > 0, where the engine keeps almost no drafts: the same server again at
    temperature 0 on the first few conversations. Keeping drafts there, its sampling is at
    fault (eagle3kit.bench.diagnose.engine_sampling): the finding goes into the report and
    its warnings, and the answer is True."""
    from dataclasses import replace

    from eagle3kit.bench import diagnose

    length = report.acceptance_length_without_prefill or report.acceptance_length
    if cfg.temperature == 0 or not diagnose.keeps_almost_nothing(length, report.per_position):
        return False
    _ui.info(
        "the engine keeps almost no drafts: measuring it at temperature 0 on "
        f"{diagnose.PROBE_SAMPLES} conversations",
        cfg.output,
    )
    zero = replace(
        cfg,
        temperature=0.0,
        baseline=None,
        plot=None,
        max_samples=min(cfg.max_samples or diagnose.PROBE_SAMPLES, diagnose.PROBE_SAMPLES),
        output=_ui.OutputOptions(quiet=True, no_progress=True),
    )
    try:
        at_zero = measure(zero)
    except UserError:  # the probe is a diagnosis: a failure of its own changes nothing
        return False
    kept = at_zero.acceptance_length_without_prefill or at_zero.acceptance_length
    if kept is None or kept < diagnose.SERVER_ZERO_KEEPS:
        return False
    finding = diagnose.engine_sampling(report.api, cfg.temperature, length, kept)
    report.findings.append(finding.to_dict())
    report.warnings.append(f"{diagnose.CAUSES[finding.cause]} [{finding.cause}]: {finding.message}")
    return True


def measure(cfg: ServerBenchConfig) -> ServerReport:
    """The run's figures, not shown."""
    logging.getLogger("httpx").setLevel(logging.WARNING)
    renderer = bench_prompts.load_renderer(
        cfg.tokenizer, "--tokenizer", cfg.chat_template, cfg.trust_remote_code
    )
    convs = bench_prompts.sources(
        cfg.prompts,
        cfg.format,
        cfg.max_samples,
        cfg.depth.context_from,
        cfg.depth.cuts,
        renderer.vocab_size,
    )
    roles = [("speculative", cfg.server)] + ([("baseline", cfg.baseline)] if cfg.baseline else [])
    outcomes: dict[str, tuple[Any, dict[str, Any]]] = {}
    with _ui.Progress(
        "bench server", len(convs) * len(roles), cfg.output, unit="conversations"
    ) as progress:
        for role, url in roles:
            outcomes[role] = asyncio.run(_generate_all(cfg, url, renderer, convs, progress, role))
    return _summarize(cfg, outcomes)


def _summarize(
    cfg: ServerBenchConfig, outcomes: dict[str, tuple[Any, dict[str, Any]]]
) -> ServerReport:
    info, out = outcomes["speculative"]
    figures = acceptance_figures(info, out)
    if not figures["found"]:
        where = (
            "no vllm:spec_decode_* counters moved at /metrics"
            if info.api == "vllm"
            else "no spec_verify_ct in the answers' meta_info"
        )
        raise UserError(
            f"--server {cfg.server}: {where}: is speculative decoding on? "
            "(--baseline takes the server without it)"
        )
    if info.api == "sglang":
        shape, k = sglang_draft_shape(out.get("server_info", {}), cfg.k)
    else:
        k = len(figures["per_position"]) or cfg.k
        shape = f"chain k={k}" if k else "chain (k unknown: pass --k)"
    run_timing = timing_figures(out)
    requests = sum(len(c["results"]) for c in out["categories"].values())
    report = ServerReport(
        server=cfg.server,
        api=info.api,
        version=info.version,
        model=info.model,
        shape=shape,
        k=k,
        temperature=cfg.temperature,
        source=figures["source"],
        requests=requests,
        errors=requests - run_timing["requests"],
        acceptance_length=figures["acceptance_length"],
        per_position=figures["per_position"],
        per_position_conditional=figures["conditional"],
        draft_acceptance_rate=figures["draft_acceptance_rate"],
        run=run_timing,
        categories=figures["categories"],
        rounds=int(figures["drafts"]) if figures.get("drafts") else None,
        acceptance_length_without_prefill=figures.get("without_prefill"),
        depth_edges=list(cfg.depth.edges),
        depths=depth_figures(out, k, cfg.depth.edges),
    )
    if "baseline" in outcomes:
        base_info, base_out = outcomes["baseline"]
        report.baseline = timing_figures(base_out)
        spec_rate, base_rate = run_timing["tokens_per_s"], report.baseline["tokens_per_s"]
        report.speedup = spec_rate / base_rate if spec_rate and base_rate else None
        spec_p50, base_p50 = run_timing["latency_p50"], report.baseline["latency_p50"]
        report.latency_speedup = base_p50 / spec_p50 if spec_p50 and base_p50 else None
        if speculates(base_info, base_out):
            report.warnings.append(
                f"--baseline {cfg.baseline} speculates too: the speedup "
                "compares two speculating servers"
            )
    return report

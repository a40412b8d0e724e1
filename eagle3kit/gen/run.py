"""`eagle3kit gen`'s orchestration: load and render the prompts, connect to the servers,
open (or continue) the token dataset, and keep every server slot busy until each sample is
in (the scheduler), then check that nothing is missing and report."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable
from typing import cast

import eagle3kit.gen.prompts as prompts
from eagle3kit import _ui
from eagle3kit._signals import EXIT_CODES, continue_command
from eagle3kit.chat.conversation import Conversation
from eagle3kit.chat.render import Renderer
from eagle3kit.errors import UserError
from eagle3kit.format import DatasetWriter
from eagle3kit.gen.backends import PROBE_TEXT, Backend, HttpBackend, connect
from eagle3kit.gen.config import GenConfig, ServerSpec
from eagle3kit.gen.jobs import Chain, make_chains
from eagle3kit.gen.result import GenResult, report
from eagle3kit.gen.resume import check_complete, retry_failed, starting_points
from eagle3kit.gen.scheduler import Scheduler
from eagle3kit.gen.supervisor import final_error


def run(cfg: GenConfig, *, select: Callable[[list[Chain]], list[Chain]] | None = None) -> GenResult:
    """Generate every sample the prompts call for; `select`, when given, narrows the
    chains to generate (plan's pilot). Their ids are the full run's, so a later run over
    all the prompts skips what `select` chose and was committed."""
    # httpx logs every request at INFO: thousands of lines an hour in a nohup log.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    convs, duplicates, bad_lines = load(cfg)
    if not convs:
        raise UserError("no prompts to generate from (check --partition and --max-samples)")
    assert cfg.tokenizer is not None  # GenConfig refuses a run without one
    # (cast: GenConfig parsed --chat-template-kwargs to a dict)
    renderer = Renderer.load(
        cfg.tokenizer,
        chat_template=cfg.chat_template,
        chat_template_kwargs=cast(dict, cfg.chat_template_kwargs),
        system=cfg.system,
        trust_remote_code=cfg.trust_remote_code,
        flag=cfg.tokenizer_flag,
    )
    chains = make_chains(convs, cfg.n)
    if select is not None:
        chains = select(chains)
    # The prompts live for the whole run: moving them out of the collector's view spares
    # full collections that would otherwise walk millions of objects again and again.
    gc.freeze()
    try:
        result = asyncio.run(_generate(cfg, renderer, chains, duplicates))
    finally:
        gc.unfreeze()  # a caller that runs gen again (tests, plan) gets its memory back
    result.bad_lines = bad_lines
    report(result, cfg)
    return result


def load(cfg: GenConfig) -> tuple[list[Conversation], int, int]:
    """The conversations to generate from, how many duplicates were dropped, and how many
    malformed records --skip-bad-lines left out."""
    convs: list[Conversation] = []
    duplicates = bad_lines = 0
    if cfg.prompts:
        convs, stats = prompts.load_conversations(
            cfg.prompts,
            fmt=cfg.format,
            partition_field=cfg.partition_field,
            skip_bad_lines=cfg.skip_bad_lines,
        )
        duplicates = stats.duplicates
        if stats.bad_lines:
            _ui.warn(f"left out {stats.bad_lines:,} malformed prompt record(s) (--skip-bad-lines)")
        bad_lines = stats.bad_lines
    if cfg.dataset:
        convs += prompts.load_hf_dataset(
            cfg.dataset,
            split=cfg.dataset_split,
            fmt=cfg.format,
            partition_field=cfg.partition_field,
        )
        convs, more = prompts.dedupe(convs)
        duplicates += more
    convs = prompts.select(
        convs, partition=cfg.partition, max_samples=cfg.max_samples, shuffle_seed=cfg.shuffle_seed
    )
    return convs, duplicates, bad_lines


async def check_tokenizer(backends: list[Backend], renderer: Renderer) -> None:
    """Refuse to start when a server tokenizes a probe differently from --tokenizer."""
    import eagle3kit.gen.servers as servers

    local = renderer.tokenizer.encode(PROBE_TEXT, add_special_tokens=False)
    for backend in backends:
        if not isinstance(backend, HttpBackend):
            continue
        # The key goes with the probe too: a server behind --api-key answers 401 without it.
        # Any failure here is one clear message, never a traceback (ServerError is no
        # UserError).
        try:
            problem = await backend.tokenizer_disagreement(local)
        except servers.ServerError as exc:
            raise UserError(
                f"{backend.name}: the tokenizer check failed: {exc} (--no-tokenizer-check skips it)"
            ) from None
        if problem is not None:
            raise UserError(
                f"{backend.name}: {problem}. Pass the target model's own "
                "tokenizer, or --no-tokenizer-check to go on anyway."
            )


def text_rebuilder(renderer: Renderer):
    """For --api openai-chat: the completion ids rebuilt from the server's parsed text.

    The reasoning goes back between the model's own think markers (only the closing one
    when the template already opened it in the prompt); the result is marked reconstructed.
    """

    def rebuild(reasoning: str | None, content: str) -> list[int]:
        text = content
        if reasoning and renderer.think is not None:
            start, end = renderer.think
            opening = "" if renderer.prompt_opens_think else start
            text = f"{opening}{reasoning}{end}{content}"
        return renderer.encode(text)

    return rebuild


async def _backends(cfg: GenConfig, renderer: Renderer) -> list[Backend]:
    if cfg.engine == "hf":
        from eagle3kit.gen.hf_engine import HfBackend

        assert cfg.target is not None  # GenConfig refuses --engine hf without --target
        return [
            HfBackend.load(
                cfg.target, slots=cfg.concurrency, trust_remote_code=cfg.trust_remote_code
            )
        ]
    chat = (
        {"chat_rebuild": text_rebuilder(renderer), "chat_template_kwargs": cfg.chat_template_kwargs}
        if cfg.api == "openai-chat"
        else {}
    )
    return [
        await connect(
            s.url,
            cfg.api,
            s.concurrency or cfg.concurrency,
            cfg.api_key,
            cfg.request_timeout,
            **chat,
        )
        for s in cast(list[ServerSpec], cfg.servers)
    ]  # GenConfig parsed every --server


def _context_len(cfg: GenConfig, backends: list[Backend]) -> int | None:
    known = [b.max_model_len for b in backends if b.max_model_len]
    limits = [x for x in (cfg.max_seq_len, min(known, default=None)) if x]
    return min(limits) if limits else None


async def _generate(
    cfg: GenConfig, renderer: Renderer, chains: list[Chain], duplicates: int
) -> GenResult:
    started = time.monotonic()
    backends = await _backends(cfg, renderer)
    for backend in backends:
        if isinstance(backend, HttpBackend):  # output ids are checked against [0, vocab)
            backend.info.vocab_size = renderer.vocab_size
    try:
        probe_ids = None
        if cfg.tokenizer_check:
            await check_tokenizer(backends, renderer)
            probe_ids = renderer.tokenizer.encode(PROBE_TEXT, add_special_tokens=False)
        return await _write(cfg, renderer, chains, backends, duplicates, started, probe_ids)
    finally:
        for backend in backends:
            await backend.close()


def _open_writer(cfg: GenConfig, renderer: Renderer, backends: list[Backend]) -> DatasetWriter:
    """The dataset writer, with what decides the samples as its config (a rerun with other
    settings is refused) and where they came from as its provenance."""
    identity = renderer.identity()
    # Paths may differ between machines; the hashes say whether the rendering is the same.
    where = {k: identity.pop(k) for k in ("tokenizer", "chat_template_file")}
    # The served model is part of what a dataset holds: a rerun against servers that now
    # serve another one is refused like any other change of settings (--force accepts it).
    config = {**cfg.identity(), "renderer": identity, "model": _served_model(backends)}
    provenance = {
        "prompts": [str(p) for p in cfg.prompts],
        "dataset": cfg.dataset,
        "servers": [b.name for b in backends],
        "engine": cfg.engine,
        # Later stages (validate, extract, train) run the same shipped code.
        "trust_remote_code": cfg.trust_remote_code,
        **where,
    }
    writer = DatasetWriter(
        cfg.out, config=config, provenance=provenance, **cfg.write.writer_options()
    )
    _ui.warn_all(writer.warnings)
    return writer


async def _write(
    cfg: GenConfig,
    renderer: Renderer,
    chains: list[Chain],
    backends: list[Backend],
    duplicates: int,
    started: float,
    probe_ids: list[int] | None,
) -> GenResult:
    total = sum(len(c.ids) for c in chains)
    with _open_writer(cfg, renderer, backends) as writer:
        writer.store_tokenizer(renderer.files())
        retried = retry_failed(chains, writer, cfg) if cfg.retry_failed else 0
        starts = starting_points(chains, writer, cfg, renderer)
        done_before = total - sum(len(c.ids) - t for c, t in starts)
        with _ui.Progress("gen", total, cfg.output, initial=done_before) as progress:
            _partition_totals(progress, chains, starts)
            scheduler = Scheduler(
                cfg, renderer, backends, writer, progress, _context_len(cfg, backends), probe_ids
            )
            await scheduler.run(starts)
        _ui.table("gen", progress.columns, progress.summary_rows(), cfg.output)
        if scheduler.failure is not None:
            raise final_error(scheduler.failure)
        written = progress.done - done_before
    stopped = scheduler.signals > 0 and done_before + written < total
    if not scheduler.signals:
        check_complete(cfg, chains, total)
    stats = scheduler.stats
    return GenResult(
        output=str(cfg.out),
        total=total,
        previously_done=done_before,
        written=written,
        truncated=stats["truncated"],
        skipped=int(progress.counters.get("skipped") or 0),
        failed=stats["failed"],
        retries=stats["retries"],
        violations=stats["violations"],
        duplicates=duplicates,
        stopped=stopped,
        elapsed=round(time.monotonic() - started, 3),
        resume_command=continue_command(),
        filtered=stats["filtered"],
        generating_s=round(progress.elapsed, 3),
        retried_failed=retried,
        reprobes=stats["reprobes"],
        exit_code=EXIT_CODES[scheduler.first_signal] if stopped and scheduler.first_signal else 0,
    )


def _served_model(backends: list[Backend]) -> str | None:
    """The one model every server serves (None for --engine hf, whose path may differ
    between machines); servers of different models are refused."""
    models = {b.name: b.info.model for b in backends if isinstance(b, HttpBackend)}
    if len(set(models.values())) > 1:
        listed = "; ".join(f"{name}: {model}" for name, model in models.items())
        raise UserError(
            f"the servers serve different models ({listed}): give --server URLs of one model"
        )
    return next(iter(models.values()), None)


def _partition_totals(
    progress: _ui.Progress, chains: list[Chain], starts: list[tuple[Chain, int]]
) -> None:
    totals: dict[str, int] = {}
    remaining: dict[str, int] = {}
    for chain in chains:
        totals[chain.conv.partition] = totals.get(chain.conv.partition, 0) + len(chain.ids)
    for chain, turn in starts:
        part = chain.conv.partition
        remaining[part] = remaining.get(part, 0) + len(chain.ids) - turn
    for part, total in totals.items():
        progress.set_total(f"partition:{part}", total, initial=total - remaining.get(part, 0))

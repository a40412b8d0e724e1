"""`eagle3kit gen`: exact-token samples from SGLang, vLLM or transformers, resumable.

`run(GenConfig)` loads and renders the prompts, connects to the servers, opens (or
continues) the token dataset and keeps every server slot busy until each sample is in.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from eagle3kit import _ui
from eagle3kit._signals import EXIT_CODES, continue_command
from eagle3kit.errors import CheckFailed, UserError
from eagle3kit.format import Dataset, DatasetWriter, make_sample_id
from eagle3kit.gen import prompts
from eagle3kit.gen.backends import PROBE_TEXT, Backend, HttpBackend, connect
from eagle3kit.gen.config import GenConfig, parse_server
from eagle3kit.gen.render import Renderer, generation_points
from eagle3kit.gen.scheduler import Chain, Scheduler, final_error, resume_point
from eagle3kit.gen.types import Conversation

__all__ = ["GenConfig", "GenResult", "parse_server", "run"]


@dataclass
class GenResult:
    output: str
    total: int
    """Samples the dataset holds for these prompts when the run ends."""
    previously_done: int
    written: int
    truncated: int
    skipped: int
    failed: int
    retries: int
    violations: int
    duplicates: int
    stopped: bool
    """True when a signal stopped the run before everything was done."""
    elapsed: float
    resume_command: str
    filtered: int = 0
    """Stored with a `filtered:` finish reason (e.g. --min-completion-tokens): kept, counted."""
    bad_lines: int = 0
    """Malformed prompt records left out under --skip-bad-lines."""
    generating_s: float = 0.0
    """Seconds from the first request sent to the last answer recorded: `elapsed` less the
    start-up (connecting, checks, opening the dataset) and the final commit (plan uses it)."""
    retried_failed: int = 0
    """Samples an earlier run recorded as skipped:failed that this run tried again."""
    reprobes: int = 0
    """Times a server was probed again (after it went away, dropped a connection, or on the
    periodic check) to see that it still serves the run's model."""
    exit_code: int = 0
    """0, or 130 (SIGINT) / 143 (SIGTERM) when a signal stopped the run."""


def load(cfg: GenConfig) -> tuple[list[Conversation], int, int]:
    """The conversations to generate from, how many duplicates were dropped, and how many
    malformed records --skip-bad-lines left out."""
    convs: list[Conversation] = []
    duplicates = bad_lines = 0
    if cfg.prompts:
        convs, stats = prompts.load_conversations(cfg.prompts, fmt=cfg.format,
                                                  partition_field=cfg.partition_field,
                                                  skip_bad_lines=cfg.skip_bad_lines)
        duplicates = stats.duplicates
        if stats.bad_lines:
            _ui.warn(f"left out {stats.bad_lines:,} malformed prompt record(s) (--skip-bad-lines)")
        bad_lines = stats.bad_lines
    if cfg.dataset:
        convs += prompts.load_hf_dataset(cfg.dataset, split=cfg.dataset_split, fmt=cfg.format,
                                         partition_field=cfg.partition_field)
        convs, more = prompts.dedupe(convs)
        duplicates += more
    convs = prompts.select(convs, partition=cfg.partition, max_samples=cfg.max_samples,
                           shuffle_seed=cfg.shuffle_seed)
    return convs, duplicates, bad_lines


def make_chains(convs: list[Conversation], n: int) -> list[Chain]:
    chains = []
    for conv in convs:
        points = generation_points(conv)
        for index in range(n):
            ids = [make_sample_id(conv.source, {"messages": conv.messages[:point],
                                                "tools": conv.tools}, turn, index)
                   for turn, point in enumerate(points)]
            chains.append(Chain(conv, index, ids))
    return chains


async def check_tokenizer(backends: list[Backend], renderer: Renderer) -> None:
    """Refuse to start when a server tokenizes a probe differently from --tokenizer."""
    from eagle3kit.gen import servers

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
            raise UserError(f"{backend.name}: the tokenizer check failed: {exc} "
                            "(--no-tokenizer-check skips it)") from None
        if problem is not None:
            raise UserError(f"{backend.name}: {problem}. Pass the target model's own "
                            "tokenizer, or --no-tokenizer-check to go on anyway.")


def starting_points(chains: list[Chain], writer: DatasetWriter, cfg: GenConfig,
                    renderer: Renderer) -> list[tuple[Chain, int]]:
    """Where each chain continues (its first turn not in the dataset); earlier own answers
    come back from the dataset.

    A later turn stored while an earlier one is not (a run that lost a commit stored it) was
    built on an answer the dataset no longer holds: it is taken out and generated again
    after the turn before it, never taken as the end of its chain."""
    done = writer.done_ids
    starts: list[tuple[Chain, int]] = []
    stale: set[str] = set()
    for chain in chains:
        turn = resume_point(chain, done)
        if turn == len(chain.ids):
            continue
        starts.append((chain, turn))
        later = [sample_id for sample_id in chain.ids[turn + 1:] if sample_id in done]
        stale.update(later)
    if stale:
        writer.drop(stale)
        _ui.warn(f"{len(stale):,} later turn(s) were stored without the turn before them "
                 "(an earlier run lost that commit): they are generated again after it")
    needed = {c.ids[t] for c, turn in starts for t in range(turn)}
    if not needed:
        return starts
    committed = _committed_completions(cfg, needed)
    for chain, turn in starts:
        chain.turn = turn
        for t in range(turn):
            finish, ids = committed[chain.ids[t]]
            if finish != "stop":
                chain.blocked = f"turn {t}: {finish}"
            elif cfg.history == "own":
                chain.answers.append(renderer.answer_message(ids))
    return starts


def retry_failed(chains: list[Chain], writer: DatasetWriter, cfg: GenConfig) -> int:
    """Take the samples an earlier run recorded as skipped:failed out of the dataset, with the
    later turns skipped because of them, so that this run generates them again; returns how
    many failed samples that is. Only shards whose manifest counts show a failure are read."""
    failed = Dataset(cfg.out, warn_stray=False).ids_with_finish("skipped:failed")
    if not failed:
        return 0
    again: set[str] = set()
    retried = 0
    for chain in chains:
        for turn, sample_id in enumerate(chain.ids):
            if sample_id in failed:
                again.update(chain.ids[turn:])
                retried += 1
                break
    if retried:
        writer.drop(again)
        _ui.info(f"retrying {retried:,} sample(s) an earlier run recorded as failed "
                 "(--keep-failed leaves them)", cfg.output)
    return retried


def _committed_completions(cfg: GenConfig, needed: set[str]) -> dict[str, tuple[str, list]]:
    ds = Dataset(cfg.out, warn_stray=False)
    found = {}
    for index, sample_id in enumerate(ds.sample_ids()):
        if sample_id in needed:
            sample = ds[index]
            found[sample_id] = (sample.finish_reason, list(map(int, sample.completion_ids)))
    return found


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

        return [HfBackend.load(cfg.target, slots=cfg.concurrency,
                               trust_remote_code=cfg.trust_remote_code)]
    chat = {"chat_rebuild": text_rebuilder(renderer),
            "chat_template_kwargs": cfg.chat_template_kwargs} if cfg.api == "openai-chat" else {}
    return [await connect(s.url, cfg.api, s.concurrency or cfg.concurrency, cfg.api_key,
                          cfg.request_timeout, **chat) for s in cfg.servers]


def _context_len(cfg: GenConfig, backends: list[Backend]) -> int | None:
    known = [b.max_model_len for b in backends if b.max_model_len]
    limits = [x for x in (cfg.max_seq_len, min(known, default=None)) if x]
    return min(limits) if limits else None


async def _generate(cfg: GenConfig, renderer: Renderer, chains: list[Chain],
                    duplicates: int) -> GenResult:
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


async def _write(cfg: GenConfig, renderer: Renderer, chains: list[Chain],
                 backends: list[Backend], duplicates: int, started: float,
                 probe_ids: list[int] | None) -> GenResult:
    identity = renderer.identity()
    # Paths may differ between machines; the hashes say whether the rendering is the same.
    where = {k: identity.pop(k) for k in ("tokenizer", "chat_template_file")}
    # The served model is part of what a dataset holds: a rerun against servers that now
    # serve another one is refused like any other change of settings (--force accepts it).
    config = {**cfg.identity(), "renderer": identity, "model": _served_model(backends)}
    provenance = {"prompts": [str(p) for p in cfg.prompts], "dataset": cfg.dataset,
                  "servers": [b.name for b in backends], "engine": cfg.engine,
                  # Later stages (validate, extract, train) run the same shipped code.
                  "trust_remote_code": cfg.trust_remote_code, **where}
    total = sum(len(c.ids) for c in chains)
    writer = DatasetWriter(cfg.out, config=config, provenance=provenance,
                           **cfg.write.writer_options())
    _ui.warn_all(writer.warnings)
    with writer:
        writer.store_tokenizer(renderer.files())
        retried = retry_failed(chains, writer, cfg) if cfg.retry_failed else 0
        starts = starting_points(chains, writer, cfg, renderer)
        remaining = sum(len(c.ids) - t for c, t in starts)
        done_before = total - remaining
        with _ui.Progress("gen", total, cfg.output, initial=done_before) as progress:
            _partition_totals(progress, chains, starts)
            scheduler = Scheduler(cfg, renderer, backends, writer, progress,
                                  _context_len(cfg, backends), probe_ids)
            await scheduler.run(starts)
        _ui.table("gen", progress.columns, progress.summary_rows(), cfg.output)
        if scheduler.failure is not None:
            raise final_error(scheduler.failure)
        written = progress.done - done_before
    stats = scheduler.stats
    stopped = scheduler.signals > 0 and done_before + written < total
    if not scheduler.signals:
        check_complete(cfg, chains, total)
    return GenResult(
        output=str(cfg.out), total=total, previously_done=done_before, written=written,
        truncated=stats["truncated"], skipped=int(progress.counters.get("skipped", 0)),
        failed=stats["failed"], retries=stats["retries"], violations=stats["violations"],
        duplicates=duplicates, stopped=stopped, elapsed=round(time.monotonic() - started, 3),
        resume_command=continue_command(), filtered=stats["filtered"],
        generating_s=round(progress.elapsed, 3), retried_failed=retried,
        reprobes=stats["reprobes"],
        exit_code=EXIT_CODES[scheduler.first_signal] if stopped and scheduler.first_signal else 0,
    )


def check_complete(cfg: GenConfig, chains: list[Chain], total: int) -> None:
    """A run that ended by itself must leave every sample in the dataset (a sample that
    could not be generated is stored too, with its skipped: reason). Read back from the
    committed shards, so a loss anywhere on the way is found now, not by a later stage."""
    held = set(Dataset(cfg.out, warn_stray=False).sample_ids())
    missing = sum(sample_id not in held for chain in chains for sample_id in chain.ids)
    if missing:
        raise CheckFailed(
            f"{cfg.out}: the run ended with {missing:,} of the {total:,} samples the prompts "
            "call for not in the dataset (please report it); what is stored is intact. "
            f"Rerun to generate them: {continue_command()}")


def _served_model(backends: list[Backend]) -> str | None:
    """The one model every server serves (None for --engine hf, whose path may differ
    between machines); servers of different models are refused."""
    models = {b.name: b.info.model for b in backends if isinstance(b, HttpBackend)}
    if len(set(models.values())) > 1:
        listed = "; ".join(f"{name}: {model}" for name, model in models.items())
        raise UserError(f"the servers serve different models ({listed}): give --server URLs "
                        "of one model")
    return next(iter(models.values()), None)


def _partition_totals(progress: _ui.Progress, chains: list[Chain],
                      starts: list[tuple[Chain, int]]) -> None:
    totals: dict[str, int] = {}
    remaining: dict[str, int] = {}
    for chain in chains:
        totals[chain.conv.partition] = totals.get(chain.conv.partition, 0) + len(chain.ids)
    for chain, turn in starts:
        part = chain.conv.partition
        remaining[part] = remaining.get(part, 0) + len(chain.ids) - turn
    for part, total in totals.items():
        progress.set_total(f"partition:{part}", total, initial=total - remaining.get(part, 0))


def run(cfg: GenConfig, *, select: Callable[[list[Chain]], list[Chain]] | None = None
        ) -> GenResult:
    """Generate every sample the prompts call for; `select`, when given, narrows the
    chains to generate (plan's pilot). Their ids are the full run's, so a later run over
    all the prompts skips what `select` chose and was committed."""
    # httpx logs every request at INFO: thousands of lines an hour in a nohup log.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    convs, duplicates, bad_lines = load(cfg)
    if not convs:
        raise UserError("no prompts to generate from (check --partition and --max-samples)")
    renderer = Renderer.load(cfg.tokenizer, chat_template=cfg.chat_template,
                             chat_template_kwargs=cfg.chat_template_kwargs, system=cfg.system,
                             trust_remote_code=cfg.trust_remote_code)
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
    _report(result, cfg)
    return result


def _report(result: GenResult, cfg: GenConfig) -> None:
    opts = cfg.output
    if opts.json:
        _ui.print_json(asdict(result))
    _ui.kv("gen", [
        ("dataset", result.output),
        ("samples", f"{result.previously_done + result.written:,}/{result.total:,} "
                    f"({result.written:,} this run)"),
        ("truncated", f"{result.truncated:,}"),
        ("filtered", f"{result.filtered:,}"),
        ("skipped", f"{result.skipped:,} ({result.failed:,} failed after retries)"),
        ("retries", f"{result.retries:,}"),
        *([("retried failed", f"{result.retried_failed:,} from an earlier run")]
          if result.retried_failed else []),
        ("invariant violations", f"{result.violations:,}"),
        ("duplicate prompts", f"{result.duplicates:,} generated once"),
        *([("malformed prompt lines", f"{result.bad_lines:,} left out")]
          if result.bad_lines else []),
        ("elapsed", f"{result.elapsed:.1f}s"),
    ], opts)
    if result.stopped:
        _ui.warn(f"stopped before the end; continue with: {result.resume_command}")

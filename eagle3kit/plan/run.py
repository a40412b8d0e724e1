"""`eagle3kit plan`: hours, tokens and disk of a gen run, forecast from a pilot of it.

The pilot is a stratified sample of the run's prompts (every partition represented), generated
by gen itself into the run's own output dataset at the configured concurrency, so the gen
that follows skips it. From the pilot's committed samples (each carries its latency, lengths
and finish reason) plan forecasts the rest of the run:

- **wall time** by simulating the run's slots: gen keeps `slots` requests in flight and a slot
  takes the next prompt in order as soon as its request returns, so the run lasts
  Σ(request time) / slots while every slot is busy, plus a tail at the end where the last,
  longest requests finish alone. Each simulated request's time is drawn from the pilot's own
  requests of its partition, which were measured at this concurrency on these servers (so the
  server's batch size and decode speed are in them). A later turn of a conversation waits for
  the earlier one, as in gen.
- **ranges** by a two-level bootstrap: resample the pilot (what the pilot could have
  measured), then draw the run from that resample (what the run could turn out to be); the
  range holds the middle `COVERAGE` of the outcomes.
- **tokens and disk** the same way: what is already committed is counted exactly, the rest is
  drawn; the token dataset's bytes per token are the pilot's shards', hidden-state bytes per
  token come from `eagle3kit.format.hidden_bytes_per_token` for each codec.

The parts: the pilot and what the dataset holds (pilot.py), the slot model and the bootstrap
(slots.py), the result (result.py) and its report (report.py); this module puts them
together.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from eagle3kit.errors import UserError
from eagle3kit.format import CODECS, hidden_bytes_per_token
from eagle3kit.gen import GenConfig, ServerSpec, resume_point
from eagle3kit.plan.config import PlanConfig
from eagle3kit.plan.pilot import Committed, Observations, Pilot, read_committed, run_pilot
from eagle3kit.plan.report import percent, report
from eagle3kit.plan.result import Estimate, PartitionFigures, PlanResult
from eagle3kit.plan.slots import Job, Outcomes, bootstrap, exact_tail, jobs_of, makespan
from eagle3kit.target import check_layer_ids, config_dict

TIME_MARGIN = 0.05
"""Time ranges widen by this share each way: the servers' speed drifts between the pilot and
the run (other load, batching) by more than the pilot's own spread shows. Against the test
server the forecast falls within ±8% of the measured run (ten trials)."""
DRAW_BUDGET = 40_000_000
"""Most requests drawn over all replicates; bigger runs get fewer replicates (20 at least)."""
STEP_BUDGET = 1_500_000
"""Most requests simulated one by one over all replicates (a few seconds of Python)."""


def slot_count(cfg: GenConfig) -> int:
    if cfg.engine == "hf" or not cfg.servers:
        return cfg.concurrency
    # A --long-threshold run has a second pool of workers for long prompts on each server.
    total = 0
    for server in cast(list[ServerSpec], cfg.servers):  # GenConfig parsed every --server
        slots = server.concurrency or cfg.concurrency
        if cfg.long_threshold is not None:
            total += (cfg.short_concurrency or slots) + (cfg.long_concurrency or max(1, slots // 4))
        else:
            total += slots
    return total


def target_shape(cfg: PlanConfig) -> tuple[int | None, int | None]:
    """(hidden size, number of aux layers) from the flags or --target's config.json."""
    hidden, layers = cfg.hidden_size, None
    target = cfg.gen.target
    if target is not None and hidden is None:
        config = config_dict(
            Path(target), missing=f"--target {target}: cannot read its config.json (there is none)"
        )
        config = config.get("text_config", config)
        hidden, layers = config.get("hidden_size"), config.get("num_hidden_layers")
        if not isinstance(hidden, int):
            raise UserError(f"{Path(target) / 'config.json'}: no hidden_size; give --hidden-size")
    if cfg.layers is not None and isinstance(layers, int):
        assert not isinstance(cfg.layers, str)  # PlanConfig parsed --layers
        check_layer_ids(cfg.layers, layers)
    n_aux = len(cfg.layers) if cfg.layers is not None else 3  # EAGLE-3: low, middle, high
    return hidden, (n_aux if hidden is not None else None)


def run(cfg: PlanConfig) -> PlanResult:
    hidden_size, n_aux = target_shape(cfg)
    pilot = run_pilot(cfg)
    pilot_ids = {sid for chain in pilot.chosen for sid in chain.ids}
    committed = read_committed(cfg.gen.out, pilot_ids)
    names = list(dict.fromkeys(chain.conv.partition for chain in pilot.chains))
    slots = slot_count(cfg.gen)
    costs = overheads(pilot, committed, slots)
    pools = _pools(names, committed)
    start = {id(c): resume_point(c, committed.ids) for c in pilot.chains}
    remaining = jobs_of(pilot.chains, start, names)
    full = jobs_of(pilot.chains, {}, names)
    stepped = 2 * min(len(full.parts), exact_tail(slots))
    replicates = max(
        20,
        min(
            cfg.replicates,
            DRAW_BUDGET // max(1, 2 * len(full.parts)),
            STEP_BUDGET // max(1, stepped),
        ),
    )
    outcomes = bootstrap([pools[n] for n in names], remaining, full, slots, replicates, cfg.seed)
    result = _result(
        cfg,
        pilot,
        committed,
        names,
        pools,
        remaining,
        full,
        slots,
        outcomes,
        costs,
        (hidden_size, n_aux),
    )
    report(result, cfg.gen.output)
    return result


@dataclass
class Overheads:
    """Time a run spends besides its requests' own latencies, measured on the pilot."""

    fixed: float = 0.0
    """Connecting, the tokenizer check, opening the dataset, the first prompts rendered
    before the first request, the final commit: once per run, however long."""
    load: float = 0.0
    """Loading the prompts and the tokenizer before any of that."""
    replay: float | None = None
    """The slot model replaying the pilot's own requests."""


def overheads(pilot: Pilot, committed: Committed, slots: int) -> Overheads:
    if not pilot.written or pilot.written != pilot.total:
        return Overheads()  # the pilot was (partly) done before: its timing is not this run's
    ids = [s for c in pilot.chosen for s in c.ids]
    if any(s not in committed.rows for s in ids):
        return Overheads()
    latency = np.array([committed.rows[s][1] for s in ids])
    replay = makespan(latency, [len(c.ids) for c in pilot.chosen], slots)
    # What the pilot took beyond its replay is start-up (the first connections and prompts):
    # the client's work per request shows in the latencies it measures, under the same load.
    return Overheads(max(0.0, pilot.elapsed - replay), max(0.0, pilot.wall - pilot.elapsed), replay)


def _pools(names: list[str], committed: Committed) -> dict[str, Observations]:
    rows: dict[str, list[tuple[float, int, int, bool]]] = {n: [] for n in names}
    # In sample-id order, not commit order: the same pilot gives the same draws.
    for _, (part, *row) in sorted(committed.rows.items()):
        rows.setdefault(part, []).append(tuple(row))  # type: ignore[arg-type]
    everything = [r for rs in rows.values() for r in rs]
    if not everything:
        raise UserError("the pilot produced no samples to measure (see the warnings above)")
    # A partition without a pilot sample (none could be sent) borrows everyone's.
    return {n: Observations.of(rows[n] or everything) for n in names}


def _result(
    cfg: PlanConfig,
    pilot: Pilot,
    committed: Committed,
    names: list[str],
    pools: dict[str, Observations],
    remaining: Job,
    full: Job,
    slots: int,
    outcomes: Outcomes,
    costs: Overheads,
    shape: tuple[int | None, int | None],
) -> PlanResult:
    start_up = costs.fixed + costs.load
    pilot_tokens = sum(
        committed.rows[s][2] for c in pilot.chosen for s in c.ids if s in committed.rows
    )
    tokens = Estimate.of(np.array(outcomes.tokens), committed.tokens)
    bpt = committed.shard_bytes / max(1, committed.tokens)
    partitions = _partition_figures(names, pools, full, remaining)
    truncated = np.concatenate([p.truncated for p in pools.values()])
    rate = 1 / pilot.generating if pilot.written and pilot.generating > 0 else None
    return PlanResult(
        output=str(cfg.gen.out),
        samples=len(full.parts),
        done=len(full.parts) - len(remaining.parts),
        remaining=len(remaining.parts),
        slots=slots,
        pilot_requests=pilot.requests,
        pilot_elapsed_s=round(pilot.elapsed, 3),
        pilot_req_per_s=pilot.requests * rate if rate else None,
        pilot_tok_per_s=pilot_tokens * rate if rate else None,
        pilot_simulated_s=costs.replay,
        startup_s=round(start_up, 3),
        truncation=float(truncated.mean()) if len(truncated) else 0.0,
        max_tokens=cfg.gen.max_tokens,
        partitions=partitions,
        wall_time_s=Estimate.of(
            np.array(outcomes.wall), start_up if remaining.turns else 0.0, TIME_MARGIN
        ),
        full_wall_time_s=Estimate.of(np.array(outcomes.full_wall), start_up, TIME_MARGIN),
        completion_tokens=Estimate.of(np.array(outcomes.completion), committed.completion),
        total_tokens=tokens,
        token_dataset_bytes=_plus(tokens.scaled(bpt), committed.dir_bytes - committed.shard_bytes),
        bytes_per_token=round(bpt, 3),
        hidden=_hidden(tokens, *shape),
        train=_train(cfg, tokens),
        extract=_extract(cfg, tokens),
        notes=_notes(partitions, pools, full, slots, outcomes, cfg.gen.max_tokens),
    )


def _plus(e: Estimate, x: float) -> Estimate:
    return Estimate(e.value + x, e.low + x, e.high + x)


def _partition_figures(
    names: list[str], pools: dict[str, Observations], full: Job, remaining: Job
) -> list[PartitionFigures]:
    counts = np.bincount(full.parts, minlength=len(names))
    left = np.bincount(remaining.parts, minlength=len(names))
    work = np.array([counts[k] * pools[n].latency.mean() for k, n in enumerate(names)])
    figures = []
    for k, name in enumerate(names):
        pool = pools[name]
        comp = pool.completion
        p50, p90, p99 = np.percentile(comp, [50, 90, 99])
        figures.append(
            PartitionFigures(
                name=name,
                samples=int(counts[k]),
                remaining=int(left[k]),
                pilot=len(pool),
                mean_tokens=round(float(comp.mean()), 1),
                p50_tokens=float(p50),
                p90_tokens=float(p90),
                p99_tokens=float(p99),
                max_tokens=int(comp.max()),
                truncation=round(float(pool.truncated.mean()), 4),
                mean_latency_s=round(float(pool.latency.mean()), 4),
                prompt_share=round(float(counts[k] / max(1, counts.sum())), 4),
                time_share=round(float(work[k] / work.sum()), 4) if work.sum() > 0 else 0.0,
            )
        )
    return figures


def _hidden(tokens: Estimate, hidden_size: int | None, n_aux: int | None) -> dict[str, Any]:
    """Bytes per codec: extract stores every token of every sample (prompt and completion)."""
    if hidden_size is None or n_aux is None:
        return {}
    return {
        "hidden_size": hidden_size,
        "n_aux": n_aux,
        "tokens": asdict(tokens),
        "bytes": {
            codec: asdict(tokens.scaled(hidden_bytes_per_token(hidden_size, n_aux, codec)))
            for codec in CODECS
        },
    }


def _train(cfg: PlanConfig, tokens: Estimate) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if cfg.batch_tokens:
        steps = Estimate(
            *(math.ceil(x / cfg.batch_tokens) for x in (tokens.value, tokens.low, tokens.high))
        )
        out["batch_tokens"], out["steps_per_epoch"] = cfg.batch_tokens, asdict(steps)
    if cfg.train_tokens_per_s:
        out["tokens_per_s"] = cfg.train_tokens_per_s
        out["epoch_s"] = asdict(tokens.scaled(1 / cfg.train_tokens_per_s))
    return out


def _extract(cfg: PlanConfig, tokens: Estimate) -> dict[str, Any]:
    """extract reads every token of every sample, at the throughput given."""
    if not cfg.extract_tokens_per_s:
        return {}
    return {
        "tokens_per_s": cfg.extract_tokens_per_s,
        "time_s": asdict(tokens.scaled(1 / cfg.extract_tokens_per_s)),
    }


def _notes(
    partitions: list[PartitionFigures],
    pools: dict[str, Observations],
    full: Job,
    slots: int,
    outcomes: Outcomes,
    max_tokens: int,
) -> list[str]:
    """What dominates the time, in a sentence each."""
    notes = []
    heavy = max(partitions, key=lambda p: p.time_share - p.prompt_share)
    if len(partitions) > 1 and heavy.time_share > 1.5 * heavy.prompt_share:
        notes.append(
            f"the {heavy.name} partition is {percent(heavy.prompt_share)} of prompts and "
            f"{percent(heavy.time_share)} of the time"
        )
    counts = np.bincount(full.parts, minlength=len(partitions))
    work = sum(counts[k] * pools[p.name].latency.mean() for k, p in enumerate(partitions))
    cut = sum(
        counts[k] * (pools[p.name].latency * pools[p.name].truncated).mean()
        for k, p in enumerate(partitions)
    )
    share = sum(counts[k] * p.truncation for k, p in enumerate(partitions)) / max(1, counts.sum())
    if share > 0 and work > 0:
        notes.append(
            f"samples cut at --max-tokens {max_tokens} are {percent(share)} of samples "
            f"and {percent(cut / work)} of the time"
        )
    wall = float(np.median(outcomes.full_wall))
    if wall > 0 and work > 0:
        busy = work / slots / wall
        if busy < 0.9:
            notes.append(
                f"the slots are busy {percent(busy)} of the run: its end waits on the "
                "longest requests while other slots are idle"
            )
    return notes

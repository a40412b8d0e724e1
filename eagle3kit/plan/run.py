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
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections import deque
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import numpy as np

from eagle3kit import _ui
from eagle3kit.errors import UserError
from eagle3kit.format import CODECS, Dataset, hidden_bytes_per_token
from eagle3kit.gen import Chain, GenConfig, ServerSpec, resume_point
from eagle3kit.plan.config import PlanConfig
from eagle3kit.target import check_layer_ids, config_dict

PILOT_SHARE = 0.01
PILOT_MIN = 200
COVERAGE = 0.95
"""The share of bootstrap outcomes a stated range holds."""
TIME_MARGIN = 0.05
"""Time ranges widen by this share each way: the servers' speed drifts between the pilot and
the run (other load, batching) by more than the pilot's own spread shows. Against the test
server the forecast falls within ±8% of the measured run (ten trials)."""
DRAW_BUDGET = 40_000_000
"""Most requests drawn over all replicates; bigger runs get fewer replicates (20 at least)."""
STEP_BUDGET = 1_500_000
"""Most requests simulated one by one over all replicates (a few seconds of Python)."""
EXACT_TAIL = 4_000
"""Requests at the end of a run simulated one by one (at least 20 per slot); the ones before
only add up: every slot is busy there."""


class PilotStopped(UserError):
    exit_code = 130


# Results ------------------------------------------------------------------------------------
@dataclass
class Estimate:
    value: float
    low: float
    high: float

    @classmethod
    def of(cls, outcomes: np.ndarray, shift: float = 0.0, margin: float = 0.0) -> Estimate:
        """The median and the middle COVERAGE of bootstrap outcomes, widened by margin."""
        tail = (1 - COVERAGE) / 2 * 100
        low, mid, high = np.percentile(outcomes, [tail, 50, 100 - tail])
        return cls(float(mid + shift), float(low * (1 - margin) + shift),
                   float(high * (1 + margin) + shift))

    def scaled(self, factor: float) -> Estimate:
        return Estimate(self.value * factor, self.low * factor, self.high * factor)


@dataclass
class PartitionFigures:
    name: str
    samples: int
    """Samples the run makes for this partition."""
    remaining: int
    pilot: int
    """Pilot samples measured."""
    mean_tokens: float
    p50_tokens: float
    p90_tokens: float
    p99_tokens: float
    max_tokens: int
    truncation: float
    """Share of the pilot's samples cut at the max tokens."""
    mean_latency_s: float
    prompt_share: float
    time_share: float
    """Share of the run's request time (slot-seconds) this partition takes."""


@dataclass
class PlanResult:
    output: str
    samples: int
    done: int
    """Samples already in the dataset (the pilot's and any earlier run's)."""
    remaining: int
    slots: int
    pilot_requests: int
    """Requests the pilot sent in this run (0 when it was already done)."""
    pilot_elapsed_s: float
    pilot_req_per_s: float | None
    pilot_tok_per_s: float | None
    pilot_simulated_s: float | None
    """The slot model replaying the pilot's own requests (the pilot took pilot_elapsed_s)."""
    startup_s: float
    """Loading, connecting, checks and the final commit: in every run, on top of the slots'."""
    truncation: float
    max_tokens: int
    partitions: list[PartitionFigures]
    wall_time_s: Estimate
    """The gen that follows: the samples not yet in the dataset."""
    full_wall_time_s: Estimate
    """The whole run from an empty dataset, pilot included."""
    completion_tokens: Estimate
    total_tokens: Estimate
    token_dataset_bytes: Estimate
    bytes_per_token: float
    hidden: dict[str, Any] = field(default_factory=dict)
    """hidden_size, n_aux, tokens, and bytes per codec (empty without a hidden size)."""
    train: dict[str, Any] = field(default_factory=dict)
    extract: dict[str, Any] = field(default_factory=dict)
    """tokens_per_s and time_s, with --extract-tokens-per-s."""
    notes: list[str] = field(default_factory=list)
    coverage: float = COVERAGE


# The pilot ----------------------------------------------------------------------------------
def pilot_size(total: int, pilot: float | None) -> int:
    if pilot is None:
        return min(total, max(math.ceil(PILOT_SHARE * total), PILOT_MIN))
    return min(total, int(pilot) if pilot >= 1 else max(1, math.ceil(pilot * total)))


def allocate(sizes: dict[str, int], n: int) -> dict[str, int]:
    """Pilot prompts per partition: a floor for each (a small partition with long answers can
    dominate the run: it needs enough samples to be measured), the rest in proportion."""
    floor = {p: min(size, max(1, n // (2 * len(sizes)))) for p, size in sizes.items()}
    left = max(0, n - sum(floor.values()))
    total = sum(sizes.values())
    share = {p: left * size / total for p, size in sizes.items()}
    alloc = {p: min(sizes[p], floor[p] + int(share[p])) for p in sizes}
    # Largest remainders take what rounding down left over.
    for p in sorted(sizes, key=lambda p: share[p] - int(share[p]), reverse=True):
        if sum(alloc.values()) >= n:
            break
        alloc[p] = min(sizes[p], alloc[p] + 1)
    return alloc


def choose_pilot(chains: list[Chain], n: int, seed: int) -> list[Chain]:
    """A stratified sample of n chains, in the run's own order."""
    by_part: dict[str, list[int]] = {}
    for i, chain in enumerate(chains):
        by_part.setdefault(chain.conv.partition, []).append(i)
    alloc = allocate({p: len(ix) for p, ix in by_part.items()}, n)
    rng = random.Random(seed)
    chosen = {i for p, ix in by_part.items() for i in rng.sample(ix, alloc[p])}
    return [chain for i, chain in enumerate(chains) if i in chosen]


@dataclass
class Pilot:
    chains: list[Chain]
    """Every chain of the run, in gen's order."""
    chosen: list[Chain]
    requests: int
    written: int
    """Samples the pilot stored in this run (skipped ones included)."""
    total: int
    """Samples the pilot's prompts call for."""
    elapsed: float
    """gen's own elapsed time: connecting and checks, generating, the final commit."""
    generating: float
    """From the first request to the last answer."""
    wall: float
    """The whole gen.run call: elapsed plus loading the prompts and the tokenizer."""


def run_pilot(cfg: PlanConfig) -> Pilot:
    from eagle3kit import gen

    seen: dict[str, list[Chain]] = {}

    def select(chains: list[Chain]) -> list[Chain]:
        seen["all"] = chains
        # (cast: PlanConfig parsed --pilot to a number)
        pilot = cast(float | None, cfg.pilot)
        seen["chosen"] = choose_pilot(chains, pilot_size(len(chains), pilot), cfg.seed)
        return seen["chosen"]

    # The pilot's own summary stays off stdout: --json there is plan's.
    quiet_json = replace(cfg.gen.output, json=False)
    started = time.monotonic()
    result = gen.run(replace(cfg.gen, output=quiet_json), select=select)
    wall = time.monotonic() - started
    if result.stopped:
        stopped = PilotStopped("the pilot was stopped before it finished; what it generated "
                               "is kept: rerun the same command to complete it")
        stopped.exit_code = result.exit_code or PilotStopped.exit_code  # 143 after SIGTERM
        raise stopped
    return Pilot(seen["all"], seen["chosen"], result.written - result.skipped, result.written,
                 result.total, result.elapsed, result.generating_s, wall)


# What the dataset holds ---------------------------------------------------------------------
@dataclass
class Observations:
    """Per-sample figures of one partition's pilot samples, as arrays."""

    latency: np.ndarray
    completion: np.ndarray
    tokens: np.ndarray
    """Prompt + completion: what training reads and extract stores states for."""
    truncated: np.ndarray

    @classmethod
    def of(cls, rows: list[tuple[float, int, int, bool]]) -> Observations:
        lat, comp, tok, trunc = (np.array(col, dtype=np.float64) for col in zip(*rows,
                                                                                 strict=True))
        return cls(lat, comp, tok, trunc)

    def __len__(self) -> int:
        return len(self.latency)


@dataclass
class Committed:
    ids: set[str]
    rows: dict[str, tuple[str, float, int, int, bool]]
    """sample id -> (partition, latency, completion, tokens, truncated), for the wanted ids."""
    completion: int
    tokens: int
    shard_bytes: int
    dir_bytes: int


def read_committed(path: Path, wanted: set[str]) -> Committed:
    ds = Dataset(path, warn_stray=False)
    ids: set[str] = set()
    rows = {}
    completion = tokens = 0
    for shard in ds.columns():
        lengths = shard.lengths
        comp = lengths - shard.prompt_lens
        completion += int(comp.sum())
        tokens += int(lengths.sum())
        for i, sample_id in enumerate(shard.ids):
            ids.add(sample_id)
            if sample_id in wanted:
                meta = shard.meta[i]
                part = shard.partition_names[shard.partition_index[i]]
                rows[sample_id] = (part, float(meta.get("latency") or 0.0), int(comp[i]),
                                   int(lengths[i]), meta["finish_reason"] == "length")
    shard_bytes = ds.shard_bytes
    dir_bytes = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return Committed(ids, rows, completion, tokens, shard_bytes, dir_bytes)


# The slot model -----------------------------------------------------------------------------
def fifo_makespan(times: np.ndarray, slots: int) -> float:
    """Seconds until `slots` workers, each taking the next request when free, finish them."""
    if len(times) <= slots:
        return float(times.max()) if len(times) else 0.0
    heap = times[:slots].tolist()
    heapq.heapify(heap)
    replace_min = heapq.heapreplace
    for t in times[slots:].tolist():
        replace_min(heap, heap[0] + t)
    return max(heap)


def chain_makespan(times: np.ndarray, turns: list[int], slots: int) -> float:
    """fifo_makespan where chain k's `turns[k]` requests (consecutive in `times`) run in order:
    a turn joins the back of the queue when the one before it returns, as in gen."""
    firsts = np.concatenate([[0], np.cumsum(turns)[:-1]]).tolist()
    times_list = times.tolist()
    look_ahead = 2 * slots + 16  # gen's feeder keeps about this many prompts queued
    pending = deque(range(len(turns)))
    queue: deque[tuple[int, int]] = deque()
    running: list[tuple[float, int, int]] = []
    now = 0.0
    free = slots
    while True:
        while len(queue) < look_ahead and pending:
            queue.append((pending.popleft(), 0))
        while free and queue:
            k, turn = queue.popleft()
            heapq.heappush(running, (now + times_list[firsts[k] + turn], k, turn))
            free -= 1
        if not running:
            return now
        now, k, turn = heapq.heappop(running)
        free += 1
        if turn + 1 < turns[k]:
            queue.append((k, turn + 1))


def exact_tail(slots: int) -> int:
    return max(EXACT_TAIL, 20 * slots)


def makespan(times: np.ndarray, turns: list[int], slots: int) -> float:
    """The run's duration: exact over its last requests, summed before them (every slot is
    busy there, so they take their total time over the slots)."""
    tail = exact_tail(slots)
    if len(times) == len(turns):  # single-turn: the fast path
        cut = max(0, len(times) - tail)
        return float(times[:cut].sum()) / slots + fifo_makespan(times[cut:], slots)
    cut_chains, acc = len(turns), 0
    while cut_chains > 0 and acc < tail:
        cut_chains -= 1
        acc += turns[cut_chains]
    cut = len(times) - acc
    return float(times[:cut].sum()) / slots + chain_makespan(times[cut:], turns[cut_chains:],
                                                              slots)


@dataclass
class Job:
    """The requests to simulate: each one's partition (an index), grouped into chains."""

    parts: np.ndarray
    turns: list[int]


def jobs_of(chains: list[Chain], start: dict[int, int], names: list[str]) -> Job:
    index = {name: k for k, name in enumerate(names)}
    parts: list[int] = []
    turns: list[int] = []
    for chain in chains:
        left = len(chain.ids) - start.get(id(chain), 0)
        if left > 0:
            parts += [index[chain.conv.partition]] * left
            turns.append(left)
    return Job(np.array(parts, dtype=np.int64), turns)


@dataclass
class Outcomes:
    wall: list[float] = field(default_factory=list)
    full_wall: list[float] = field(default_factory=list)
    completion: list[float] = field(default_factory=list)
    tokens: list[float] = field(default_factory=list)


def bootstrap(pools: list[Observations], remaining: Job, full: Job, slots: int,
              replicates: int, seed: int) -> Outcomes:
    """Two-level bootstrap: resample each partition's pilot, then draw the run from it."""
    rng = np.random.default_rng(seed)
    sizes = np.array([len(pool) for pool in pools])
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    flat = {name: np.concatenate([getattr(pool, name) for pool in pools])
            for name in ("latency", "completion", "tokens")}
    out = Outcomes()
    for _ in range(replicates):
        # Level one: partition k's pilot, resampled, in resampled[offsets[k]:][:sizes[k]].
        resampled = offsets.repeat(sizes) + (rng.random(sizes.sum()) * sizes.repeat(sizes)
                                             ).astype(np.int64)

        def draw(job: Job, again: np.ndarray = resampled) -> np.ndarray:
            """Level two: for each request of `job`, a sample of its partition's resample."""
            pick = (rng.random(len(job.parts)) * sizes[job.parts]).astype(np.int64)
            return again[offsets[job.parts] + pick]

        picks = draw(remaining)
        out.wall.append(makespan(flat["latency"][picks], remaining.turns, slots))
        out.completion.append(flat["completion"][picks].sum())
        out.tokens.append(flat["tokens"][picks].sum())
        out.full_wall.append(makespan(flat["latency"][draw(full)], full.turns, slots))
    return out


# Putting it together ------------------------------------------------------------------------
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
        config = config_dict(Path(target), missing=f"--target {target}: cannot read its "
                                                    "config.json (there is none)")
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
    replicates = max(20, min(cfg.replicates, DRAW_BUDGET // max(1, 2 * len(full.parts)),
                             STEP_BUDGET // max(1, stepped)))
    outcomes = bootstrap([pools[n] for n in names], remaining, full, slots, replicates,
                         cfg.seed)
    result = _result(cfg, pilot, committed, names, pools, remaining, full, slots, outcomes,
                     costs, (hidden_size, n_aux))
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
    return Overheads(max(0.0, pilot.elapsed - replay), max(0.0, pilot.wall - pilot.elapsed),
                     replay)


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


def _result(cfg: PlanConfig, pilot: Pilot, committed: Committed, names: list[str],
            pools: dict[str, Observations], remaining: Job, full: Job, slots: int,
            outcomes: Outcomes, costs: Overheads, shape: tuple[int | None, int | None]
            ) -> PlanResult:
    start_up = costs.fixed + costs.load
    pilot_tokens = sum(committed.rows[s][2] for c in pilot.chosen for s in c.ids
                       if s in committed.rows)
    tokens = Estimate.of(np.array(outcomes.tokens), committed.tokens)
    bpt = committed.shard_bytes / max(1, committed.tokens)
    partitions = _partition_figures(names, pools, full, remaining)
    truncated = np.concatenate([p.truncated for p in pools.values()])
    rate = 1 / pilot.generating if pilot.written and pilot.generating > 0 else None
    return PlanResult(
        output=str(cfg.gen.out), samples=len(full.parts),
        done=len(full.parts) - len(remaining.parts), remaining=len(remaining.parts),
        slots=slots, pilot_requests=pilot.requests, pilot_elapsed_s=round(pilot.elapsed, 3),
        pilot_req_per_s=pilot.requests * rate if rate else None,
        pilot_tok_per_s=pilot_tokens * rate if rate else None,
        pilot_simulated_s=costs.replay, startup_s=round(start_up, 3),
        truncation=float(truncated.mean()) if len(truncated) else 0.0,
        max_tokens=cfg.gen.max_tokens, partitions=partitions,
        wall_time_s=Estimate.of(np.array(outcomes.wall), start_up if remaining.turns else 0.0,
                                TIME_MARGIN),
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


def _partition_figures(names: list[str], pools: dict[str, Observations], full: Job,
                       remaining: Job) -> list[PartitionFigures]:
    counts = np.bincount(full.parts, minlength=len(names))
    left = np.bincount(remaining.parts, minlength=len(names))
    work = np.array([counts[k] * pools[n].latency.mean() for k, n in enumerate(names)])
    figures = []
    for k, name in enumerate(names):
        pool = pools[name]
        comp = pool.completion
        p50, p90, p99 = np.percentile(comp, [50, 90, 99])
        figures.append(PartitionFigures(
            name=name, samples=int(counts[k]), remaining=int(left[k]), pilot=len(pool),
            mean_tokens=round(float(comp.mean()), 1), p50_tokens=float(p50),
            p90_tokens=float(p90), p99_tokens=float(p99), max_tokens=int(comp.max()),
            truncation=round(float(pool.truncated.mean()), 4),
            mean_latency_s=round(float(pool.latency.mean()), 4),
            prompt_share=round(float(counts[k] / max(1, counts.sum())), 4),
            time_share=round(float(work[k] / work.sum()), 4) if work.sum() > 0 else 0.0))
    return figures


def _hidden(tokens: Estimate, hidden_size: int | None, n_aux: int | None) -> dict[str, Any]:
    """Bytes per codec: extract stores every token of every sample (prompt and completion)."""
    if hidden_size is None or n_aux is None:
        return {}
    return {
        "hidden_size": hidden_size, "n_aux": n_aux, "tokens": asdict(tokens),
        "bytes": {codec: asdict(tokens.scaled(hidden_bytes_per_token(hidden_size, n_aux, codec)))
                  for codec in CODECS},
    }


def _train(cfg: PlanConfig, tokens: Estimate) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if cfg.batch_tokens:
        steps = Estimate(*(math.ceil(x / cfg.batch_tokens)
                           for x in (tokens.value, tokens.low, tokens.high)))
        out["batch_tokens"], out["steps_per_epoch"] = cfg.batch_tokens, asdict(steps)
    if cfg.train_tokens_per_s:
        out["tokens_per_s"] = cfg.train_tokens_per_s
        out["epoch_s"] = asdict(tokens.scaled(1 / cfg.train_tokens_per_s))
    return out


def _extract(cfg: PlanConfig, tokens: Estimate) -> dict[str, Any]:
    """extract reads every token of every sample, at the throughput given."""
    if not cfg.extract_tokens_per_s:
        return {}
    return {"tokens_per_s": cfg.extract_tokens_per_s,
            "time_s": asdict(tokens.scaled(1 / cfg.extract_tokens_per_s))}


def _notes(partitions: list[PartitionFigures], pools: dict[str, Observations], full: Job,
           slots: int, outcomes: Outcomes, max_tokens: int) -> list[str]:
    """What dominates the time, in a sentence each."""
    notes = []
    heavy = max(partitions, key=lambda p: p.time_share - p.prompt_share)
    if len(partitions) > 1 and heavy.time_share > 1.5 * heavy.prompt_share:
        notes.append(f"the {heavy.name} partition is {_pct(heavy.prompt_share)} of prompts and "
                     f"{_pct(heavy.time_share)} of the time")
    counts = np.bincount(full.parts, minlength=len(partitions))
    work = sum(counts[k] * pools[p.name].latency.mean() for k, p in enumerate(partitions))
    cut = sum(counts[k] * (pools[p.name].latency * pools[p.name].truncated).mean()
              for k, p in enumerate(partitions))
    share = sum(counts[k] * p.truncation for k, p in enumerate(partitions)) / max(1, counts.sum())
    if share > 0 and work > 0:
        notes.append(f"samples cut at --max-tokens {max_tokens} are {_pct(share)} of samples "
                     f"and {_pct(cut / work)} of the time")
    wall = float(np.median(outcomes.full_wall))
    if wall > 0 and work > 0:
        busy = work / slots / wall
        if busy < 0.9:
            notes.append(f"the slots are busy {_pct(busy)} of the run: its end waits on the "
                         "longest requests while other slots are idle")
    return notes


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%" if x >= 0.01 else f"{100 * x:.1f}%"


# Reporting ----------------------------------------------------------------------------------
def report(result: PlanResult, opts: _ui.OutputOptions) -> None:
    if opts.json:
        _ui.print_json(asdict(result))
    pilot = [("samples", f"{result.samples:,} ({result.done:,} in the dataset, "
                         f"{result.remaining:,} to generate)"),
             ("slots", f"{result.slots:,} requests in flight")]
    if result.pilot_requests:
        pilot += [("pilot", f"{result.pilot_requests:,} requests in {_hms(result.pilot_elapsed_s)}"
                            f": {result.pilot_req_per_s:.3g} req/s, "
                            f"{_ui.human_count(result.pilot_tok_per_s or 0)} tok/s")]
        if result.pilot_simulated_s is not None:
            pilot += [("slot model", f"replays the pilot's requests in "
                                     f"{_hms(result.pilot_simulated_s)}; the rest, "
                                     f"{_hms(result.startup_s)}, is start-up (once per run)")]
    pilot += [("truncation", f"{_pct(result.truncation)} of pilot samples hit "
                             f"--max-tokens {result.max_tokens}")]
    _ui.kv(f"plan: {result.output}", pilot, opts)
    _ui.table("pilot, by partition", [
        "partition", "samples", "pilot", "mean tok", "p50", "p90", "p99", "trunc %",
        "s/request", "% prompts", "% time"], [
        [p.name, p.samples, p.pilot, round(p.mean_tokens), round(p.p50_tokens),
         round(p.p90_tokens), round(p.p99_tokens), round(100 * p.truncation, 1),
         round(p.mean_latency_s, 3), round(100 * p.prompt_share, 1), round(100 * p.time_share, 1)]
        for p in result.partitions], opts)
    _ui.table(f"forecast (range: {_pct(result.coverage)} of outcomes)",
              ["", "forecast", "range"], _forecast_rows(result), opts)
    for note in result.notes:
        _ui.info(f"note: {note}", opts)


def _forecast_rows(r: PlanResult) -> list[list[object]]:
    def row(name: str, e: Estimate | dict, fmt) -> list[object]:
        e = Estimate(**e) if isinstance(e, dict) else e
        return [name, fmt(e.value), f"{fmt(e.low)} – {fmt(e.high)}"]

    rows = [row("wall time, the gen that follows", r.wall_time_s, _hms),
            row("wall time, the whole run", r.full_wall_time_s, _hms),
            row("completion tokens", r.completion_tokens, _ui.human_count),
            row("tokens (prompt + completion)", r.total_tokens, _ui.human_count),
            row("token dataset", r.token_dataset_bytes, _ui.human_bytes)]
    if r.hidden:
        shape = f"H={r.hidden['hidden_size']}, {r.hidden['n_aux']} aux"
        rows += [row(f"hidden states, {codec} ({shape})", e, _ui.human_bytes)
                 for codec, e in r.hidden["bytes"].items()]
    if r.extract:
        rows.append(row(f"extract time ({_ui.human_count(r.extract['tokens_per_s'])} tok/s)",
                        r.extract["time_s"], _hms))
    if "steps_per_epoch" in r.train:
        rows.append(row(f"train steps / epoch ({_ui.human_count(r.train['batch_tokens'])} tok)",
                        r.train["steps_per_epoch"], lambda x: f"{x:,.0f}"))
    if "epoch_s" in r.train:
        rows.append(row("train time / epoch", r.train["epoch_s"], _hms))
    return rows


def _hms(seconds: float) -> str:
    s = max(0.0, seconds)
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"

"""plan's slot model: how long gen's `slots` workers take over a run's requests (each slot
takes the next prompt as soon as its request returns; a later turn waits for the earlier
one), and the two-level bootstrap that draws the run from the pilot's requests."""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from eagle3kit.gen import Chain
from eagle3kit.plan.pilot import Observations

EXACT_TAIL = 4_000
"""Requests at the end of a run simulated one by one (at least 20 per slot); the ones before
only add up: every slot is busy there."""


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
    return float(times[:cut].sum()) / slots + chain_makespan(times[cut:], turns[cut_chains:], slots)


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


def bootstrap(
    pools: list[Observations], remaining: Job, full: Job, slots: int, replicates: int, seed: int
) -> Outcomes:
    """Two-level bootstrap: resample each partition's pilot, then draw the run from it."""
    rng = np.random.default_rng(seed)
    sizes = np.array([len(pool) for pool in pools])
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    flat = {
        name: np.concatenate([getattr(pool, name) for pool in pools])
        for name in ("latency", "completion", "tokens")
    }
    out = Outcomes()
    for _ in range(replicates):
        # Level one: partition k's pilot, resampled, in resampled[offsets[k]:][:sizes[k]].
        resampled = offsets.repeat(sizes) + (rng.random(sizes.sum()) * sizes.repeat(sizes)).astype(
            np.int64
        )

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

"""What the drafter is fed: the target batches of a run's training and held-out items, from
stored states (offline), the target in the loop (--online) or the servers (--server, while
`serving`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np

import eagle3kit.train.data as tdata
from eagle3kit._ranks import Ranks
from eagle3kit.train.config import TrainConfig
from eagle3kit.train.target import OfflineTarget, OnlineTarget, TargetBatch

if TYPE_CHECKING:
    from eagle3kit.train.online_server import ServedStates


class Feed:
    """The target batches of `sources`' items: `target` makes them from the items' tokens
    (OnlineTarget) or from their states (OfflineTarget: a hidden dataset's, or with --server
    the fetched ones)."""

    def __init__(
        self,
        cfg: TrainConfig,
        ranks: Ranks,
        sources: list[tdata.DataSource],
        pool: tdata.Pool,
        plan: tdata.BatchPlan,
        layers: list[int],
        hidden_size: int,
        target: OnlineTarget | OfflineTarget,
    ) -> None:
        self.cfg, self.ranks = cfg, ranks
        self.sources, self.pool, self.plan = sources, pool, plan
        self.layers, self.hidden_size = layers, hidden_size
        self.target = target
        self.served: ServedStates | None = None
        """--server: this rank's states fetched ahead (while `serving`)."""

    def my_parts(self, items: list[tdata.Item]) -> list[list[tdata.Item]]:
        """This rank's micro-batches of a step's global batch (`items`): of the global
        batch cut into ranks x grad_accum parts of about equal tokens, rank r's are
        r*A .. r*A+A-1."""
        accum, rank = self.cfg.grad_accum, self.ranks.rank
        parts = tdata.split_parts(items, self.ranks.world * accum)
        return parts[rank * accum : (rank + 1) * accum]

    def batch(
        self,
        items: list[tdata.Item],
        tick: Callable[[], None] | None = None,
        give_up: Callable[[], bool] | None = None,
    ) -> TargetBatch | None:
        """The training batch of `items` (None when there is none: no items, or --server
        states all non-finite). With --server, `tick` is called while it waits for states
        and `give_up` asked whether to stop waiting (online_server.Interrupted)."""
        if not items:
            return None
        if self.served is not None:
            return self._served_batch(self.served, items, False, tick, give_up)
        return self._batch(items)

    def heldout_batches(self) -> Iterator[TargetBatch]:
        """This rank's share of the held-out split, as TargetBatches (made lazily)."""
        items = sorted(self.pool.heldout, key=lambda it: (it.length, it.source, it.index))
        mine = items[self.ranks.rank :: self.ranks.world]
        for group in tdata.global_batches(mine, self.cfg.batch_tokens):
            if not group:
                continue
            batch = (
                self._batch(group)
                if self.served is None
                else self._served_batch(self.served, group, True)
            )
            if batch is not None:  # None: --server states all non-finite
                yield batch

    def aux_rms(self, samples: int = 8) -> float:
        """The RMS of the target's states over the first `samples` training samples (the
        same on every rank): what --fc-scale auto divides by. Not with --server, whose
        states are fetched only once training starts."""
        items = [it for per_source in self.pool.train for it in per_source][:samples]
        squares, count = 0.0, 0
        for it in items:
            aux = self._batch([it]).aux[0, : it.length].double()
            squares += float(aux.square().sum())
            count += aux.numel()
        return math.sqrt(squares / count) if count else math.nan

    @contextmanager
    def serving(self, start: int) -> Iterator[ServedStates]:
        """--server: this rank's samples from step `start` on, fetched ahead while the
        context lasts."""
        import eagle3kit.train.online_server as online_server

        self.served = online_server.open_for(
            self.cfg,
            self.ranks.world,
            self.hidden_size,
            self.layers,
            self._order(start),
            [it.length for it in self.my_items(start)],
        )
        try:
            yield self.served
        finally:
            self.served.close()

    def my_items(self, start: int) -> Iterator[tdata.Item]:
        """This rank's training items from step `start` on, in the order the steps take
        them: each step's micro-batches of this rank, each in its item order."""
        for step in range(start, self.plan.total_steps):
            for part in self.my_parts(self.plan.step(step)[1]):
                yield from part

    def _order(self, start: int) -> Iterator[tuple[np.ndarray, int]]:
        for it in self.my_items(start):
            ids, _mask = self.sources[it.source].tokens(it.index)
            yield ids[: it.length], it.length  # a truncated sample's states: those of its head

    def _batch(self, items: list[tdata.Item]) -> TargetBatch:
        if isinstance(self.target, OnlineTarget):
            samples = []
            for it in items:
                ids, mask = self.sources[it.source].tokens(it.index)
                samples.append((ids[: it.length], mask[: it.length]))
            return self.target.batch(samples)
        rows = []
        for it in items:
            s = self.sources[it.source].dataset[it.index]
            n = it.length
            rows.append((s.input_ids[:n], s.loss_mask[:n], s.aux[:n], s.last[:n]))
        return self.target.batch(rows)

    def _served_batch(
        self,
        served: ServedStates,
        items: list[tdata.Item],
        heldout: bool,
        tick: Callable[[], None] | None = None,
        give_up: Callable[[], bool] | None = None,
    ) -> TargetBatch | None:
        """The states of `items` from the servers: held-out ones fetched now, training ones
        taken from the prefetch queue, in its order. A sample whose states are not finite is
        left out (and counted)."""
        samples = [self.sources[it.source].tokens(it.index) for it in items]
        samples = [
            (ids[: it.length], mask[: it.length])
            for it, (ids, mask) in zip(items, samples, strict=True)
        ]
        if heldout:
            states = served.fetch_now([ids for ids, _ in samples])
        else:
            states = [served.take(tick, give_up) for _ in items]
        rows = [
            (ids, mask, *s) for (ids, mask), s in zip(samples, states, strict=True) if s is not None
        ]
        assert isinstance(self.target, OfflineTarget)  # --server's states are stored ones'
        return self.target.batch(rows) if rows else None

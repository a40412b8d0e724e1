"""What the drafter is fed: the target batches of training and held-out items (from stored
states, the target in the loop, or --server), and the held-out evaluation over them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import eagle3kit.train.data as tdata
import eagle3kit.train.sharding as sharding
from eagle3kit.train.heldout import EvalResult, Sampled, evaluate
from eagle3kit.train.state import TrainerState
from eagle3kit.train.target import TargetBatch


class Batches(TrainerState):
    """The Trainer's batches and evaluation, over the state `Setup` built (sources, pool,
    online or offline target, drafter) and, with --server, the prefetcher `served`."""

    # Batches -----------------------------------------------------------------------------
    def _target_batch(self, items: list[tdata.Item], heldout: bool = False
                      ) -> TargetBatch | None:
        if not items:
            return None
        if self.cfg.servers:
            return self._served_batch(items, heldout)
        if self.cfg.online:
            samples = []
            for it in items:
                ids, mask = self.sources[it.source].tokens(it.index)
                samples.append((ids[:it.length], mask[:it.length]))
            return self.online.batch(samples)
        rows = []
        for it in items:
            s = self.sources[it.source].dataset[it.index]
            n = it.length
            rows.append((s.input_ids[:n], s.loss_mask[:n], s.aux[:n], s.last[:n]))
        return self.offline.batch(rows)

    def heldout_batches(self):
        """This rank's share of the held-out split, as TargetBatches (made lazily)."""
        items = sorted(self.pool.heldout, key=lambda it: (it.length, it.source, it.index))
        mine = items[self.ranks.rank::self.ranks.world]
        for group in tdata.global_batches(mine, self.cfg.batch_tokens):
            batch = self._target_batch(group, heldout=True)
            if batch is not None:  # None: --server states all non-finite
                yield batch

    def _served_batch(self, items: list[tdata.Item], heldout: bool) -> TargetBatch | None:
        """The states of `items` from the servers: held-out ones fetched now, training ones
        taken from the prefetch queue, in its order. A sample whose states are not finite is
        left out (and counted)."""
        samples = [self.sources[it.source].tokens(it.index) for it in items]
        samples = [(ids[:it.length], mask[:it.length]) for it, (ids, mask) in
                   zip(items, samples, strict=True)]
        if heldout:
            states = self.served.fetch_now([ids for ids, _ in samples])
        else:
            progress = getattr(self, "progress", None)
            tick = None if progress is None else (
                lambda: progress.set(**self.served.gauges()))
            # One process may stop while it waits (nothing to agree on with other ranks).
            give_up = (lambda: self.stop.received is not None) if self.ranks.world == 1 \
                else None
            states = [self.served.take(tick, give_up) for _ in items]
        rows = [(ids, mask, *s) for (ids, mask), s in zip(samples, states, strict=True)
                if s is not None]
        return self.offline.batch(rows) if rows else None

    @property
    def phase_markers(self) -> Any:
        """The target tokenizer's think / tool-call markers (bench accept's), for the
        held-out prediction per reasoning phase; None without a loadable tokenizer."""
        if not hasattr(self, "_phase_markers"):
            assert self.cfg.target is not None  # TrainConfig refuses a run without --target
            self._phase_markers = _markers_of(self.cfg.target, self.trust_remote_code)
        return self._phase_markers

    def _evaluate(self, step: int) -> dict | None:
        if not self.pool.heldout:
            return None
        with sharding.gathered(self.model):
            result: EvalResult = evaluate(self.drafter, self.heldout_batches(),
                                          self.cfg.eval_k, reduce=self.ranks.sum,
                                          markers=self.phase_markers, sampled=self._sampled())
        result.step = step
        return result.to_dict()

    def _sampled(self) -> Sampled | None:
        """--eval-temperature and --eval-verify, for the prediction at a temperature."""
        if self.cfg.eval_temperature == 0:
            return None
        from eagle3kit.model.verification import Rule

        return Sampled(Rule(self.cfg.eval_verify), self.cfg.eval_temperature,
                       self.head.lm_head)



def _markers_of(target: Path, trust_remote_code: bool) -> Any:
    from transformers import AutoTokenizer

    from eagle3kit.chat.phases import Markers

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(target),
                                                  trust_remote_code=trust_remote_code)
    except Exception:  # a target without a tokenizer: the prediction goes without phases
        return None
    markers = Markers.of(tokenizer)
    return markers if markers.known else None


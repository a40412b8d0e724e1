"""The optimizer steps of a set-up run (setup.py) and their control: stop signals,
evaluations and checkpoints due.

Under torchrun every rank builds the same plan and takes its slice of every global batch:
a step's global batch is cut into ranks x grad_accum micro-batches of about equal tokens,
rank r gets micro-batches r*A .. r*A+A-1 (Feed.my_parts). The loss of each step is divided
by the global batch's count of loss-carrying positions (all-reduced before any backward),
and DDP's gradient mean is turned back into a sum, so 1 process with --grad-accum 2 and 2
processes with --grad-accum 1 take the same steps.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import torch

import eagle3kit.train.checkpointing as checkpointing
import eagle3kit.train.data as tdata
import eagle3kit.train.sharding as sharding
from eagle3kit import _ui
from eagle3kit._ranks import Ranks
from eagle3kit._signals import EXIT_CODES, STOP_SIGNALS, continue_command
from eagle3kit.model import attention
from eagle3kit.train.checkpointing import Evaluations, timestamp
from eagle3kit.train.online_server import Interrupted
from eagle3kit.train.result import TrainResult
from eagle3kit.train.selection import AL, patience_spent
from eagle3kit.train.setup import Setup, announce
from eagle3kit.train.stopping import CheckpointClock, StopRequests
from eagle3kit.train.trackers import Trackers, step_metrics
from eagle3kit.train.ttt import step_counts


class TrainLoop:
    """Steps from the set-up's start to the plan's end, or to a stop request. It holds only
    the loop's own state: the tokens trained on, the evaluations, the stop requests, the
    checkpoint clock and the progress display; the rest is the set-up's."""

    def __init__(self, setup: Setup, trackers: Trackers | None = None) -> None:
        """`trackers`: --report-to's (rank 0), given every metrics record."""
        self.setup, self.trackers = setup, trackers
        resumed = setup.resumed
        self.tokens = resumed.tokens if resumed is not None else 0
        self.evals = (
            Evaluations(resumed.last_eval, resumed.best) if resumed is not None else Evaluations()
        )
        self.initial_eval: dict | None = None
        """The evaluation before training (a new run with a held-out split)."""
        self.last_loss: float | None = None
        self.stop = StopRequests(self.on_signal)
        self.stop_signal: signal.Signals | None = None
        """The stop request every rank agreed on."""
        self.clock = CheckpointClock(setup.cfg.checkpoint_interval)
        self.progress: _ui.Progress | None = None
        """The progress display, while the steps run."""

    # The whole run ------------------------------------------------------------------------
    def run(self) -> TrainResult:
        s, cfg = self.setup, self.setup.cfg
        start, total = s.start, s.plan.total_steps
        done = start
        with self.stop:
            if start == 0 and s.pool.heldout:
                self.initial_eval = self.evals.last = s.heldout.evaluate(s.drafter, s.model, 0)
                if s.ranks.rank == 0:
                    self.log({"step": 0, "eval": self.initial_eval, "time": timestamp()})
            announce(s)
            stopped = start < total and self.control()[0]
            if not stopped and not self.patience_spent():
                done, stopped = self.steps(start, total)
        if start >= total and not s.run_dir.drafter.is_dir():
            state = sharding.full_weights(s.model, s.drafter)
            if s.ranks.rank == 0:
                checkpointing.save_drafter_dir(s, self.evals, total, self.tokens, state)
        result = TrainResult(
            out=cfg.out,
            steps=done,
            total_steps=total,
            tokens=self.tokens,
            loss=self.last_loss,
            eval=self.evals.last,
            initial_eval=self.initial_eval,
            vocab_coverage=s.vocab.coverage,
            resumed_from=s.resumed.step if s.resumed is not None else None,
            selection=checkpointing.selection_of(s, self.evals, done),
            metrics={
                "long_samples": s.pool.long.to_dict(),
                "train_samples": sum(len(t) for t in s.pool.train),
                "heldout_samples": len(s.pool.heldout),
                "layer_ids": s.layers,
                "draft_vocab": s.vocab.size,
                "variant": {
                    "norm_before_residual": s.drafter.config.norm_before_residual,
                    **s.drafter.config.variant,
                },
                **({"fc_scale": s.fc_scale} if s.fc_scale != 1.0 else {}),
            },
        )
        result.patience_spent = not stopped and done < total and self.patience_spent()
        if stopped:
            assert self.stop_signal is not None  # set with every early stop
            result.stopped = self.stop_signal.name
            result.exit_code = EXIT_CODES[self.stop_signal]
            result.resume_command = resume_command(s.ranks)
        return result

    def steps(self, start: int, total: int) -> tuple[int, bool]:
        """Steps start..total-1, or until a stop request: (steps done, stopped early)."""
        s, cfg = self.setup, self.setup.cfg
        run_tokens = 0
        began = time.monotonic()
        done = start
        with _ui.Progress("train", total, cfg.output, unit="steps", initial=start) as progress:
            self.progress = progress
            if start > 0 and self.evals.last:
                progress.set(**_eval_gauges(self.evals.last))  # a resumed run's last one
            elif s.pool.heldout:
                # "AL 1" from the untrained drafter would read like the τ≈1 warning (a broken
                # setup): nothing is shown until training's first evaluation.
                progress.set(AL=None)
            for step in range(start, total):
                epoch, batch = s.plan.step(step)
                try:
                    record = self.step(batch)
                except Interrupted:  # --server: stopped while waiting for states
                    self.stop_signal = self.stop.received
                    if done > start:
                        self.checkpoint(done, epoch, False)
                    return done, True
                self.tokens += record["tokens"]
                self.last_loss = record["loss"]
                done = step + 1
                progress.add(1, tokens=record["tokens"])
                progress.set(loss=round(record["loss"], 4), lr=record["lr"])
                if s.feed.served is not None:
                    progress.set(**s.feed.served.gauges())
                run_tokens += record["tokens"]
                log = {
                    "step": done,
                    "epoch": epoch,
                    **record,
                    "tokens_total": self.tokens,
                    "tokens_per_s": round(run_tokens / max(time.monotonic() - began, 1e-9), 1),
                    "elapsed": round(time.monotonic() - began, 4),
                    "time": timestamp(),
                }
                if s.ranks.rank == 0:
                    self.log(log)
                last = done == total
                stop, due = self.control()
                if (
                    s.pool.heldout
                    and not stop
                    and (last or (cfg.eval_every and done % cfg.eval_every == 0))
                ):
                    self.evals.last = ev = s.heldout.evaluate(s.drafter, s.model, done)
                    if ev is not None:  # always, with a held-out split
                        progress.set(**_eval_gauges(ev))
                    if s.ranks.rank == 0:
                        self.log({"step": done, "eval": ev, "time": timestamp()})
                    checkpointing.consider(s, self.evals, ev, self.tokens)
                patient = not last and not stop and self.patience_spent()
                if last or stop or due or patient or done % cfg.checkpoint_every == 0:
                    self.checkpoint(done, epoch, last or patient)
                if stop and not last:
                    return done, True
                if patient:
                    best = self.evals.best or {}
                    _ui.info(
                        f"train: --patience {cfg.patience}: no better held-out "
                        f"acceptance since step {best.get('step')} "
                        f"({best.get(AL, 0):.3f}); training ends at step {done}",
                        cfg.output,
                    )
                    return done, False
        return done, False

    def patience_spent(self) -> bool:
        """--patience: the held-out chain figure has not risen for that many evaluations."""
        cfg = self.setup.cfg
        return patience_spent(cfg.patience, cfg.eval_every, self.evals.best, self.evals.last)

    # A step ------------------------------------------------------------------------------
    def step(self, items: list[tdata.Item]) -> dict:
        """One optimizer step over the global batch `items`; its logged figures."""
        s, cfg, ranks = self.setup, self.setup.cfg, self.setup.ranks
        mine = s.feed.my_parts(items)
        batches = [s.feed.batch(p, self._tick, self._give_up) for p in mine]
        counts = torch.zeros(cfg.ttt_steps, dtype=torch.float64, device=s.device)
        for b in batches:
            if b is not None:
                counts += step_counts(b, s.drafter.t2d, cfg.ttt_steps)
        ranks.sum(counts)
        sums = torch.zeros(cfg.ttt_steps, dtype=torch.float64, device=s.device)
        correct = torch.zeros_like(sums)
        loss_total = torch.zeros((), dtype=torch.float64, device=s.device)
        for m, b in enumerate(batches):
            sync = m == len(batches) - 1 or ranks.world == 1
            with sharding.gradient_sync(s.model, sync):
                loss, step_sums, step_correct = s.model(b, counts, s.autocast)
                # DDP averages gradients over ranks; the loss is already a global mean.
                (loss * ranks.world).backward()
            sums += step_sums
            correct += step_correct
            loss_total += loss.detach().double()
        _ui.warn_all(attention.take_warnings())  # the kernel picked on first use
        # With --fc-scale c, the norm is the one V = fc / c would have (its gradient is c
        # times fc's), so clipping treats fc as it treats the rest of the drafter.
        fc_grad = s.drafter.fc.weight.grad if s.fc_scale != 1.0 else None
        if fc_grad is not None:
            fc_grad.mul_(s.fc_scale)
        norm = torch.nn.utils.clip_grad_norm_(
            s.params, cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
        )
        if fc_grad is not None:
            fc_grad.div_(s.fc_scale)
        norm = sharding.local(norm)
        lr = s.optimizer.param_groups[0]["lr"]
        s.optimizer.step()
        s.scheduler.step()
        s.optimizer.zero_grad(set_to_none=True)
        # torch.full writes the count on the device: no host-to-device copy to wait for.
        tokens = torch.full(
            (1,),
            float(sum(it.length for p in mine for it in p)),
            dtype=torch.float64,
            device=s.device,
        )
        stats = ranks.sum(torch.cat([loss_total[None], sums, correct, tokens]))
        return _readout(stats, counts, norm, lr, cfg.ttt_steps)

    def _tick(self) -> None:
        """While a step waits for --server's states: the progress line kept current."""
        served = self.setup.feed.served
        if self.progress is not None and served is not None:
            self.progress.set(**served.gauges())

    def _give_up(self) -> bool:
        """Whether a step waiting for --server's states stops waiting: a stop request, in one
        process (with more, the ranks must agree first, after the step)."""
        return self.setup.ranks.world == 1 and self.stop.received is not None

    # Control -----------------------------------------------------------------------------
    def control(self) -> tuple[bool, bool]:
        """(stop, checkpoint due), the same on every rank: a signal to any one rank stops
        them all after the same step, and one rank's clock decides for all."""
        s = self.setup
        if s.ranks.world == 1:  # nothing to agree on: no tensor, no wait for the device
            if self.stop.received is not None:
                self.stop_signal = self.stop.received
            return self.stop.received is not None, self.clock.due()
        flags = torch.zeros(len(STOP_SIGNALS) + 1, dtype=torch.float64, device=s.device)
        if self.stop.received is not None:
            flags[STOP_SIGNALS.index(self.stop.received)] = 1
        flags[-1] = float(self.clock.due())
        s.ranks.sum(flags)
        seen = [sig for sig, n in zip(STOP_SIGNALS, flags.tolist(), strict=False) if n > 0]
        if seen:
            self.stop_signal = seen[0]
        return bool(seen), bool(flags[-1] > 0)

    def checkpoint(self, step: int, epoch: int, final: bool) -> None:
        checkpointing.save(self.setup, self.evals, step, epoch, self.tokens, final, self.trackers)
        self.clock.reset()

    def on_signal(self, sig: Any) -> None:
        _ui.warn(
            f"train: {sig.name}: finishing this step, then writing a checkpoint "
            "(a second signal aborts)"
        )

    def log(self, record: dict) -> None:
        """One metrics.jsonl record (rank 0), and the same figures to the trackers."""
        s = self.setup
        s.run_dir.log(record)
        if self.trackers is not None:
            waiting = None
            if s.feed.served is not None and "loss" in record:
                stats = s.feed.served.stats
                waiting = stats.waited_s / max(time.monotonic() - stats.started, 1e-9)
            self.trackers.log(record["step"], step_metrics(record, waiting))


def _readout(
    stats: torch.Tensor, counts: torch.Tensor, norm: torch.Tensor, lr: float, k: int
) -> dict:
    """A step's logged figures from its all-reduced stats [loss, CE sums k, correct k,
    tokens], brought to the host in one `.tolist()`: each read of a device tensor waits for
    the device's queue, and every step is logged (metrics.jsonl, the progress line)."""
    c = counts.clamp_min(1)
    values = torch.cat(
        [
            stats[:1],
            stats[1 : 1 + k] / c,
            stats[1 + k : 1 + 2 * k] / c,
            stats[-1:],
            counts,
            norm.detach().double().reshape(1),
        ]
    ).tolist()
    return {
        "loss": values[0],
        "loss_k": values[1 : 1 + k],
        "acc_k": values[1 + k : 1 + 2 * k],
        "tokens": int(values[1 + 2 * k]),
        "positions_k": values[2 + 2 * k : 2 + 3 * k],
        "lr": lr,
        "grad_norm": values[-1],
    }


def _eval_gauges(ev: dict) -> dict[str, float]:
    gauges = {f"a{i + 1}": round(a, 3) for i, a in enumerate(ev["per_position"])}
    gauges["AL"] = round(ev["predicted_acceptance_length"], 3)
    return gauges


def resume_command(ranks: Ranks) -> str | None:
    """The command line that continues this run: this one, without --overwrite, under the
    same torchrun shape. None when train was not started from the command line."""
    import sys

    if sys.argv[1:2] != ["train"]:
        return None
    line = continue_command()
    if ranks.world > 1:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", ranks.world))
        nodes = max(1, ranks.world // max(local, 1))
        line = (
            f"torchrun --nnodes {nodes} --nproc_per_node {local} "
            + ("<the same rendezvous options> " if nodes > 1 else "")
            + "-m "
            + line
        )
    return line

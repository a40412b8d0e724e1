"""`eagle3kit train`: set up a run (or pick one up), then the optimizer steps.

Under torchrun every rank builds the same plan and takes its slice of every global batch:
a step's global batch is cut into ranks x grad_accum micro-batches of about equal tokens,
rank r gets micro-batches r*A .. r*A+A-1. The loss of each step is divided by the global
batch's count of loss-carrying positions (all-reduced before any backward), and DDP's
gradient mean is turned back into a sum, so 1 process with --grad-accum 2 and 2 processes
with --grad-accum 1 take the same steps.

The run's jobs live beside this file, each a part of `Trainer`: setup.py builds the run,
checkpointing.py saves and restores it (and writes run.json), batches.py feeds the drafter
and evaluates it; this file holds the steps and their control (stop signals, checkpoints
due).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import replace
from typing import Any

import torch

import eagle3kit.train.data as tdata
import eagle3kit.train.sharding as sharding
from eagle3kit import _ui
from eagle3kit._ranks import Ranks
from eagle3kit._signals import EXIT_CODES, STOP_SIGNALS, continue_command
from eagle3kit.checkpoints.rundir import RunDir
from eagle3kit.model import attention
from eagle3kit.target import TargetInfo, dtype_name, location
from eagle3kit.train.batches import Batches
from eagle3kit.train.checkpointing import Checkpointing, _now
from eagle3kit.train.config import TrainConfig, TrainResult
from eagle3kit.train.online_server import Interrupted as StepAbandoned
from eagle3kit.train.report import _report
from eagle3kit.train.setup import Setup
from eagle3kit.train.stopping import CheckpointClock, StopRequests
from eagle3kit.train.ttt import step_counts


def run(cfg: TrainConfig) -> TrainResult:
    ranks = Ranks.start(cfg.device)
    finished = False
    try:
        if ranks.rank:  # one voice: the other ranks only warn and fail
            cfg = replace(cfg, output=replace(cfg.output, quiet=True, json=False))
        result = Trainer(cfg, ranks).run()
        finished = True
    finally:
        ranks.close(finished)
    if ranks.rank == 0:
        _report(result, cfg)
    return result



class Trainer(Setup, Checkpointing, Batches):
    def __init__(self, cfg: TrainConfig, ranks: Ranks) -> None:
        self.cfg, self.ranks = cfg, ranks
        self.run_dir = RunDir(cfg.out)
        self.device = ranks.device
        self.autocast = (torch.bfloat16 if dtype_name(cfg.dtype, self.device) == "bfloat16"
                         else None)
        self.trackers = None


    # The whole run ------------------------------------------------------------------------
    def run(self) -> TrainResult:
        """Train, holding the run directory throughout (released when the run ends)."""
        try:
            return self._run()
        finally:
            if self.trackers is not None:
                self.trackers.finish()
                with contextlib.suppress(OSError, ValueError):  # a run that never began
                    self._record_tracker_ids()
            if getattr(self, "lock", None) is not None:
                self.lock.release()

    def _run(self) -> TrainResult:
        cfg = self.cfg
        assert cfg.target is not None  # TrainConfig refuses a run without --target
        self.trust_remote_code = cfg.trust_remote_code  # the flag only, never a dataset's record
        target = TargetInfo.load(cfg.target, self.trust_remote_code)
        self.target_cfg = target.config
        self.target_id = {**location(cfg.target), **target.identity}
        self.sources = [tdata.open_source(d.path, d.weight, cfg.online) for d in cfg.data]
        continuing = self._open_run_dir()
        self.layers = self._resolve_layers(continuing)
        masks = tdata.held_out(self.sources, cfg.eval_split)
        self.max_len = cfg.max_len or getattr(self.target_cfg, "max_position_embeddings", None)
        self.pool = tdata.build_pool(self.sources, masks, self.max_len, cfg.long_samples)
        self.plan = tdata.make_plan(
            self.pool, [d.weight for d in cfg.data], cfg.seed, cfg.batch_tokens,
            self.ranks.world * cfg.grad_accum, cfg.epochs, cfg.max_steps,
            cfg.data_order == "fixed")
        self._load_target()
        self._build_drafter(continuing)
        self._build_optimizer()
        start = self._resume() if continuing else 0
        if self.ranks.rank == 0:
            record = self._write_run_json(continuing)
            self.run_dir.cut_metrics(start)
            self._start_trackers(record, start)
        self.ranks.barrier()
        if not cfg.servers:
            return self._train(start)
        import eagle3kit.train.online_server as online_server

        self.served = online_server.open_for(self, start)
        try:
            result = self._train(start)
        finally:
            self.served.close()
        result.metrics["served"] = self.served.stats.to_dict()
        return result


    def _start_trackers(self, record: dict, start: int) -> None:
        """--report-to's trackers (rank 0), given the run's record minus its history."""
        from eagle3kit.train.trackers import Trackers, parse_report_to

        names, _ = parse_report_to(self.cfg.report_to)
        if not names:
            return
        self.trackers = Trackers(names, self.cfg.out, start)
        config = {k: v for k, v in record.items() if k not in ("settings_history", "trackers")}
        self.trackers.start(config, record.get("trackers") or {})

    def _log(self, record: dict) -> None:
        """One metrics.jsonl record (rank 0), and the same figures to the trackers."""
        self.run_dir.log(record)
        if self.trackers is not None:
            from eagle3kit.train.trackers import step_metrics

            waiting = None
            if self.cfg.servers and "loss" in record:
                stats = self.served.stats
                waiting = stats.waited_s / max(time.monotonic() - stats.started, 1e-9)
            self.trackers.log(record["step"], step_metrics(record, waiting))


    # Steps -----------------------------------------------------------------------------------
    def _step(self, batch_items: list[tdata.Item]) -> dict:
        cfg, ranks = self.cfg, self.ranks
        parts = tdata.split_parts(batch_items, ranks.world * cfg.grad_accum)
        mine = parts[ranks.rank * cfg.grad_accum:(ranks.rank + 1) * cfg.grad_accum]
        batches = [self._target_batch(p) for p in mine]
        counts = torch.zeros(cfg.ttt_steps, dtype=torch.float64, device=self.device)
        for b in batches:
            if b is not None:
                counts += step_counts(b, self.drafter.t2d, cfg.ttt_steps)
        ranks.sum(counts)
        sums = torch.zeros(cfg.ttt_steps, dtype=torch.float64, device=self.device)
        correct = torch.zeros_like(sums)
        loss_total = torch.zeros((), dtype=torch.float64, device=self.device)
        for m, b in enumerate(batches):
            sync = m == len(batches) - 1 or ranks.world == 1
            with sharding.gradient_sync(self.model, sync):
                loss, s, c = self.model(b, counts, self.autocast)
                # DDP averages gradients over ranks; the loss is already a global mean.
                (loss * ranks.world).backward()
            sums += s
            correct += c
            loss_total += loss.detach().double()
        _ui.warn_all(attention.take_warnings())  # the kernel picked on first use
        if cfg.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.grad_clip)
        else:
            norm = torch.nn.utils.clip_grad_norm_(self.params, float("inf"))
        norm = sharding.local(norm)
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        # torch.full writes the count on the device: no host-to-device copy to wait for.
        tokens = torch.full((1,), float(sum(it.length for p in mine for it in p)),
                            dtype=torch.float64, device=self.device)
        stats = ranks.sum(torch.cat([loss_total[None], sums, correct, tokens]))
        return _readout(stats, counts, norm, lr, cfg.ttt_steps)

    def _train(self, start: int) -> TrainResult:
        cfg, rd = self.cfg, self.run_dir
        total = self.plan.total_steps
        self.tokens = getattr(self, "tokens_before", 0)
        self.last_eval = getattr(self, "last_eval", None)
        self.best = getattr(self, "best", None)  # a resumed run's, from _resume
        self.clock = CheckpointClock(cfg.checkpoint_interval)
        initial_eval = None
        done = start
        with StopRequests(self._on_signal) as self.stop:
            if start == 0 and self.pool.heldout:
                initial_eval = self._evaluate(0)
                self.last_eval = initial_eval
                if self.ranks.rank == 0:
                    self._log({"step": 0, "eval": initial_eval, "time": _now()})
            self._announce(start)
            stopped = start < total and self._control()[0]
            if not stopped:
                done, stopped = self._steps(start, total)
        if start >= total and not rd.drafter.is_dir():
            state = sharding.full_weights(self.model, self.drafter)
            if self.ranks.rank == 0:
                self._save_drafter(total, self.tokens, state)
        result = TrainResult(
            out=cfg.out, steps=done, total_steps=total, tokens=self.tokens,
            loss=getattr(self, "last_loss", None), eval=self.last_eval,
            initial_eval=initial_eval, vocab_coverage=self.vocab.coverage,
            resumed_from=getattr(self, "resumed_from", None), selection=self._selection(done),
            metrics={"long_samples": self.pool.long.to_dict(),
                     "train_samples": sum(len(t) for t in self.pool.train),
                     "heldout_samples": len(self.pool.heldout), "layer_ids": self.layers,
                     "draft_vocab": self.vocab.size,
                     "variant": {"norm_before_residual":
                                 self.drafter.config.norm_before_residual,
                                 **self.drafter.config.variant}})
        if stopped:
            assert self.stop_signal is not None  # set with every early stop
            result.stopped = self.stop_signal.name
            result.exit_code = EXIT_CODES[self.stop_signal]
            result.resume_command = resume_command(self.ranks)
        return result

    def _steps(self, start: int, total: int) -> tuple[int, bool]:
        """Steps start..total-1, or until a stop request: (steps done, stopped early)."""
        cfg = self.cfg
        run_tokens = 0
        began = time.monotonic()
        done = start
        with _ui.Progress("train", total, cfg.output, unit="steps", initial=start) as progress:
            self.progress = progress
            if start > 0 and self.last_eval:
                progress.set(**_eval_gauges(self.last_eval))  # a resumed run's last one
            elif self.pool.heldout:
                # "AL 1" from the untrained drafter would read like the τ≈1 warning (a broken
                # setup): nothing is shown until training's first evaluation.
                progress.set(AL=None)
            for step in range(start, total):
                epoch, batch = self.plan.step(step)
                try:
                    record = self._step(batch)
                except StepAbandoned:  # --server: stopped while waiting for states
                    self.stop_signal = self.stop.received
                    if done > start:
                        self._checkpoint(done, epoch, self.tokens, False)
                    return done, True
                self.tokens += record["tokens"]
                self.last_loss = record["loss"]
                done = step + 1
                progress.add(1, tokens=record["tokens"])
                progress.set(loss=round(self.last_loss, 4), lr=record["lr"])
                if cfg.servers:
                    progress.set(**self.served.gauges())
                run_tokens += record["tokens"]
                log = {"step": done, "epoch": epoch, **record, "tokens_total": self.tokens,
                       "tokens_per_s": round(run_tokens / max(time.monotonic() - began, 1e-9),
                                             1), "elapsed": round(time.monotonic() - began, 4),
                       "time": _now()}
                if self.ranks.rank == 0:
                    self._log(log)
                last = done == total
                stop, due = self._control()
                if self.pool.heldout and not stop and (last or (cfg.eval_every and
                                                                done % cfg.eval_every == 0)):
                    self.last_eval = ev = self._evaluate(done)
                    if ev is not None:  # always, with a held-out split
                        progress.set(**_eval_gauges(ev))
                    if self.ranks.rank == 0:
                        self._log({"step": done, "eval": self.last_eval, "time": _now()})
                    self._consider(ev, self.tokens)
                if last or stop or due or done % cfg.checkpoint_every == 0:
                    self._checkpoint(done, epoch, self.tokens, last)
                if stop and not last:
                    return done, True
        return done, False

    def _control(self) -> tuple[bool, bool]:
        """(stop, checkpoint due), the same on every rank: a signal to any one rank stops
        them all after the same step, and one rank's clock decides for all."""
        if self.ranks.world == 1:  # nothing to agree on: no tensor, no wait for the device
            if self.stop.received is not None:
                self.stop_signal = self.stop.received
            return self.stop.received is not None, self.clock.due()
        flags = torch.zeros(len(STOP_SIGNALS) + 1, dtype=torch.float64, device=self.device)
        if self.stop.received is not None:
            flags[STOP_SIGNALS.index(self.stop.received)] = 1
        flags[-1] = float(self.clock.due())
        self.ranks.sum(flags)
        seen = [sig for sig, n in zip(STOP_SIGNALS, flags.tolist(), strict=False) if n > 0]
        if seen:
            self.stop_signal = seen[0]
        return bool(seen), bool(flags[-1] > 0)

    def _on_signal(self, sig: Any) -> None:
        _ui.warn(f"train: {sig.name}: finishing this step, then writing a checkpoint "
                 "(a second signal aborts)")



def _readout(stats: torch.Tensor, counts: torch.Tensor, norm: torch.Tensor, lr: float,
             k: int) -> dict:
    """A step's logged figures from its all-reduced stats [loss, CE sums k, correct k,
    tokens], brought to the host in one `.tolist()`: each read of a device tensor waits for
    the device's queue, and every step is logged (metrics.jsonl, the progress line)."""
    c = counts.clamp_min(1)
    values = torch.cat([stats[:1], stats[1:1 + k] / c, stats[1 + k:1 + 2 * k] / c,
                        stats[-1:], counts, norm.detach().double().reshape(1)]).tolist()
    return {"loss": values[0], "loss_k": values[1:1 + k], "acc_k": values[1 + k:1 + 2 * k],
            "tokens": int(values[1 + 2 * k]), "positions_k": values[2 + 2 * k:2 + 3 * k],
            "lr": lr, "grad_norm": values[-1]}


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
        line = (f"torchrun --nnodes {nodes} --nproc_per_node {local} "
                + ("<the same rendezvous options> " if nodes > 1 else "")
                + "-m " + line)
    return line


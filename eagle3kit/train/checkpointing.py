"""A training run's state on disk: checkpoints written and resumed from, the drafter kept
beside them, and run.json (the run's settings, target, layers, vocabulary and plan)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

import eagle3kit.train.selection as selection
import eagle3kit.train.sharding as sharding
from eagle3kit import __version__, _ui
from eagle3kit._durable import write_json_atomic
from eagle3kit.checkpoints.native import save_drafter
from eagle3kit.checkpoints.rundir import (
    RUN_FORMAT,
    RUN_VERSION,
    load_rng_state,
    load_tensors,
    save_rng_state,
)
from eagle3kit.errors import UserError
from eagle3kit.train.config import TrainConfig
from eagle3kit.train.state import TrainerState


class Checkpointing(TrainerState):
    """The Trainer's saving and restoring: what it writes reads the state `Setup` built
    (model, drafter, optimizer, scheduler, vocab, plan) and the loop's last_eval."""

    # Checkpoints ---------------------------------------------------------------------------
    def _resume(self) -> int:
        steps = self.run_dir.steps()
        if not steps:
            return 0
        step = steps[-1]
        where = self.run_dir.step_dir(step)
        from safetensors.torch import load_file

        weights = load_file(str(where / "model.safetensors"), device=str(self.device))
        missing, unexpected = sharding.load_weights(self.model, self.drafter, weights)
        if [m for m in missing if m != "embed_tokens.weight"] or unexpected:
            raise UserError(f"{where}: checkpoint does not fit this drafter "
                            f"(missing {missing}, unexpected {unexpected})")
        sharding.load_optimizer_state(self.model, self.optimizer,
                                      load_tensors(where / "optimizer.pt"), self.param_names)
        self.scheduler.load_state_dict(load_tensors(where / "scheduler.pt"))
        self._apply_optimizer_settings()
        rng = where / f"rng-rank{self.ranks.rank}.safetensors"
        if (where / f"rng-rank{self.ranks.rank}.pt").exists():
            # Written by an earlier eagle3kit as a pickle, which can hold code: never loaded.
            raise UserError(f"{where / f'rng-rank{self.ranks.rank}.pt'}: a pickled random "
                            "state, which eagle3kit does not load (a pickle can run code); "
                            f"delete it to resume from {where.name} without it (the data "
                            "order is kept, the random draws are new)")
        if rng.is_file():
            load_rng_state(rng)
        import json

        state = json.loads((where / "state.json").read_text())
        self.tokens_before = int(state.get("tokens", 0))
        self.last_eval = state.get("eval")
        self.resumed_from = step
        self._resume_best(state.get("best"))
        return step

    def _apply_optimizer_settings(self) -> None:
        """The learning rate and weight decay of this command, not the restored ones.

        A restored optimizer and scheduler carry the first run's `--lr` (as the scheduler's base
        rates) and `--weight-decay`; they differ from this command's only under `--force`,
        where the user asked for the new ones. The schedule's shape is this command's already
        (its function is not saved), so the rate continues from the restored step.
        """
        cfg, scheduler = self.cfg, self.scheduler
        scheduler.base_lrs = [cfg.lr] * len(self.optimizer.param_groups)
        rates = [base * factor(scheduler.last_epoch)
                 for base, factor in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)]
        for group, rate in zip(self.optimizer.param_groups, rates, strict=True):
            group.update(initial_lr=cfg.lr, lr=rate, weight_decay=cfg.weight_decay)
        scheduler._last_lr = rates  # what get_last_lr() reports until the next step

    def _resume_best(self, recorded: dict | None) -> None:
        """The best evaluation so far, as the checkpoint recorded it or as drafter/ holds it
        (a best written after that checkpoint, by a run killed before the next one: the same
        trajectory, so it stands, and its weights are there)."""
        rd = self.run_dir
        if self.ranks.rank == 0:
            rd.recover_drafter()
        self.ranks.barrier()
        block = _drafter_block(rd.drafter)
        held = block.get("eval") if block.get("chosen") == "best" else None
        best = selection.better_of(recorded, held)
        before = (self.previous.get("settings") or {})
        now = self.cfg.settings()
        changed = [k for k in selection.COMPARABLE if before.get(k) != now.get(k)]
        if best is not None and changed:
            flags = ", ".join("--" + k.replace("_", "-") if k != "data" else k for k in changed)
            _ui.warn(f"train: {flags} changed (--force): the held-out figures before step "
                     f"{self.resumed_from} measured something else, so the best step is chosen "
                     "afresh from the next evaluation")
            best = None
        elif (best is not None and self.cfg.drafter_step == "best"
              and (held is None or int(held["step"]) != int(best["step"]))):
            holds = (f"it holds step {block['training']['step']}, kept as the "
                     f"{block.get('chosen', 'last')} step" if block.get("training")
                     else "there is none")
            _ui.warn(f"train: the best evaluated step so far, {best['step']} (held-out AL "
                     f"{best[selection.AL]:.3f}), is not in {rd.drafter} ({holds}); the best "
                     "is chosen afresh from the next evaluation")
            best = None
        self.best = best

    def _checkpoint(self, step: int, epoch: int, tokens: int, final: bool) -> None:
        rd, ranks = self.run_dir, self.ranks
        tmp = rd.temp_dir(step)
        if ranks.rank == 0:
            rd.begin_checkpoint(step)
        ranks.barrier()
        save_rng_state(tmp / f"rng-rank{ranks.rank}.safetensors")
        state = sharding.full_weights(self.model, self.drafter)  # collectives under FSDP
        optimizer = sharding.full_optimizer_state(self.model, self.optimizer, self.param_names)
        ranks.barrier()
        if ranks.rank == 0:
            # A whole drafter checkpoint (config.json beside the weights): a kept step is
            # what export and info read as any checkpoint, the last one included.
            save_drafter(self.drafter, tmp, extra=self._drafter_extra(step, tokens, "step"),
                         state=state)
            torch.save(optimizer, tmp / "optimizer.pt")
            torch.save(self.scheduler.state_dict(), tmp / "scheduler.pt")
            import json

            (tmp / "state.json").write_text(json.dumps({
                "step": step, "epoch": epoch, "tokens": tokens, "final": final,
                "total_steps": self.plan.total_steps, "world_size": ranks.world,
                "eval": self.last_eval, "best": self.best, "time": _now()}, indent=2) + "\n")
            rd.sync_metrics()
            rd.commit_checkpoint(step, self.cfg.keep)
            if not self._drafter_is_best():
                self._save_drafter(step, tokens, state)
            self._record_selection(step)
            self._record_tracker_ids()
        ranks.barrier()
        if hasattr(self, "clock"):
            self.clock.reset()

    # The drafter the run serves (eagle3kit/train/selection.py) ---------------------------
    def _drafter_is_best(self) -> bool:
        """Whether drafter/ holds the best evaluation rather than following the last step."""
        return self.cfg.drafter_step == "best" and self.best is not None

    def _consider(self, evaluation: dict | None, tokens: int) -> None:
        """After an evaluation (every rank: the figures are reduced, so all agree): a new
        best is recorded and, with --drafter-step best, written to drafter/ now, while its
        weights are the model's."""
        if not selection.improves(evaluation, self.best):
            return
        assert evaluation is not None  # improves() says so
        self.best = evaluation
        if self.cfg.drafter_step != "best":
            return
        step = int(evaluation["step"])
        state = sharding.full_weights(self.model, self.drafter)  # collectives under FSDP
        if self.ranks.rank == 0:
            self._save_drafter(step, tokens, state)
            self._record_selection(step)
        self.ranks.barrier()

    def _selection(self, last_step: int) -> dict:
        """Which step drafter/ holds and why (run.json's `selection`, the summary's)."""
        held = int(self.best["step"]) if self._drafter_is_best() and self.best else last_step
        return selection.record(self.cfg.drafter_step, held, self.best, self.last_eval,
                                bool(self.pool.heldout))

    def _record_selection(self, last_step: int) -> None:
        """run.json's `selection` (rank 0)."""
        self.run_dir.update_record(selection=self._selection(last_step))

    def _drafter_extra(self, step: int, tokens: int, chosen: str) -> dict[str, Any]:
        """The `eagle3kit` block of a drafter's config.json beyond its drafter config;
        `chosen`: why these weights were written (best, last, or step: a checkpoint's)."""
        extra: dict[str, Any] = {
            "target": self.target_id, "layer_ids": self.layers,
            "vocab": {"size": self.vocab.size, "coverage": self.vocab.coverage},
            "training": {"run": str(self.cfg.out.resolve()), "step": step, "tokens": tokens,
                         "eagle3kit_version": __version__},
            "chosen": chosen}
        evaluation = self.last_eval
        if chosen == "best" and self.best is not None:
            evaluation = self.best
        if evaluation is not None:
            extra["eval"] = evaluation
        return extra

    def _save_drafter(self, step: int, tokens: int, state: dict | None) -> None:
        """drafter/ replaced whole by the weights of `step` (rank 0)."""
        rd = self.run_dir
        chosen = "best" if self._drafter_is_best() else "last"
        save_drafter(self.drafter, rd.begin_drafter(),
                     extra=self._drafter_extra(step, tokens, chosen), state=state)
        rd.publish_drafter()

    def _write_run_json(self, continuing: bool) -> dict:
        """run.json written; what it holds."""
        from safetensors.torch import save_file

        rd = self.run_dir
        if not continuing or not rd.vocab.is_file():
            save_file({"d2t": torch.from_numpy(self.vocab.d2t),
                       "t2d": torch.from_numpy(self.vocab.t2d)}, str(rd.vocab))
        before = getattr(self, "previous", {})
        history = list(before.get("settings_history", []))
        if continuing and before.get("settings") != self.cfg.settings():
            history.append({"time": _now(), "settings": before.get("settings")})
        long = self.pool.long.to_dict()
        record = {
            "format": RUN_FORMAT, "version": RUN_VERSION, "eagle3kit_version": __version__,
            "created": before.get("created", _now()), "updated": _now(),
            "settings": self.cfg.settings(), "settings_history": history,
            "config": {k: (str(v) if isinstance(v, Path) else v)
                       for k, v in _resolved(self.cfg).items()},
            "world_size": self.ranks.world, "mode": ("online-server" if self.cfg.servers else
                                              "online" if self.cfg.online else "offline"),
            "servers": [u for u, _ in self.cfg.server_slots],
            "parallel": sharding.parallel(self.model, self.ranks.world),
            "target": self.target_id, "trust_remote_code": self.trust_remote_code,
            "layer_ids": self.layers, "layer_convention": "boundary",
            "drafter": self.drafter.config.to_dict(),
            "vocab": {"size": self.vocab.size, "coverage": self.vocab.coverage,
                      "source": self.vocab_source, "file": rd.vocab.name},
            "data": [s.manifest_summary() for s in self.sources],
            "plan": {"total_steps": self.plan.total_steps, "epochs": len(self.plan.epochs),
                     "train_samples": sum(len(t) for t in self.pool.train),
                     "heldout_samples": len(self.pool.heldout), "long_samples": long,
                     "too_short": self.pool.too_short},
            # --report-to's tracker runs (name: run id), which a resumed run continues.
            "trackers": (dict(before["trackers"]) if isinstance(before.get("trackers"), dict)
                         else {}),
        }
        if before.get("selection"):  # which step drafter/ holds, until the next checkpoint
            record["selection"] = before["selection"]
        write_json_atomic(rd.run_json, record)
        return record

    def _record_tracker_ids(self) -> None:
        """The trackers' run ids into run.json once they are known (rank 0), so a resumed run
        continues them; a tracker starts in the background, so this comes at checkpoints."""
        trackers = getattr(self, "trackers", None)
        if trackers is None or not trackers.ids:
            return
        import json

        record = json.loads(self.run_dir.run_json.read_text())
        ids = {**record.get("trackers", {}), **trackers.ids.copy()}  # copy: C-level, atomic
        if ids != record.get("trackers"):
            record["trackers"] = ids
            write_json_atomic(self.run_dir.run_json, record)



def _drafter_block(directory: Path) -> dict:
    """The `eagle3kit` block of a drafter's config.json ({} when there is none)."""
    import json

    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    block = config.get("eagle3kit") if isinstance(config, dict) else None
    return block if isinstance(block, dict) else {}


def _resolved(cfg: TrainConfig) -> dict:
    from dataclasses import asdict

    d = asdict(cfg)
    d.pop("output", None)
    d.pop("api_key", None)  # a secret: never stored
    d["data"] = [s.to_json() for s in cfg.data]
    return d



def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


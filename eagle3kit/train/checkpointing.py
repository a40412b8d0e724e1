"""A training run's state on disk: checkpoints written and resumed from, the drafter kept
beside them, and run.json (the run's settings, target, layers, vocabulary and plan)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

import eagle3kit.train.sharding as sharding
from eagle3kit import __version__
from eagle3kit._durable import write_json_atomic
from eagle3kit.checkpoints.native import drafter_weights, save_drafter
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
        return step

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
            from safetensors.torch import save_file

            save_file(drafter_weights(self.drafter, state=state),
                      str(tmp / "model.safetensors"))
            torch.save(optimizer, tmp / "optimizer.pt")
            torch.save(self.scheduler.state_dict(), tmp / "scheduler.pt")
            import json

            (tmp / "state.json").write_text(json.dumps({
                "step": step, "epoch": epoch, "tokens": tokens, "final": final,
                "total_steps": self.plan.total_steps, "world_size": ranks.world,
                "eval": self.last_eval, "time": _now()}, indent=2) + "\n")
            rd.sync_metrics()
            rd.commit_checkpoint(step, self.cfg.keep)
            self._save_drafter(step, tokens, state)
            self._record_tracker_ids()
        ranks.barrier()
        if hasattr(self, "clock"):
            self.clock.reset()

    def _save_drafter(self, step: int, tokens: int, state: dict | None) -> None:
        extra: dict[str, Any] = {
            "target": self.target_id, "layer_ids": self.layers,
            "vocab": {"size": self.vocab.size, "coverage": self.vocab.coverage},
            "training": {"run": str(self.cfg.out.resolve()), "step": step, "tokens": tokens,
                         "eagle3kit_version": __version__}}
        if self.last_eval is not None:
            extra["eval"] = self.last_eval
        save_drafter(self.drafter, self.run_dir.drafter, extra=extra, state=state)

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
            "trackers": dict(before.get("trackers") or {}),
        }
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



def _resolved(cfg: TrainConfig) -> dict:
    from dataclasses import asdict

    d = asdict(cfg)
    d.pop("output", None)
    d.pop("api_key", None)  # a secret: never stored
    d["data"] = [s.to_json() for s in cfg.data]
    return d



def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


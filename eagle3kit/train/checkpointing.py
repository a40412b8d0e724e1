"""A training run's state on disk, as functions over its `Setup` (setup.py): checkpoints
written (`save`) and resumed from (`resume`), the drafter kept beside them (the best or the
last step, train/selection.py), and run.json (the run's settings, target, layers,
vocabulary and plan)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

import eagle3kit.train.selection as selection
import eagle3kit.train.sharding as sharding
from eagle3kit import __version__, _ui
from eagle3kit._durable import write_json_atomic
from eagle3kit.checkpoints.native import save_drafter
from eagle3kit.checkpoints.resume_state import load_rng_state, load_tensors, save_rng_state
from eagle3kit.checkpoints.rundir import RUN_FORMAT, RUN_VERSION, RunDir
from eagle3kit.errors import UserError
from eagle3kit.train.builders import ADAM_EPS
from eagle3kit.train.config import TrainConfig
from eagle3kit.train.setup import Resumed

if TYPE_CHECKING:
    from eagle3kit.train.setup import Setup
    from eagle3kit.train.trackers import Trackers


@dataclass
class Evaluations:
    """The held-out evaluations a run keeps: a checkpoint records them, and with
    --drafter-step best, drafter/ holds the weights of `best`."""

    last: dict | None = None
    best: dict | None = None
    """The evaluation with the highest held-out predicted AL so far (train/selection.py)."""


# Resuming ------------------------------------------------------------------------------------
def resume(s: Setup) -> Resumed | None:
    """The run's last checkpoint restored into the model, optimizer, scheduler and random
    state; None when it has none (the run starts at step 0)."""
    steps = s.run_dir.steps()
    if not steps:
        return None
    step = steps[-1]
    where = s.run_dir.step_dir(step)
    from safetensors.torch import load_file

    weights = load_file(str(where / "model.safetensors"), device=str(s.device))
    missing, unexpected = sharding.load_weights(s.model, s.drafter, weights)
    if [m for m in missing if m != "embed_tokens.weight"] or unexpected:
        raise UserError(
            f"{where}: checkpoint does not fit this drafter "
            f"(missing {missing}, unexpected {unexpected})"
        )
    optimizer_state = load_tensors(where / "optimizer.pt")
    if len(optimizer_state.get("param_groups", [])) != len(s.optimizer.param_groups):
        # --fc-scale gives fc a group of its own: a run goes on with the groups it has
        raise UserError(
            f"{where}: its optimizer state was saved "
            + (
                "with --fc-scale off, so the run goes on with it: give --fc-scale off"
                if s.fc_scale != 1.0
                else "with an --fc-scale, so the run goes on with it: give the one its "
                "run.json records under settings"
            )
            + " (or start a new run directory)"
        )
    sharding.load_optimizer_state(s.model, s.optimizer, optimizer_state, s.param_names)
    s.scheduler.load_state_dict(load_tensors(where / "scheduler.pt"))
    _apply_optimizer_settings(s.cfg, s.optimizer, s.scheduler, s.fc_scale)
    rank = s.ranks.rank
    rng = where / f"rng-rank{rank}.safetensors"
    if (where / f"rng-rank{rank}.pt").exists():
        # Written by an earlier eagle3kit as a pickle, which can hold code: never loaded.
        raise UserError(
            f"{where / f'rng-rank{rank}.pt'}: a pickled random "
            "state, which eagle3kit does not load (a pickle can run code); "
            f"delete it to resume from {where.name} without it (the data "
            "order is kept, the random draws are new)"
        )
    if rng.is_file():
        load_rng_state(rng)
    state = json.loads((where / "state.json").read_text())
    return Resumed(
        step,
        int(state.get("tokens", 0)),
        state.get("eval"),
        _resume_best(s, state.get("best"), step),
    )


def _apply_optimizer_settings(
    cfg: TrainConfig,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LambdaLR,
    fc_scale: float,
) -> None:
    """The learning rate, weight decay and --fc-scale of this command, not the restored ones.

    A restored optimizer and scheduler carry the first run's `--lr` (as the scheduler's base
    rates) and `--weight-decay`; they differ from this command's only under `--force`,
    where the user asked for the new ones. The schedule's shape is this command's already
    (its function is not saved), so the rate continues from the restored step. fc's group
    (the second, with --fc-scale: build_optimizer) takes its factor from the set-up, not
    from the state: a state gathered under FSDP does not keep a group's own keys.
    """
    scales = [1.0, fc_scale][: len(optimizer.param_groups)]
    scheduler.base_lrs = [cfg.peak_lr * c for c in scales]
    rates = [
        base * factor(scheduler.last_epoch)
        for base, factor in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)
    ]
    for group, rate, c in zip(optimizer.param_groups, rates, scales, strict=True):
        group.update(
            initial_lr=cfg.peak_lr * c, lr=rate, weight_decay=cfg.weight_decay / c, eps=ADAM_EPS / c
        )
    scheduler._last_lr = rates  # what get_last_lr() reports until the next step


def _resume_best(s: Setup, recorded: dict | None, step: int) -> dict | None:
    """The best evaluation so far, as the checkpoint recorded it or as drafter/ holds it
    (a best written after that checkpoint, by a run killed before the next one: the same
    trajectory, so it stands, and its weights are there)."""
    rd, cfg = s.run_dir, s.cfg
    if s.ranks.rank == 0:
        rd.recover_drafter()
    s.ranks.barrier()
    block = _drafter_block(rd.drafter)
    held = block.get("eval") if block.get("chosen") == "best" else None
    best = selection.better_of(recorded, held)
    before = s.previous.get("settings") or {}
    now = cfg.trajectory_options()
    changed = [k for k in selection.COMPARABLE if before.get(k) != now.get(k)]
    if best is not None and changed:
        flags = ", ".join("--" + k.replace("_", "-") if k != "data" else k for k in changed)
        _ui.warn(
            f"train: {flags} changed (--force): the held-out figures before step "
            f"{step} measured something else, so the best step is chosen "
            "afresh from the next evaluation"
        )
        return None
    if best is not None and _measured_otherwise(s.heldout.conditions(), best):
        return None
    if (
        best is not None
        and cfg.drafter_step == "best"
        and (held is None or int(held["step"]) != int(best["step"]))
    ):
        holds = (
            f"it holds step {block['training']['step']}, kept as the "
            f"{block.get('chosen', 'last')} step"
            if block.get("training")
            else "there is none"
        )
        _ui.warn(
            f"train: the best evaluated step so far, {best['step']} (held-out AL "
            f"{best[selection.AL]:.3f}), is not in {rd.drafter} ({holds}); the best "
            "is chosen afresh from the next evaluation"
        )
        return None
    return best


def _measured_otherwise(now: dict, best: dict) -> bool:
    """Whether the best so far was predicted otherwise than this run's evaluations will be
    (another --eval-temperature or --eval-verify, or the method an older eagle3kit used),
    which says so: its figure is not comparable to theirs."""
    if selection.measured_alike(best, now):
        return False
    _ui.warn(
        f"train: the held-out prediction is now made {_conditions(now)}; the best so far "
        f"(step {best['step']}) was made {_conditions(best)}, so the best step is chosen "
        "afresh from the next evaluation"
    )
    return True


def _conditions(evaluation: dict) -> str:
    """How a held-out figure was predicted, for a message."""
    c = selection.conditions_of(evaluation)
    if not c["temperature"]:
        return "at temperature 0"
    return f"at temperature {c['temperature']:g}, verify {c['verify']}, {c['prediction']}"


# Saving --------------------------------------------------------------------------------------
def save(
    s: Setup,
    evals: Evaluations,
    step: int,
    epoch: int,
    tokens: int,
    final: bool,
    trackers: Trackers | None,
) -> None:
    """The checkpoint of `step` (every rank takes part), and drafter/ following it unless it
    holds the best step."""
    rd, ranks = s.run_dir, s.ranks
    tmp = rd.temp_dir(step)
    if ranks.rank == 0:
        rd.begin_checkpoint(step)
    ranks.barrier()
    save_rng_state(tmp / f"rng-rank{ranks.rank}.safetensors")
    state = sharding.full_weights(s.model, s.drafter)  # collectives under FSDP
    optimizer = sharding.full_optimizer_state(s.model, s.optimizer, s.param_names)
    ranks.barrier()
    if ranks.rank == 0:
        # A whole drafter checkpoint (config.json beside the weights): a kept step is
        # what export and info read as any checkpoint, the last one included.
        save_drafter(
            s.drafter, tmp, extra=_drafter_extra(s, evals, step, tokens, "step"), state=state
        )
        torch.save(optimizer, tmp / "optimizer.pt")
        torch.save(s.scheduler.state_dict(), tmp / "scheduler.pt")
        (tmp / "state.json").write_text(
            json.dumps(
                {
                    "step": step,
                    "epoch": epoch,
                    "tokens": tokens,
                    "final": final,
                    "total_steps": s.plan.total_steps,
                    "world_size": ranks.world,
                    "eval": evals.last,
                    "best": evals.best,
                    "time": timestamp(),
                },
                indent=2,
            )
            + "\n"
        )
        rd.sync_metrics()
        rd.commit_checkpoint(step, s.cfg.keep)
        if not drafter_is_best(s.cfg, evals):
            save_drafter_dir(s, evals, step, tokens, state)
        record_selection(s, evals, step)
        record_tracker_ids(rd, trackers)
    ranks.barrier()


# The drafter the run serves (eagle3kit/train/selection.py) ----------------------------------
def drafter_is_best(cfg: TrainConfig, evals: Evaluations) -> bool:
    """Whether drafter/ holds the best evaluation rather than following the last step."""
    return cfg.drafter_step == "best" and evals.best is not None


def consider(s: Setup, evals: Evaluations, evaluation: dict | None, tokens: int) -> None:
    """After an evaluation (every rank: the figures are reduced, so all agree): a new
    best is recorded and, with --drafter-step best, written to drafter/ now, while its
    weights are the model's."""
    if not selection.improves(evaluation, evals.best):
        return
    assert evaluation is not None  # improves() says so
    evals.best = evaluation
    if s.cfg.drafter_step != "best":
        return
    step = int(evaluation["step"])
    state = sharding.full_weights(s.model, s.drafter)  # collectives under FSDP
    if s.ranks.rank == 0:
        save_drafter_dir(s, evals, step, tokens, state)
        record_selection(s, evals, step)
    s.ranks.barrier()


def selection_of(s: Setup, evals: Evaluations, last_step: int) -> dict:
    """Which step drafter/ holds and why (run.json's `selection`, the summary's)."""
    best = evals.best
    held = int(best["step"]) if drafter_is_best(s.cfg, evals) and best else last_step
    return selection.record(s.cfg.drafter_step, held, best, evals.last, bool(s.pool.heldout))


def record_selection(s: Setup, evals: Evaluations, last_step: int) -> None:
    """run.json's `selection` (rank 0)."""
    s.run_dir.update_record(selection=selection_of(s, evals, last_step))


def _drafter_extra(
    s: Setup, evals: Evaluations, step: int, tokens: int, chosen: str
) -> dict[str, Any]:
    """The `eagle3kit` block of a drafter's config.json beyond its drafter config;
    `chosen`: why these weights were written (best, last, or step: a checkpoint's)."""
    extra: dict[str, Any] = {
        "target": s.target_id,
        "layer_ids": s.layers,
        "vocab": {"size": s.vocab.size, "coverage": s.vocab.coverage},
        "training": {
            "run": str(s.cfg.out.resolve()),
            "step": step,
            "tokens": tokens,
            "ttt_steps": s.cfg.ttt_steps,
            "eagle3kit_version": __version__,
        },
        "chosen": chosen,
    }
    evaluation = evals.last
    if chosen == "best" and evals.best is not None:
        evaluation = evals.best
    if evaluation is not None:
        extra["eval"] = evaluation
    return extra


def save_drafter_dir(
    s: Setup, evals: Evaluations, step: int, tokens: int, state: dict | None
) -> None:
    """drafter/ replaced whole by the weights of `step` (rank 0)."""
    rd = s.run_dir
    chosen = "best" if drafter_is_best(s.cfg, evals) else "last"
    save_drafter(
        s.drafter,
        rd.begin_drafter(),
        extra=_drafter_extra(s, evals, step, tokens, chosen),
        state=state,
    )
    rd.publish_drafter()


# run.json ------------------------------------------------------------------------------------
def write_run_json(s: Setup) -> dict:
    """run.json written (and the draft vocabulary beside it); what it holds."""
    from safetensors.torch import save_file

    rd, cfg = s.run_dir, s.cfg
    if not s.continuing or not rd.vocab.is_file():
        save_file(
            {"d2t": torch.from_numpy(s.vocab.d2t), "t2d": torch.from_numpy(s.vocab.t2d)},
            str(rd.vocab),
        )
    before = s.previous
    history = list(before.get("settings_history", []))
    if s.continuing and before.get("settings") != cfg.trajectory_options():
        history.append({"time": timestamp(), "settings": before.get("settings")})
    long = s.pool.long.to_dict()
    record = {
        "format": RUN_FORMAT,
        "version": RUN_VERSION,
        "eagle3kit_version": __version__,
        "created": before.get("created", timestamp()),
        "updated": timestamp(),
        "settings": cfg.trajectory_options(),
        "settings_history": history,
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in _resolved(cfg).items()},
        "world_size": s.ranks.world,
        "mode": ("online-server" if cfg.servers else "online" if cfg.online else "offline"),
        "servers": [u for u, _ in cfg.server_slots],
        "parallel": sharding.parallel(s.model, s.ranks.world),
        "target": s.target_id,
        "trust_remote_code": cfg.trust_remote_code,
        "layer_ids": s.layers,
        "layer_convention": "boundary",
        "drafter": s.drafter.config.to_dict(),
        "vocab": {
            "size": s.vocab.size,
            "coverage": s.vocab.coverage,
            "source": s.vocab_source,
            "file": rd.vocab.name,
        },
        "data": [src.manifest_summary() for src in s.sources],
        "plan": {
            "total_steps": s.plan.total_steps,
            "epochs": len(s.plan.epochs),
            "train_samples": sum(len(t) for t in s.pool.train),
            "heldout_samples": len(s.pool.heldout),
            "long_samples": long,
            "too_short": s.pool.too_short,
        },
        # --report-to's tracker runs (name: run id), which a resumed run continues.
        "trackers": (dict(before["trackers"]) if isinstance(before.get("trackers"), dict) else {}),
    }
    if before.get("selection"):  # which step drafter/ holds, until the next checkpoint
        record["selection"] = before["selection"]
    write_json_atomic(rd.run_json, record)
    return record


def record_tracker_ids(run_dir: RunDir, trackers: Trackers | None) -> None:
    """The trackers' run ids into run.json once they are known (rank 0), so a resumed run
    continues them; a tracker starts in the background, so this comes at checkpoints."""
    if trackers is None or not trackers.ids:
        return
    record = json.loads(run_dir.run_json.read_text())
    known = record.get("trackers")
    ids = {**(known if isinstance(known, dict) else {}), **trackers.ids.copy()}  # copy: atomic
    if ids != record.get("trackers"):
        record["trackers"] = ids
        write_json_atomic(run_dir.run_json, record)


def _drafter_block(directory: Path) -> dict:
    """The `eagle3kit` block of a drafter's config.json ({} when there is none)."""
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


def timestamp() -> str:
    """Now, in UTC, to the second (run.json's and metrics.jsonl's times)."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")

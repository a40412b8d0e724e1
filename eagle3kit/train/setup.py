"""Setting a training run up: `build` makes each part once, in order, and returns them as one
`Setup`: the run directory (a new one, or one to continue) and its lock, the target, the
data and its plan, the aux layers, the target's head and the feed, the draft vocabulary, the
drafter and its loss, the optimizer and the learning-rate schedule, and what a continued run
resumed. Each builder (builders.py) returns what it made. `announce` tells the user what
was set up."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

import eagle3kit.train.data as tdata
import eagle3kit.train.sharding as sharding
from eagle3kit import _ui
from eagle3kit._lock import RunLock
from eagle3kit._ranks import Ranks
from eagle3kit.checkpoints.rundir import RunDir
from eagle3kit.errors import UserError
from eagle3kit.model import (
    DraftVocab,
    Eagle3Drafter,
)
from eagle3kit.target import (
    TargetInfo,
    dtype_name,
    location,
)
from eagle3kit.train.builders import (
    build_drafter,
    build_optimizer,
    load_target,
    open_run_dir,
    resolve_layers,
)
from eagle3kit.train.config import TrainConfig, with_fc_scale_for, with_lr_for
from eagle3kit.train.feed import Feed
from eagle3kit.train.heldout import HeldOut
from eagle3kit.train.losses import step_loss
from eagle3kit.train.target import TargetHead
from eagle3kit.train.ttt import TTTLoss


@dataclass
class Resumed:
    """What a continued run takes from its last checkpoint, beyond the weights and the
    optimizer's state (restored in place)."""

    step: int
    """The checkpoint's step: training continues after it."""
    tokens: int
    """Tokens trained on up to that step."""
    last_eval: dict | None
    """The last held-out evaluation before it."""
    best: dict | None
    """The best evaluation so far (train/selection.py); None when it is chosen afresh."""


@dataclass
class Setup:
    """Everything a run's set-up made, each part once, in the order `build` makes them."""

    cfg: TrainConfig
    ranks: Ranks
    device: torch.device
    autocast: torch.dtype | None
    """The drafter's autocast dtype (None: fp32)."""
    run_dir: RunDir
    lock: RunLock
    """The run directory's lock, held until the run ends (`release`)."""
    continuing: bool
    """The run directory held a run, which this one continues."""
    previous: dict[str, Any]
    """That run's run.json ({} for a new run)."""
    target_cfg: Any
    """The target's transformers config (any architecture)."""
    target_id: dict[str, Any]
    """Where the target is and what identifies it (run.json's `target`)."""
    sources: list[tdata.DataSource]
    max_len: int | None
    pool: tdata.Pool
    plan: tdata.BatchPlan
    layers: list[int]
    """The aux layer ids the drafter reads."""
    head: TargetHead
    feed: Feed
    heldout: HeldOut
    vocab: DraftVocab
    vocab_source: str
    """Where the draft vocabulary came from (counted, or --init-from's)."""
    drafter: Eagle3Drafter
    loss: TTTLoss
    model: nn.Module
    """The loss, wrapped for the ranks (DDP or FSDP; itself for one process)."""
    params: list[nn.Parameter]
    param_names: list[str]
    """The names of `params` in the optimizer's order (its groups one after the other)."""
    fc_scale: float
    """--fc-scale as a factor (1: not given)."""
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    resumed: Resumed | None = None
    """What a continued run resumed from (None: it starts at step 0)."""

    @property
    def start(self) -> int:
        """The step training starts after."""
        return self.resumed.step if self.resumed is not None else 0

    def release(self) -> None:
        self.lock.release()


def build(cfg: TrainConfig, ranks: Ranks) -> Setup:
    """Set the run up (or pick one up), holding its run directory; the caller releases it."""
    assert cfg.target is not None  # TrainConfig refuses a run without --target
    device = ranks.device
    autocast = torch.bfloat16 if dtype_name(cfg.dtype, device) == "bfloat16" else None
    target = TargetInfo.load(cfg.target, cfg.trust_remote_code)  # the flag, never a record's
    target_id = {**location(cfg.target), **target.identity}
    cfg = with_lr_for(cfg, int(target.config.hidden_size))  # the drafter is as wide
    sources = [tdata.open_source(d.path, d.weight, cfg.online) for d in cfg.data]
    run_dir = RunDir(cfg.out)
    lock, previous = open_run_dir(cfg, ranks, run_dir, target_id)
    cfg = with_fc_scale_for(cfg, previous)
    try:
        setup = _build_held(
            cfg, ranks, device, autocast, run_dir, lock, previous, target.config, target_id, sources
        )
    except BaseException:
        lock.release()
        raise
    return setup


def _build_held(
    cfg: TrainConfig,
    ranks: Ranks,
    device: torch.device,
    autocast: torch.dtype | None,
    run_dir: RunDir,
    lock: RunLock,
    previous: dict | None,
    target_cfg: Any,
    target_id: dict,
    sources: list[tdata.DataSource],
) -> Setup:
    """The rest of the set-up, once the run directory is held."""
    layers = resolve_layers(cfg, sources, target_cfg, target_id, previous)
    masks = tdata.held_out(sources, cfg.eval_split)
    max_len = cfg.max_len or getattr(target_cfg, "max_position_embeddings", None)
    pool = tdata.build_pool(sources, masks, max_len, cfg.long_samples)
    plan = tdata.make_plan(
        pool,
        [d.weight for d in cfg.data],
        cfg.seed,
        cfg.batch_tokens,
        ranks.world * cfg.grad_accum,
        cfg.epochs,
        cfg.max_steps,
        cfg.data_order == "fixed",
    )
    head, target = load_target(cfg, target_cfg, layers, sources, device)
    feed = Feed(cfg, ranks, sources, pool, plan, layers, int(target_cfg.hidden_size), target)
    drafter, vocab, vocab_source = build_drafter(
        cfg, ranks, run_dir, head, target_cfg, target_id, layers, sources, pool, previous
    )
    drafter = drafter.to(device)
    fc_scale = resolve_fc_scale(cfg, feed)
    if fc_scale != 1.0 and cfg.init_from is None:
        with torch.no_grad():  # a new fc's weights as c x those of V (build_optimizer)
            drafter.fc.weight.mul_(fc_scale)
    loss = TTTLoss(
        drafter,
        head,
        cfg.ttt_steps,
        cfg.ttt_decay,
        step_loss(cfg.loss),
        cfg.auf_rule(),
        cfg.teacher_temperature,
    )
    if cfg.fsdp and ranks.world == 1:
        _ui.info("train: --fsdp: one process, nothing to shard", cfg.output)
    model = sharding.wrap(loss, ranks.world, device, cfg.fsdp)
    params = drafter.trainable_parameters()
    optimizer, scheduler = build_optimizer(
        cfg, params, plan.total_steps, drafter.fc.weight, fc_scale
    )
    names = {id(p): n for n, p in loss.named_parameters()}
    param_names = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
    return Setup(
        cfg=cfg,
        ranks=ranks,
        device=device,
        autocast=autocast,
        run_dir=run_dir,
        lock=lock,
        continuing=previous is not None,
        previous=previous or {},
        target_cfg=target_cfg,
        target_id=target_id,
        sources=sources,
        max_len=max_len,
        pool=pool,
        plan=plan,
        layers=layers,
        head=head,
        feed=feed,
        heldout=HeldOut(cfg, ranks, feed, head),
        vocab=vocab,
        vocab_source=vocab_source,
        drafter=drafter,
        loss=loss,
        model=model,
        params=params,
        param_names=param_names,
        fc_scale=fc_scale,
        optimizer=optimizer,
        scheduler=scheduler,
    )


def resolve_fc_scale(cfg: TrainConfig, feed: Feed) -> float:
    """--fc-scale (resolved: with_fc_scale_for) as a factor: the number given, 1 when off,
    1 / the states' RMS for auto."""
    assert cfg.fc_scale is not None  # resolved by with_fc_scale_for
    if cfg.fc_scale != "auto":
        return 1.0 if cfg.fc_scale == "off" else float(cfg.fc_scale)
    rms = feed.aux_rms()
    if not (rms > 0 and math.isfinite(rms)):
        raise UserError(
            f"--fc-scale auto: the first training samples' states have RMS {rms}: "
            "give the factor as a number"
        )
    return 1.0 / rms


# What was set up --------------------------------------------------------------------------------
def announce(s: Setup) -> None:
    """The lines that tell the user what was set up."""
    cfg, opts = s.cfg, s.cfg.output
    long = s.pool.long
    cov = s.vocab.coverage
    mode = "online from --server" if cfg.servers else "online" if cfg.online else "offline"
    _ui.info(
        f"train: {mode}, layers "
        f"{','.join(map(str, s.layers))}, draft vocabulary {s.vocab.size:,}"
        + (f" covering {100 * cov:.2f}% of the training tokens" if cov is not None else "")
        + f" ({s.vocab_source})"
        + (f", sliding window {cfg.sliding_window:,} tokens" if cfg.sliding_window else ""),
        opts,
    )
    if s.ranks.world > 1:
        _ui.info(
            f"train: {s.ranks.world} ranks, "
            + (
                "FSDP: parameters, gradients and optimizer state sharded"
                if sharding.parallel(s.model, s.ranks.world) == "fsdp"
                else "DDP: a whole drafter per rank"
            ),
            opts,
        )
    _ui.info(
        f"train: {sum(len(t) for t in s.pool.train):,} training samples, "
        f"{len(s.pool.heldout):,} held out, {s.plan.total_steps:,} steps"
        + (f", resuming after step {s.start:,}" if s.start else ""),
        opts,
    )
    if s.fc_scale != 1.0:
        _ui.info(
            f"train: fc trained as if the states reached it x {s.fc_scale:.4g}"
            + (
                f" (--fc-scale auto: their RMS is {1 / s.fc_scale:.4g})"
                if cfg.fc_scale == "auto"
                else ""
            ),
            opts,
        )
    if long.dropped or long.truncated:
        limit = (
            f"--max-len {s.max_len}"
            if cfg.max_len
            else f"the target's context length ({s.max_len})"
        )
        _ui.warn(
            f"{limit}: {long.dropped} samples dropped, {long.truncated} truncated "
            f"({long.tokens_cut:,} tokens cut)"
        )

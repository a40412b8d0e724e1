"""Setting a training run up: `build` makes each part once, in order, and returns them as one
`Setup`: the run directory (a new one, or one to continue) and its lock, the target, the
data and its plan, the aux layers, the target's head and the feed, the draft vocabulary, the
drafter and its loss, the optimizer and the learning-rate schedule, and what a continued run
resumed. Each builder returns what it made. `announce` tells the user what was set up."""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

import eagle3kit.train.data as tdata
import eagle3kit.train.sharding as sharding
from eagle3kit import _ui
from eagle3kit._lock import RunLock
from eagle3kit._ranks import Ranks
from eagle3kit.checkpoints.rundir import RunDir, options_diff
from eagle3kit.errors import UserError
from eagle3kit.model import (
    VARIANTS,
    DrafterConfig,
    DraftVocab,
    Eagle3Drafter,
    build_vocab,
    describe_variant,
)
from eagle3kit.target import (
    TargetInfo,
    check_layer_ids,
    dtype_name,
    identity_mismatch,
    location,
    resolve_dtype,
    resolve_layer_ids,
)
from eagle3kit.train.config import TrainConfig
from eagle3kit.train.feed import Feed
from eagle3kit.train.heldout import HeldOut
from eagle3kit.train.init_from import check_init, check_init_variant, load_init
from eagle3kit.train.losses import step_loss
from eagle3kit.train.target import OfflineTarget, OnlineTarget, TargetHead
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
    sources = [tdata.open_source(d.path, d.weight, cfg.online) for d in cfg.data]
    run_dir = RunDir(cfg.out)
    lock, previous = open_run_dir(cfg, ranks, run_dir, target_id)
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
    param_names = [n for n, p in loss.named_parameters() if p.requires_grad]
    params = drafter.trainable_parameters()
    optimizer, scheduler = build_optimizer(cfg, params, plan.total_steps)
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
        optimizer=optimizer,
        scheduler=scheduler,
    )


# The builders -------------------------------------------------------------------------------
def open_run_dir(
    cfg: TrainConfig, ranks: Ranks, rd: RunDir, target_id: dict
) -> tuple[RunLock, dict | None]:
    """The run directory held (its lock) and, when it holds a run this one continues, that
    run's run.json (None: a new run, in a directory made empty)."""
    # Checked before the lock is taken, so a refused directory gets no lock files; and
    # again once it is held, as another train may have changed it in between.
    rd.check_usable(cfg.write.mode)
    # One train owns the directory; a single process is a run of its own.
    lock = rd.hold(ranks.run_id or uuid.uuid4().hex)
    try:
        previous = _check_continuable(cfg, ranks, rd, target_id)
    except BaseException:
        lock.release()
        raise
    ranks.barrier()
    return lock, previous


def _check_continuable(cfg: TrainConfig, ranks: Ranks, rd: RunDir, target_id: dict) -> dict | None:
    if not rd.check_usable(cfg.write.mode):
        if ranks.rank == 0:
            if rd.path.exists():
                rd.clear()
            rd.path.mkdir(parents=True, exist_ok=True)
        return None
    before = rd.read()
    diff = options_diff(before.get("settings", {}), cfg.trajectory_options())
    parts = before.get("world_size", 1) * before.get("settings", {}).get("grad_accum", 1)
    if parts != ranks.world * cfg.grad_accum:
        diff.append(f"ranks x --grad-accum: {parts} -> {ranks.world * cfg.grad_accum}")
    if diff and not cfg.write.force:
        raise UserError(
            f"{rd.path}: this run was started with other settings ("
            + "; ".join(diff)
            + "); rerun with them, pass --force to "
            "continue anyway, or --overwrite to start afresh"
        )
    mismatch = identity_mismatch(before.get("target", {}), target_id)
    if mismatch and not cfg.write.force:
        raise UserError(
            f"{rd.path}: started with another target config than "
            f"--target {cfg.target} ({mismatch[0]} {mismatch[1]!r} there, "
            f"{mismatch[2]!r} here); pass --force to continue anyway"
        )
    return before


def resolve_layers(
    cfg: TrainConfig,
    sources: list[tdata.DataSource],
    target_cfg: Any,
    target_id: dict,
    previous: dict | None,
) -> list[int]:
    """The aux layer ids: offline, the datasets'; online, the continued run's, --layers,
    --init-from's or the default for the target's depth."""
    if not cfg.online:
        return _layers_of(sources, target_id)
    if previous is not None:
        return list(previous["layer_ids"])
    n = target_cfg.num_hidden_layers
    if cfg.layers is not None:
        assert not isinstance(cfg.layers, str)  # TrainConfig parsed --layers
        return check_layer_ids(cfg.layers, n, count=3)
    if cfg.init_from is not None:
        try:
            raw = json.loads((cfg.init_from / "config.json").read_text())
        except (OSError, ValueError):
            raw = {}
        ids = raw.get("eagle3kit", {}).get("drafter", {}).get("aux_layer_ids") or raw.get(
            "eagle_aux_hidden_state_layer_ids"
        )
        if ids:
            return list(ids)
    return resolve_layer_ids(None, n)


def _layers_of(sources: list[tdata.DataSource], target_id: dict) -> list[int]:
    """Offline: the aux layer ids the hidden datasets were extracted at, all the same, for
    this target."""
    layers = sources[0].dataset.layer_ids  # type: ignore[attr-defined]
    for s in sources:
        ds: Any = s.dataset
        if ds.layer_ids != layers:
            raise UserError(
                f"{s.path}: extracted at layers {ds.layer_ids}, "
                f"{sources[0].path} at {layers}; mix datasets of the same layers"
            )
        if ds.hidden_size != target_id["hidden_size"]:
            raise UserError(
                f"{s.path}: states of width {ds.hidden_size}, but --target has "
                f"hidden size {target_id['hidden_size']}: another model's states"
            )
        mismatch = identity_mismatch(ds.target, target_id)
        if mismatch:
            key, theirs, ours = mismatch
            raise UserError(
                f"{s.path}: extracted from a target with {key} {theirs}, --target has {ours}"
            )
        if ds.last_state not in ("pre_norm", "post_norm"):
            raise UserError(f"{s.path}: unknown last_state {ds.last_state!r}")
    if len({s.dataset.last_state for s in sources}) > 1:  # type: ignore[attr-defined]
        raise UserError(
            "the hidden datasets store the last state differently (pre- and "
            "post-norm); extract them the same way"
        )
    return list(layers)


def load_target(
    cfg: TrainConfig,
    target_cfg: Any,
    layers: list[int],
    sources: list[tdata.DataSource],
    device: torch.device,
) -> tuple[TargetHead, OnlineTarget | OfflineTarget]:
    """The target's head and what makes its batches: the whole target in the loop (--online),
    or the head over stored states (offline, and --server's fetched ones)."""
    assert cfg.target is not None  # TrainConfig refuses a run without --target
    if cfg.online and not cfg.servers:
        online = OnlineTarget.load(cfg.target, layers, device, cfg.trust_remote_code)
        return online.head, online
    dtype = resolve_dtype("auto", device)
    head = TargetHead.load(cfg.target, target_cfg, cfg.trust_remote_code).to_device(device, dtype)
    # --server: vLLM's id N is the last layer's output before the norm, as extract's
    last = "pre_norm" if cfg.online else sources[0].dataset.last_state  # type: ignore[attr-defined]
    return head, OfflineTarget(head, last, device)


def build_drafter(
    cfg: TrainConfig,
    ranks: Ranks,
    run_dir: RunDir,
    head: TargetHead,
    target_cfg: Any,
    target_id: dict,
    layers: list[int],
    sources: list[tdata.DataSource],
    pool: tdata.Pool,
    previous: dict | None,
) -> tuple[Eagle3Drafter, DraftVocab, str]:
    """The drafter to train (on the host), its draft vocabulary and where that came from:
    --init-from's, or a new one over the counted (or continued run's) vocabulary."""
    torch.manual_seed(cfg.seed)
    embedding = head.embedding.detach().float().cpu()
    vocab_source = "counted"
    if cfg.init_from is not None and not (previous is not None and run_dir.steps()):
        drafter = load_init(cfg.init_from, target_cfg)
        check_init(drafter, target_cfg, layers, cfg.init_from)
        check_init_variant(drafter, cfg)
        if not drafter.config.embed_requires_grad:  # its own embedding stays its own
            drafter.load_target_embedding(embedding)
        vocab = DraftVocab.from_d2t(drafter.d2t.numpy(), target_cfg.vocab_size)
        vocab.coverage = _coverage(vocab, sources, pool, target_cfg.vocab_size)
        vocab_source = f"init-from {cfg.init_from}"
    else:
        vocab = _vocab(cfg, run_dir, sources, pool, target_cfg.vocab_size, previous)
        config = DrafterConfig.from_target(
            target_cfg,
            draft_vocab_size=vocab.size,
            aux_layer_ids=layers,
            target_name_or_path=target_id["name_or_path"],
        )
        for name, value in _variant(cfg, ranks, previous).items():
            setattr(config, name, value)
        drafter = Eagle3Drafter(config)
        drafter.set_vocab(torch.from_numpy(vocab.d2t), torch.from_numpy(vocab.t2d))
        drafter.load_target_embedding(embedding)
        if cfg.lm_head != "train":
            with torch.no_grad():
                rows = head.lm_head.detach().float().cpu()[torch.from_numpy(vocab.draft_ids)]
                drafter.lm_head.weight.copy_(rows)
    drafter.config.sliding_window = cfg.sliding_window  # the run's choice, not --init-from's
    drafter.embed_tokens.weight.requires_grad_(drafter.config.embed_requires_grad)
    drafter.lm_head.weight.requires_grad_(cfg.lm_head != "frozen")
    return drafter, vocab, vocab_source


def _vocab(
    cfg: TrainConfig,
    run_dir: RunDir,
    sources: list[tdata.DataSource],
    pool: tdata.Pool,
    vocab_size: int,
    previous: dict | None,
) -> DraftVocab:
    """The continued run's draft vocabulary, or one counted over the training data."""
    if previous is not None and run_dir.vocab.is_file():
        from safetensors.torch import load_file

        saved = load_file(str(run_dir.vocab))
        vocab = DraftVocab.from_d2t(saved["d2t"].numpy(), vocab_size)
        vocab.coverage = previous.get("vocab", {}).get("coverage")
        return vocab
    counts = tdata.count_vocab(sources, pool, vocab_size)
    return build_vocab(counts, min(cfg.draft_vocab, vocab_size))


def _variant(cfg: TrainConfig, ranks: Ranks, previous: dict | None) -> dict:
    """The new drafter's layout: a continued run keeps the one it recorded (its weights
    have that shape), a fresh one takes --variant and the field flags."""
    if previous is None:
        return cfg.drafter_variant()
    recorded = previous.get("drafter") or {}
    plain = dict(VARIANTS["eagle3"])
    kept = {name: recorded.get(name, plain[name]) for name in plain}
    if cfg.variant_given and kept != cfg.drafter_variant() and ranks.rank == 0:
        _ui.warn(
            f"train: the run's drafter is {describe_variant(kept)}; it keeps that "
            f"layout (--variant and its flags apply to a new run)"
        )
    return kept


def _coverage(
    vocab: DraftVocab, sources: list[tdata.DataSource], pool: tdata.Pool, vocab_size: int
) -> float:
    counts = tdata.count_vocab(sources, pool, vocab_size)
    total = counts.sum()
    return float(counts[vocab.draft_ids].sum() / total) if total else 0.0


def build_optimizer(
    cfg: TrainConfig, params: list[nn.Parameter], total: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over `params` and its learning-rate schedule over `total` steps."""
    optimizer = torch.optim.AdamW(
        params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay
    )
    warmup = int(cfg.warmup) if cfg.warmup >= 1 else math.ceil(cfg.warmup * total)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lr_lambda(total, max(warmup, 1) if cfg.warmup else 0, cfg.min_lr / cfg.lr, cfg.schedule),
    )
    return optimizer, scheduler


def lr_lambda(
    total: int, warmup: int, floor: float, schedule: str = "cosine"
) -> Callable[[int], float]:
    """The learning rate's factor at each step: a linear warmup, then --schedule down to
    `floor` (--min-lr / --lr) at `total`."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if schedule == "constant":
            return 1.0
        shape = 1 - progress if schedule == "linear" else 0.5 * (1 + math.cos(math.pi * progress))
        return floor + (1 - floor) * shape

    return factor


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

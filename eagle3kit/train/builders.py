"""The builders of a training run's parts, which setup.py's `build` calls in order: the run
directory (new, or one to continue, checked against what it recorded), the aux layers, the
target, the drafter with its vocabulary and variant, and the optimizer and its schedule.
Each returns what it made.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import eagle3kit.train.data as tdata
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
    check_layer_ids,
    identity_mismatch,
    resolve_dtype,
    resolve_layer_ids,
)
from eagle3kit.train.config import TrainConfig, with_fc_scale_for
from eagle3kit.train.init_from import check_init, check_init_variant, load_init
from eagle3kit.train.target import OfflineTarget, OnlineTarget, TargetHead


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
    # --fc-scale not given: the run keeps its own, as set-up will resolve it
    options = with_fc_scale_for(cfg, before).trajectory_options()
    diff = options_diff(before.get("settings", {}), options)
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


ADAM_EPS = 1e-8
"""AdamW's epsilon (torch's default)."""


def build_optimizer(
    cfg: TrainConfig,
    params: list[nn.Parameter],
    total: int,
    fc: torch.Tensor | None = None,
    fc_scale: float = 1.0,
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over `params` and its learning-rate schedule over `total` steps. With an
    `fc_scale` c other than 1, `fc` (one of `params`) is a group of its own whose learning
    rate is c times the others', weight decay and epsilon 1/c times: AdamW
    then moves fc's weights W as it would move V = W / c if the states reached fc multiplied
    by c (whose gradients are c times W's)."""
    groups: list[Any] = list(params)
    if fc_scale != 1.0 and fc is not None:
        groups = [
            {"params": [p for p in params if p is not fc]},
            {
                "params": [fc],
                "lr": cfg.peak_lr * fc_scale,
                "weight_decay": cfg.weight_decay / fc_scale,
                "eps": ADAM_EPS / fc_scale,
            },
        ]
    optimizer = torch.optim.AdamW(
        groups, lr=cfg.peak_lr, betas=(0.9, 0.95), eps=ADAM_EPS, weight_decay=cfg.weight_decay
    )
    warmup = int(cfg.warmup) if cfg.warmup >= 1 else math.ceil(cfg.warmup * total)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lr_lambda(
            total, max(warmup, 1) if cfg.warmup else 0, cfg.min_lr / cfg.peak_lr, cfg.schedule
        ),
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

"""Setting a training run up: its run directory (a new one, or one to continue), the aux
layers, the target, the draft vocabulary, the drafter and its layout, the optimizer and the
learning-rate schedule; and the lines that tell the user what was set up."""

from __future__ import annotations

import math
import uuid
from typing import Any

import torch

import eagle3kit.train.data as tdata
import eagle3kit.train.sharding as sharding
from eagle3kit import _ui
from eagle3kit.checkpoints.rundir import settings_diff
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
from eagle3kit.train.init_from import _check_init, _check_init_variant, _load_init
from eagle3kit.train.soft_ce import Objective
from eagle3kit.train.state import TrainerState
from eagle3kit.train.target import OfflineTarget, OnlineTarget, TargetHead
from eagle3kit.train.ttt import TTTLoss


def _layers_of(sources: list[tdata.Source], target_id: dict) -> list[int]:
    """Offline: the aux layer ids the hidden datasets were extracted at, all the same, for
    this target."""
    layers = sources[0].dataset.layer_ids  # type: ignore[attr-defined]
    for s in sources:
        ds: Any = s.dataset
        if ds.layer_ids != layers:
            raise UserError(f"{s.path}: extracted at layers {ds.layer_ids}, "
                            f"{sources[0].path} at {layers}; mix datasets of the same layers")
        if ds.hidden_size != target_id["hidden_size"]:
            raise UserError(f"{s.path}: states of width {ds.hidden_size}, but --target has "
                            f"hidden size {target_id['hidden_size']}: another model's states")
        mismatch = identity_mismatch(ds.target, target_id)
        if mismatch:
            key, theirs, ours = mismatch
            raise UserError(f"{s.path}: extracted from a target with {key} {theirs}, "
                            f"--target has {ours}")
        if ds.last_state not in ("pre_norm", "post_norm"):
            raise UserError(f"{s.path}: unknown last_state {ds.last_state!r}")
    if len({s.dataset.last_state for s in sources}) > 1:  # type: ignore[attr-defined]
        raise UserError("the hidden datasets store the last state differently (pre- and "
                        "post-norm); extract them the same way")
    return list(layers)



def _lr_lambda(total: int, warmup: int, floor: float, schedule: str = "cosine"):
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if schedule == "constant":
            return 1.0
        shape = 1 - progress if schedule == "linear" else 0.5 * (1 + math.cos(math.pi * progress))
        return floor + (1 - floor) * shape
    return factor



class Setup(TrainerState):
    """The Trainer's set-up, one method per part it builds. Reads what `Trainer.run` set
    before calling it: cfg, ranks, device, run_dir, target_cfg, target_id, sources, pool,
    plan and trust_remote_code."""

    # Set-up ---------------------------------------------------------------------------------
    def _open_run_dir(self) -> bool:
        cfg, rd = self.cfg, self.run_dir
        # Checked before the lock is taken, so a refused directory gets no lock files; and
        # again once it is held, as another train may have changed it in between.
        rd.check_usable(cfg.write.mode)
        # One train owns the directory; a single process is a run of its own.
        self.lock = rd.hold(self.ranks.run_id or uuid.uuid4().hex)
        continuing = rd.check_usable(cfg.write.mode)
        if continuing:
            before = rd.read()
            now = self.cfg.settings()
            diff = settings_diff(before.get("settings", {}), now)
            parts = before.get("world_size", 1) * before.get("settings", {}).get(
                "grad_accum", 1)
            if parts != self.ranks.world * cfg.grad_accum:
                diff.append(f"ranks x --grad-accum: {parts} -> "
                            f"{self.ranks.world * cfg.grad_accum}")
            if diff and not cfg.write.force:
                raise UserError(f"{rd.path}: this run was started with other settings ("
                                + "; ".join(diff) + "); rerun with them, pass --force to "
                                "continue anyway, or --overwrite to start afresh")
            mismatch = identity_mismatch(before.get("target", {}), self.target_id)
            if mismatch and not cfg.write.force:
                raise UserError(f"{rd.path}: started with another target config than "
                                f"--target {cfg.target} ({mismatch[0]} {mismatch[1]!r} there, "
                                f"{mismatch[2]!r} here); pass --force to continue anyway")
            self.previous = before
        elif self.ranks.rank == 0:
            if rd.path.exists():
                rd.clear()
            rd.path.mkdir(parents=True, exist_ok=True)
        self.ranks.barrier()
        return continuing

    def _resolve_layers(self, continuing: bool) -> list[int]:
        if not self.cfg.online:
            return _layers_of(self.sources, self.target_id)
        if continuing:
            return list(self.previous["layer_ids"])
        n = self.target_cfg.num_hidden_layers
        if self.cfg.layers is not None:
            assert not isinstance(self.cfg.layers, str)  # TrainConfig parsed --layers
            return check_layer_ids(self.cfg.layers, n, count=3)
        if self.cfg.init_from is not None:
            import json

            try:
                raw = json.loads((self.cfg.init_from / "config.json").read_text())
            except (OSError, ValueError):
                raw = {}
            ids = (raw.get("eagle3kit", {}).get("drafter", {}).get("aux_layer_ids")
                   or raw.get("eagle_aux_hidden_state_layer_ids"))
            if ids:
                return list(ids)
        return resolve_layer_ids(None, n)

    def _load_target(self) -> None:
        dtype = resolve_dtype("auto", self.device)
        assert self.cfg.target is not None  # TrainConfig refuses a run without --target
        if self.cfg.online and not self.cfg.servers:
            self.online = OnlineTarget.load(self.cfg.target, self.layers, self.device,
                                            self.trust_remote_code)
            self.head = self.online.head
        else:
            self.head = TargetHead.load(self.cfg.target, self.target_cfg,
                                        self.trust_remote_code).to_device(
                self.device, dtype)
            # --server: vLLM's id N is the last layer's output before the norm, as extract's
            last = ("pre_norm" if self.cfg.online else
                    self.sources[0].dataset.last_state)  # type: ignore[attr-defined]
            self.offline = OfflineTarget(self.head, last, self.device)

    def _vocab(self, continuing: bool) -> DraftVocab:
        v = self.target_cfg.vocab_size
        if continuing and self.run_dir.vocab.is_file():
            from safetensors.torch import load_file

            saved = load_file(str(self.run_dir.vocab))
            vocab = DraftVocab.from_d2t(saved["d2t"].numpy(), v)
            vocab.coverage = self.previous.get("vocab", {}).get("coverage")
            return vocab
        counts = tdata.count_vocab(self.sources, self.pool, v)
        return build_vocab(counts, min(self.cfg.draft_vocab, v))

    def _build_drafter(self, continuing: bool) -> None:
        cfg = self.cfg
        torch.manual_seed(cfg.seed)
        embedding = self.head.embedding.detach().float().cpu()
        self.vocab_source = "counted"
        if cfg.init_from is not None and not (continuing and self.run_dir.steps()):
            drafter = _load_init(cfg.init_from, self.target_cfg)
            _check_init(drafter, self.target_cfg, self.layers, cfg.init_from)
            _check_init_variant(drafter, cfg)
            if not drafter.config.embed_requires_grad:  # its own embedding stays its own
                drafter.load_target_embedding(embedding)
            vocab = DraftVocab.from_d2t(drafter.d2t.numpy(), self.target_cfg.vocab_size)
            vocab.coverage = self._coverage(vocab)
            self.vocab_source = f"init-from {cfg.init_from}"
        else:
            vocab = self._vocab(continuing)
            config = DrafterConfig.from_target(
                self.target_cfg, draft_vocab_size=vocab.size, aux_layer_ids=self.layers,
                target_name_or_path=self.target_id["name_or_path"])
            for name, value in self._variant(continuing).items():
                setattr(config, name, value)
            drafter = Eagle3Drafter(config)
            drafter.set_vocab(torch.from_numpy(vocab.d2t), torch.from_numpy(vocab.t2d))
            drafter.load_target_embedding(embedding)
            if cfg.lm_head != "train":
                with torch.no_grad():
                    rows = self.head.lm_head.detach().float().cpu()[torch.from_numpy(
                        vocab.draft_ids)]
                    drafter.lm_head.weight.copy_(rows)
        drafter.config.sliding_window = cfg.sliding_window  # the run's choice, not --init-from's
        drafter.embed_tokens.weight.requires_grad_(drafter.config.embed_requires_grad)
        drafter.lm_head.weight.requires_grad_(cfg.lm_head != "frozen")
        self.vocab = vocab
        self.drafter = drafter.to(self.device)
        self.loss = TTTLoss(self.drafter, self.head, cfg.ttt_steps, cfg.ttt_decay,
                            Objective(cfg.loss, cfg.auf_rule()), cfg.teacher_temperature)
        if cfg.fsdp and self.ranks.world == 1:
            _ui.info("train: --fsdp: one process, nothing to shard", cfg.output)
        self.model = sharding.wrap(self.loss, self.ranks.world, self.device, cfg.fsdp)
        self.param_names = [n for n, p in self.loss.named_parameters() if p.requires_grad]

    def _variant(self, continuing: bool) -> dict:
        """The new drafter's layout: a continued run keeps the one it recorded (its weights
        have that shape), a fresh one takes --variant and the field flags."""
        if not continuing:
            return self.cfg.drafter_variant()
        recorded = self.previous.get("drafter") or {}
        plain = dict(VARIANTS["eagle3"])
        kept = {name: recorded.get(name, plain[name]) for name in plain}
        if self.cfg.variant_given and kept != self.cfg.drafter_variant() and self.ranks.rank == 0:
            _ui.warn(f"train: the run's drafter is {describe_variant(kept)}; it keeps that "
                     f"layout (--variant and its flags apply to a new run)")
        return kept

    def _coverage(self, vocab: DraftVocab) -> float:
        counts = tdata.count_vocab(self.sources, self.pool, self.target_cfg.vocab_size)
        total = counts.sum()
        return float(counts[vocab.draft_ids].sum() / total) if total else 0.0

    def _build_optimizer(self) -> None:
        cfg = self.cfg
        self.params = self.drafter.trainable_parameters()
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, betas=(0.9, 0.95),
                                           weight_decay=cfg.weight_decay)
        total = self.plan.total_steps
        warmup = int(cfg.warmup) if cfg.warmup >= 1 else math.ceil(cfg.warmup * total)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, _lr_lambda(total, max(warmup, 1) if cfg.warmup else 0,
                                       cfg.min_lr / cfg.lr, cfg.schedule))


    def _announce(self, start: int) -> None:
        opts = self.cfg.output
        long = self.pool.long
        cov = self.vocab.coverage
        mode = ("online from --server" if self.cfg.servers else
                "online" if self.cfg.online else "offline")
        _ui.info(f"train: {mode}, layers "
                 f"{','.join(map(str, self.layers))}, draft vocabulary {self.vocab.size:,}"
                 + (f" covering {100 * cov:.2f}% of the training tokens" if cov is not None
                    else "") + f" ({self.vocab_source})"
                 + (f", sliding window {self.cfg.sliding_window:,} tokens"
                    if self.cfg.sliding_window else ""), opts)
        if self.ranks.world > 1:
            _ui.info(f"train: {self.ranks.world} ranks, "
                     + ("FSDP: parameters, gradients and optimizer state sharded"
                        if sharding.parallel(self.model, self.ranks.world) == "fsdp"
                        else "DDP: a whole drafter per rank"),
                     opts)
        _ui.info(f"train: {sum(len(t) for t in self.pool.train):,} training samples, "
                 f"{len(self.pool.heldout):,} held out, {self.plan.total_steps:,} steps"
                 + (f", resuming after step {start:,}" if start else ""), opts)
        if long.dropped or long.truncated:
            limit = (f"--max-len {self.max_len}" if self.cfg.max_len else
                     f"the target's context length ({self.max_len})")
            _ui.warn(f"{limit}: {long.dropped} samples dropped, {long.truncated} truncated "
                     f"({long.tokens_cut:,} tokens cut)")


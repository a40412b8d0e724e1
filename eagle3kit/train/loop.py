"""`eagle3kit train`: set up a run (or pick one up), then the optimizer steps.

Under torchrun every rank builds the same plan and takes its slice of every global batch:
a step's global batch is cut into ranks x grad_accum micro-batches of about equal tokens,
rank r gets micro-batches r*A .. r*A+A-1. The loss of each step is divided by the global
batch's count of loss-carrying positions (all-reduced before any backward), and DDP's
gradient mean is turned back into a sum, so 1 process with --grad-accum 2 and 2 processes
with --grad-accum 1 take the same steps.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from eagle3kit import __version__, _ui
from eagle3kit._durable import write_json_atomic
from eagle3kit._ranks import Ranks
from eagle3kit.checkpoints.native import drafter_weights, save_drafter
from eagle3kit.errors import UserError
from eagle3kit.model import (
    VARIANTS,
    DrafterConfig,
    DraftVocab,
    Eagle3Drafter,
    attention,
    build_vocab,
    describe_variant,
    vocab_problems,
)
from eagle3kit.target import (
    TargetInfo,
    check_layer_ids,
    identity_mismatch,
    location,
    resolve_layer_ids,
)
from eagle3kit.train import data as tdata
from eagle3kit.train import sharding
from eagle3kit.train.config import TrainConfig, TrainResult
from eagle3kit.train.online_server import Interrupted as StepAbandoned
from eagle3kit.train.rundir import (
    RUN_FORMAT,
    RUN_VERSION,
    RunDir,
    load_rng_state,
    load_tensors,
    save_rng_state,
    settings_diff,
)
from eagle3kit.train.stopping import EXIT_CODES, STOP_SIGNALS, CheckpointClock, StopRequests
from eagle3kit.train.target import (
    OfflineTarget,
    OnlineTarget,
    TargetBatch,
    TargetHead,
)
from eagle3kit.train.ttt import EvalResult, TTTLoss, evaluate, step_counts


def run(cfg: TrainConfig) -> TrainResult:
    ranks = Ranks.start(cfg.device)
    try:
        if ranks.rank:  # one voice: the other ranks only warn and fail
            cfg = replace(cfg, output=replace(cfg.output, quiet=True, json=False))
        result = Trainer(cfg, ranks).run()
    finally:
        ranks.close()
    if ranks.rank == 0:
        _report(result, cfg)
    return result


# Set-up ---------------------------------------------------------------------------------------
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


def _load_init(path: Path, target_cfg: Any) -> Eagle3Drafter:
    """--init-from: any EAGLE-3 layout checkpoints.layouts reads, else eagle3kit's own; without
    the embedding, which comes from the target once the drafter is known to fit it."""
    try:
        from eagle3kit.checkpoints import layouts

        def load(p: Path) -> Eagle3Drafter:
            model, _info = layouts.load_any(p, target_config=target_cfg)
            return model
    except ImportError:
        from eagle3kit.checkpoints.native import load_drafter as load  # type: ignore[assignment]
    if not (path / "config.json").is_file():
        raise UserError(f"--init-from {path}: no config.json there (a drafter directory?)")
    try:
        return load(path)
    except (UserError, OSError, KeyError, ValueError, TypeError, RuntimeError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        reason = reason.removeprefix(f"{path}: ")
        raise UserError(f"--init-from {path}: cannot use it ({reason})") from None


def _check_init(model: Eagle3Drafter, target_cfg: Any, layers: list[int], path: Path) -> None:
    c = model.config
    where = f"--init-from {path}"
    if c.vocab_size != target_cfg.vocab_size:
        raise UserError(f"{where}: made for a vocabulary of {c.vocab_size}, --target has "
                        f"{target_cfg.vocab_size}")
    if c.hidden_size != target_cfg.hidden_size or c.aux_width != 3 * target_cfg.hidden_size:
        raise UserError(f"{where}: width {c.hidden_size} (fc input {c.aux_width}), --target "
                        f"has hidden size {target_cfg.hidden_size}")
    if list(c.aux_layer_ids) != list(layers):
        raise UserError(f"{where}: reads layers {c.aux_layer_ids}, the training states are "
                        f"from layers {layers}")
    problems = vocab_problems(model.d2t.numpy(), model.t2d.numpy(), c.vocab_size,
                              c.draft_vocab_size)
    if problems:
        raise UserError(f"{where}: its draft vocabulary is unusable: {problems[0]}")


def _check_init_variant(model: Eagle3Drafter, cfg: Any) -> None:
    """--init-from keeps the checkpoint's layout: --variant or a field flag that asks for
    another one is refused by name."""
    if not cfg.variant_given:
        return
    wanted = cfg.drafter_variant()
    has = {name: getattr(model.config, name) for name in wanted}
    differ = [f"{name} {has[name]} (asked {wanted[name]})" for name in wanted
              if has[name] != wanted[name]]
    if differ:
        raise UserError(f"--init-from {cfg.init_from}: a {describe_variant(has)} drafter, "
                        f"and the weights keep their layout: {', '.join(differ)}; leave "
                        f"--variant and the layout flags out")


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


class Trainer:
    def __init__(self, cfg: TrainConfig, ranks: Ranks) -> None:
        self.cfg, self.ranks = cfg, ranks
        self.run_dir = RunDir(cfg.out)
        self.device = ranks.device
        self.autocast = (torch.bfloat16 if cfg.precision == "bf16" or (
            cfg.precision == "auto" and self.device.type == "cuda") else None)

    # The whole run ------------------------------------------------------------------------
    def run(self) -> TrainResult:
        cfg = self.cfg
        assert cfg.target is not None  # TrainConfig refuses a run without --target
        self.trust_remote_code = tdata.trust_remote_code(cfg)
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
            self._write_run_json(continuing)
            self.run_dir.cut_metrics(start)
        self.ranks.barrier()
        if not cfg.servers:
            return self._train(start)
        from eagle3kit.train import online_server

        self.served = online_server.open_for(self, start)
        try:
            result = self._train(start)
        finally:
            self.served.close()
        result.metrics["served"] = self.served.stats.to_dict()
        return result

    def _open_run_dir(self) -> bool:
        cfg, rd = self.cfg, self.run_dir
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
        dtype = torch.float32 if self.device.type == "cpu" else torch.bfloat16
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
        drafter.embed_tokens.weight.requires_grad_(drafter.config.embed_requires_grad)
        drafter.lm_head.weight.requires_grad_(cfg.lm_head != "frozen")
        self.vocab = vocab
        self.drafter = drafter.to(self.device)
        self.loss = TTTLoss(self.drafter, self.head, cfg.ttt_steps, cfg.ttt_decay)
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

    def _parallel(self) -> str:
        """none (one process), ddp or fsdp: how the drafter is spread over the ranks."""
        if self.ranks.world == 1:
            return "none"
        return "fsdp" if sharding.sharded(self.model) else "ddp"

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

    def _write_run_json(self, continuing: bool) -> None:
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
        write_json_atomic(rd.run_json, {
            "format": RUN_FORMAT, "version": RUN_VERSION, "eagle3kit_version": __version__,
            "created": before.get("created", _now()), "updated": _now(),
            "settings": self.cfg.settings(), "settings_history": history,
            "config": {k: (str(v) if isinstance(v, Path) else v)
                       for k, v in _resolved(self.cfg).items()},
            "world_size": self.ranks.world, "mode": ("online-server" if self.cfg.servers else
                                              "online" if self.cfg.online else "offline"),
            "servers": [u for u, _ in self.cfg.server_slots],
            "parallel": self._parallel(),
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
        })

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
                                          markers=self.phase_markers)
        result.step = step
        return result.to_dict()

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
        tokens = torch.tensor([sum(it.length for p in mine for it in p)], dtype=torch.float64,
                              device=self.device)
        stats = ranks.sum(torch.cat([loss_total[None], sums, correct, tokens]))
        k = cfg.ttt_steps
        c = counts.clamp_min(1)
        return {"loss": float(stats[0]), "loss_k": (stats[1:1 + k] / c).tolist(),
                "acc_k": (stats[1 + k:1 + 2 * k] / c).tolist(), "tokens": int(stats[-1]),
                "positions_k": counts.tolist(), "lr": lr, "grad_norm": float(norm)}

    def _train(self, start: int) -> TrainResult:
        cfg, rd = self.cfg, self.run_dir
        total = self.plan.total_steps
        self.tokens = getattr(self, "tokens_before", 0)
        self.last_eval = getattr(self, "last_eval", None)
        self.clock = CheckpointClock(cfg.checkpoint_interval)
        initial_eval = None
        done = start
        with StopRequests(self._on_signal) as self.stop:
            if start == 0 and self.pool.heldout:
                initial_eval = self._evaluate(0)
                self.last_eval = initial_eval
                if self.ranks.rank == 0:
                    rd.log({"step": 0, "eval": initial_eval, "time": _now()})
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
            resumed_from=getattr(self, "resumed_from", None),
            metrics={"long_samples": self.pool.long.to_dict(),
                     "train_samples": sum(len(t) for t in self.pool.train),
                     "heldout_samples": len(self.pool.heldout), "layer_ids": self.layers,
                     "draft_vocab": self.vocab.size,
                     "variant": {"norm_before_residual":
                                 self.drafter.config.norm_before_residual,
                                 **self.drafter.config.variant}})
        if stopped:
            assert self.stop_signal is not None  # set with the stop
            result.stopped = self.stop_signal.name
            result.exit_code = EXIT_CODES[self.stop_signal]
            result.resume_command = resume_command(self.ranks)
        return result

    def _steps(self, start: int, total: int) -> tuple[int, bool]:
        """Steps start..total-1, or until a stop request: (steps done, stopped early)."""
        cfg, rd = self.cfg, self.run_dir
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
                    rd.log(log)
                last = done == total
                stop, due = self._control()
                if self.pool.heldout and not stop and (last or (cfg.eval_every and
                                                                done % cfg.eval_every == 0)):
                    self.last_eval = self._evaluate(done)
                    progress.set(**_eval_gauges(self.last_eval))
                    if self.ranks.rank == 0:
                        rd.log({"step": done, "eval": self.last_eval, "time": _now()})
                if last or stop or due or done % cfg.checkpoint_every == 0:
                    self._checkpoint(done, epoch, self.tokens, last)
                if stop and not last:
                    return done, True
        return done, False

    def _control(self) -> tuple[bool, bool]:
        """(stop, checkpoint due), the same on every rank: a signal to any one rank stops
        them all after the same step, and one rank's clock decides for all."""
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

    def _announce(self, start: int) -> None:
        opts = self.cfg.output
        long = self.pool.long
        cov = self.vocab.coverage
        mode = ("online from --server" if self.cfg.servers else
                "online" if self.cfg.online else "offline")
        _ui.info(f"train: {mode}, layers "
                 f"{','.join(map(str, self.layers))}, draft vocabulary {self.vocab.size:,}"
                 + (f" covering {100 * cov:.2f}% of the training tokens" if cov is not None
                    else "") + f" ({self.vocab_source})", opts)
        if self.ranks.world > 1:
            _ui.info(f"train: {self.ranks.world} ranks, "
                     + ("FSDP: parameters, gradients and optimizer state sharded"
                        if self._parallel() == "fsdp" else "DDP: a whole drafter per rank"),
                     opts)
        _ui.info(f"train: {sum(len(t) for t in self.pool.train):,} training samples, "
                 f"{len(self.pool.heldout):,} held out, {self.plan.total_steps:,} steps"
                 + (f", resuming after step {start:,}" if start else ""), opts)
        if long.dropped or long.truncated:
            limit = (f"--max-len {self.max_len}" if self.cfg.max_len else
                     f"the target's context length ({self.max_len})")
            _ui.warn(f"{limit}: {long.dropped} samples dropped, {long.truncated} truncated "
                     f"({long.tokens_cut:,} tokens cut)")


def _markers_of(target: Path, trust_remote_code: bool) -> Any:
    from transformers import AutoTokenizer

    from eagle3kit.bench.phases import Markers

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(target),
                                                  trust_remote_code=trust_remote_code)
    except Exception:  # a target without a tokenizer: the prediction goes without phases
        return None
    markers = Markers.of(tokenizer)
    return markers if markers.known else None


def _eval_gauges(ev: dict) -> dict[str, float]:
    gauges = {f"a{i + 1}": round(a, 3) for i, a in enumerate(ev["per_position"])}
    gauges["AL"] = round(ev["predicted_acceptance_length"], 3)
    return gauges


def _resolved(cfg: TrainConfig) -> dict:
    from dataclasses import asdict

    d = asdict(cfg)
    d.pop("output", None)
    d["data"] = [s.to_json() for s in cfg.data]
    return d


def resume_command(ranks: Ranks) -> str | None:
    """The command line that continues this run: this one, without --overwrite, under the
    same torchrun shape. None when train was not started from the command line."""
    import sys

    from eagle3kit._argv import command_line

    args = [a for a in sys.argv if a != "--overwrite"]
    if args[1:2] != ["train"]:
        return None
    line = command_line(args)
    if ranks.world > 1:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", ranks.world))
        nodes = max(1, ranks.world // max(local, 1))
        line = (f"torchrun --nnodes {nodes} --nproc_per_node {local} "
                + ("<the same rendezvous options> " if nodes > 1 else "")
                + "-m " + line)
    return line


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _cut_line(long: dict) -> str:
    """What the length limit left out, for the summary."""
    limit = f"limit {long['max_len']:,}" if long.get("max_len") else "no limit"
    share = long["tokens_cut"] / long["tokens"] if long.get("tokens") else 0.0
    return (f"{long['tokens_cut']:,} of {long.get('tokens', 0):,} ({100 * share:.2f}%; "
            f"{long['truncated']} samples truncated, {long['dropped']} dropped; {limit})")


def _report(result: TrainResult, cfg: TrainConfig) -> None:
    opts = cfg.output
    if result.stopped:
        step = f"checkpoints/step-{result.steps:08d}"
        _ui.warn(f"train: stopped by {result.stopped} after step {result.steps:,} of "
                 f"{result.total_steps:,}; {cfg.out / step} holds it. Continue with:\n  "
                 + (result.resume_command or "the same train command (same run directory)"))
    if opts.json:
        _ui.print_json(result.to_dict())
    pairs: list[tuple[str, object]] = [
        ("run", str(result.out)), ("steps", result.steps), ("tokens", result.tokens),
        ("loss", None if result.loss is None else round(result.loss, 4)),
        ("vocab coverage", result.vocab_coverage)]
    long = result.metrics.get("long_samples")
    if long:
        pairs.append(("tokens cut", _cut_line(long)))
    for name, ev in (("before training", result.initial_eval), ("held-out", result.eval)):
        if ev:
            rates = " ".join(f"{a:.3f}" for a in ev["per_position"])
            pairs.append((f"{name} AL (k={ev['k']})",
                          f"{ev['predicted_acceptance_length']:.3f}  per position {rates}"))
    if result.eval and result.eval.get("phases"):
        pairs.append(("held-out AL per phase", "  ".join(
            f"{name} {f['predicted_acceptance_length']:.3f} ({f['chains']} chains)"
            for name, f in result.eval["phases"].items())))
    variant = result.metrics.get("variant")
    if variant and variant != VARIANTS["eagle3"]:
        pairs.append(("layout", describe_variant(variant) + (
            ", norm_before_residual" if variant["norm_before_residual"] else "")))
    pairs.append(("drafter", str(RunDir(result.out).drafter)))
    _ui.kv("train", pairs, opts)


"""`eagle3kit export`: a trained drafter as the checkpoints vLLM and SGLang load.

Two layouts (CHECKPOINTS.md §1, §2), every field written explicitly so that no engine falls
back to a default: the layer ids come from the run (never a default), `norm_before_residual`
is stated, and `max_position_embeddings` and the RoPE settings are the target's. An export is
written into a temp directory, checked there (key set, shapes and dtypes against a drafter
built on the meta device from the written config; the problems `eagle3kit info` looks for),
and only then renamed into place, so OUT is either the complete export or untouched.

Orchestration only: each layout's config and tensors come from its file in `checkpoints/`
(`speculators.py`, `sglang.py`), the source is read by `checkpoints.detect`/`load` (through
source.py), and the directory is put in place by `_durable.publish_dir`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from eagle3kit import __version__, _ui
from eagle3kit._durable import odd_file, publish_dir
from eagle3kit._lock import Owned, RunLock, acquire
from eagle3kit.checkpoints.card import (
    CardFacts,
    DataSource,
    training_data,
    write_card,
)
from eagle3kit.checkpoints.native import WEIGHTS
from eagle3kit.checkpoints.provenance import PROVENANCE, is_export
from eagle3kit.checkpoints.sglang import sglang_config, sglang_warnings, sglang_weights
from eagle3kit.checkpoints.speculators import speculators_weights, vllm_config
from eagle3kit.errors import UserError
from eagle3kit.export.config import ExportConfig, check_out_spares
from eagle3kit.export.result import Exported, ExportResult
from eagle3kit.export.source import ExportSource, existing_dir, load_source
from eagle3kit.target import config_dict, to_layer_output


# The two layouts -----------------------------------------------------------------------------
def config_for(
    fmt: str,
    drafter: Any,
    dtype: str,
    target: dict | None,
    warnings: list[str],
    verifier: str,
    architectures: list[str],
    tokens: int,
) -> dict:
    """The config.json of one layout (`checkpoints/speculators.py`, `checkpoints/sglang.py`)."""
    if fmt == "vllm":
        return vllm_config(drafter, verifier, architectures, tokens, dtype, target, warnings)
    return sglang_config(drafter, dtype, target, warnings)


def weights_for(model: Any, fmt: str, dtype: str, embedding: Any = None) -> dict:
    """The tensors of one layout: floats in `dtype`, d2t int64, t2d bool."""
    if fmt == "sglang":
        return sglang_weights(model, dtype)
    return speculators_weights(model, dtype, embedding)


# Writing and checking -------------------------------------------------------------------------
def _write_checkpoint(directory: Path, config: dict, tensors: dict, provenance: dict) -> None:
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / WEIGHTS), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (directory / PROVENANCE).write_text(json.dumps(provenance, indent=2) + "\n")


def verify_export(
    directory: Path, fmt: str, tensors: dict, target: Path | None
) -> list[tuple[str, str]]:
    """Reload an export on the meta device and check it; the checks passed, or UserError."""
    import torch

    from eagle3kit.checkpoints.detect import inspect
    from eagle3kit.checkpoints.load import drafter_config_of
    from eagle3kit.model.drafter import Eagle3Drafter

    info = inspect(directory, target)
    layout = "speculators" if fmt == "vllm" else "sglang"
    failures = [] if info.layout == layout else [f"read back as layout {info.layout}"]
    failures += info.problems
    stored = {n: (tuple(s), d) for n, (s, d) in info.tensors.items()}
    written = {n: (tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in tensors.items()}
    if stored != written:
        failures.append(f"file holds {sorted(set(stored) ^ set(written)) or 'other shapes'}")
    with torch.device("meta"):
        meta = Eagle3Drafter(drafter_config_of(info))
    expected = {info.rename(n): tuple(t.shape) for n, t in meta.state_dict().items()}
    for optional in ("embed_tokens.weight", "d2t", "t2d"):
        if optional not in tensors:
            expected.pop(info.rename(optional), None)
    mapped = {info.rename(n): s for n, (s, _) in stored.items()}
    if mapped != expected:
        diff = sorted(k for k in set(mapped) | set(expected) if mapped.get(k) != expected.get(k))
        failures.append(f"the config and the weights disagree on {diff[:4]}")
    if failures:
        raise UserError(f"the {fmt} export failed its own checks: {'; '.join(failures)}")
    return [
        ("layout", f"read back as the {layout} layout"),
        (
            "tensors",
            f"{len(stored)}: key set, shapes and dtypes match a drafter built on "
            f"the meta device from the written config",
        ),
        ("problems", "none of those `eagle3kit info` looks for"),
    ]


def _check_replaceable(out: Path, overwrite: bool, insisted: bool) -> None:
    """An OUT holding anything is replaced only when it is an earlier export and --overwrite
    says so, or when --overwrite-dir names it."""
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: exists and is not a directory")
    if not out.is_dir() or not any(out.iterdir()) or insisted:
        return
    if not is_export(out):
        raise UserError(
            f"{out}: not empty and not an earlier export (no {PROVENANCE}); to "
            f"delete what it holds and write the export there, give "
            f"--overwrite-dir {out}"
        )
    if not overwrite:
        raise UserError(f"{out}: not empty; give --overwrite to replace it")


def hold_out(out: Path) -> RunLock:
    """Take OUT for this export: one export at a time writes it (and cleans its temp
    folders). The lock lives beside OUT, which the export replaces whole."""
    where = out.parent / f".{out.name}.export-lock"
    odd = odd_file(where)
    if odd not in (None, "a directory"):  # a link would put the lock files where it points
        raise UserError(f"{where}: {odd} where export keeps its lock folder; refused")
    where.mkdir(parents=True, exist_ok=True)
    place = Owned(
        out, "an export folder", where / "run.lock", where / "gate.lock", where / "owner.json"
    )
    return acquire(place, uuid.uuid4().hex)


def _committed(out: Path, overwrite: bool, fill, insisted: bool = False) -> None:
    """Run `fill(tmp)` in a temp directory beside OUT, then rename it to OUT."""
    _check_replaceable(out, overwrite, insisted)  # before any lock file is made
    lock = hold_out(out)
    try:
        _check_replaceable(out, overwrite, insisted)  # held now: no other export changes it
        _fill_and_rename(out, fill)
    finally:
        lock.release()


def _fill_and_rename(out: Path, fill) -> None:
    for stale in out.parent.glob(f".{out.name}.tmp-*"):  # left by an interrupted export
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        fill(tmp)
        _publish_modes(tmp)
        publish_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _publish_modes(tmp: Path) -> None:
    """mkdtemp and safetensors create owner-only files; an export is read by servers that
    may run as another user, so give it the modes a plain mkdir and open would have."""
    umask = os.umask(0)
    os.umask(umask)
    for path in [tmp, *tmp.rglob("*")]:
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)


def _verifier(cfg: ExportConfig, src: ExportSource) -> tuple[str, list[str]]:
    name = cfg.verifier or src.identity.get("name_or_path") or src.identity.get("path")
    if not name:
        raise UserError(f"{src.checkpoint}: records no target; give --verifier NAME_OR_PATH")
    local = existing_dir(name)
    if local is not None:
        return name, list(config_dict(local).get("architectures") or [])
    archs = src.identity.get("architectures") or (src.target_raw or {}).get("architectures")
    return name, list(archs or [])


def run(cfg: ExportConfig) -> ExportResult:
    from eagle3kit.checkpoints.weights import target_embedding

    src = load_source(cfg)
    drafter = src.model.config
    dtype = cfg.dtype
    warnings = list(src.warnings)
    verifier, architectures = _verifier(cfg, src)
    embedding = None
    if cfg.with_embedding and drafter.embed_requires_grad:
        warnings.append(
            "--with-embedding: the drafter trained its own embedding, which the "
            "export carries instead of the target's"
        )
    elif cfg.with_embedding:
        embedding = target_embedding(src.target_dir) if src.target_dir else None
        if embedding is None:
            raise UserError("--with-embedding needs the target's weights: give --target")
    if src.ttt_steps is not None and cfg.num_speculative_tokens > src.ttt_steps:
        warnings.append(
            f"--num-speculative-tokens {cfg.num_speculative_tokens}: the drafter was trained "
            f"for {src.ttt_steps} draft steps (--ttt-steps), so every draft after the first "
            f"{src.ttt_steps} of a chain was never trained and is rarely kept; train with "
            f"--ttt-steps {cfg.num_speculative_tokens} to serve that many"
        )
    formats = ["vllm", "sglang"] if cfg.format == "both" else [cfg.format]
    if "sglang" in formats:
        warnings += sglang_warnings(drafter)
    plans = []
    for fmt in formats:
        config = config_for(
            fmt,
            drafter,
            dtype,
            src.target_raw,
            warnings,
            verifier,
            architectures,
            cfg.num_speculative_tokens,
        )
        tensors = weights_for(src.model, fmt, dtype, embedding if fmt == "vllm" else None)
        plans.append((fmt, config, tensors))
    warnings = list(dict.fromkeys(warnings))  # the rope warning comes once per layout
    exports: list[Exported] = []
    data = None if src.run is None else training_data(src.run)

    def fill(tmp: Path) -> None:
        for fmt, config, tensors in plans:
            where = tmp / fmt if len(plans) > 1 else tmp
            _write_checkpoint(where, config, tensors, _provenance(cfg, src, fmt, dtype, verifier))
            checks = verify_export(where, fmt, tensors, src.target_dir)
            final = cfg.out / fmt if len(plans) > 1 else cfg.out
            sglang = cfg.out / "sglang" if fmt == "vllm" and len(plans) > 1 else None
            write_card(where, _card_facts(cfg, src, fmt, str(final), verifier, data, sglang))
            exports.append(
                Exported(
                    format=fmt,
                    path=str(final),
                    layout=LAYOUT_NAMES[fmt],
                    tensors=len(tensors),
                    bytes=(where / WEIGHTS).stat().st_size,
                    dtype=dtype,
                    aux_layer_ids=list(drafter.aux_layer_ids),
                    aux_layer_ids_output=to_layer_output(drafter.aux_layer_ids),
                    draft_vocab_size=drafter.draft_vocab_size,
                    verifier=verifier if fmt == "vllm" else None,
                    has_embedding="embed_tokens.weight" in tensors,
                    checks=checks,
                )
            )

    if src.target_dir is not None:  # the target the run recorded, found on this machine
        check_out_spares(cfg.out, "the run's target", src.target_dir)
    _committed(cfg.out, cfg.overwrite, fill, insisted=cfg.overwrite_dir is not None)
    result = ExportResult(
        source=str(cfg.run),
        source_layout=src.layout,
        out=str(cfg.out),
        exports=exports,
        warnings=warnings,
    )
    _show(result, cfg.output)
    return result


LAYOUT_NAMES = {"vllm": "speculators / vLLM", "sglang": "SGLang / SpecForge"}


def _card_facts(
    cfg: ExportConfig,
    src: ExportSource,
    fmt: str,
    where: str,
    verifier: str,
    data: list[DataSource] | None,
    sglang: Path | None,
) -> CardFacts:
    """The model card's content (`checkpoints/card.py`): `base_model` is the verifier the
    export names, the target the run recorded unless --verifier gave another name."""
    from eagle3kit.checkpoints.provenance import training_prediction

    return CardFacts(
        fmt=fmt,
        where=where,
        base_model=verifier,
        drafter=src.model.config,
        dtype=cfg.dtype,
        speculative_tokens=cfg.num_speculative_tokens,
        coverage=src.coverage,
        prediction=training_prediction(src.checkpoint),
        data=data,
        sibling=None if sglang is None else str(sglang),
    )


def _provenance(cfg: ExportConfig, src: ExportSource, fmt: str, dtype: str, verifier: str) -> dict:
    from eagle3kit.checkpoints.provenance import training_prediction

    ids = list(src.model.config.aux_layer_ids)
    return {
        "written_by": f"eagle3kit {__version__}",
        "created": time.time(),
        "format": fmt,
        "source": str(cfg.run.resolve()),
        "source_layout": src.layout,
        "target": src.identity,
        "verifier": verifier,
        "dtype": dtype,
        "aux_layer_ids": {"boundary": ids, "layer_output": to_layer_output(ids)},
        "draft_vocab": {"size": src.model.config.draft_vocab_size, "coverage": src.coverage},
        "target_config": "copied from " + str(src.target_dir)
        if src.target_raw is not None
        else "the values the drafter recorded",
        # What training predicted, so `bench accept` on the export shows it beside its own.
        "eval": training_prediction(src.checkpoint),
        # Which step of the run this is, and why (train --drafter-step): the best evaluated
        # one by default.
        "selection": (src.run or {}).get("selection"),
    }


def _show(result: ExportResult, opts: _ui.OutputOptions) -> None:
    if opts.json:
        _ui.print_json(result.to_dict())
    for w in result.warnings:
        _ui.warn(w)
    if opts.json:
        return
    for e in result.exports:
        _ui.kv(
            e.path,
            [
                ("layout", e.layout),
                (
                    "tensors",
                    f"{e.tensors} ({e.bytes:,} bytes, {e.dtype}"
                    + (", with the target's embedding)" if e.has_embedding else ")"),
                ),
                (
                    "aux layer ids",
                    f"{e.aux_layer_ids} boundary / {e.aux_layer_ids_output} layer-output",
                ),
                ("draft vocab", e.draft_vocab_size),
                *([("verifier", e.verifier)] if e.verifier else []),
            ],
            opts,
        )
        _ui.checklist([(True, name, detail) for name, detail in e.checks], opts)

"""What `eagle3kit export` exports: a train run's drafter or a checkpoint in any layout
`eagle3kit info` reads, loaded with its identity, its target checked against the one named,
and its layer ids settled (from the run, never a default).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3kit.checkpoints.provenance import read_provenance
from eagle3kit.checkpoints.rundir import RunDir, valid_ttt_steps
from eagle3kit.errors import UserError
from eagle3kit.export.config import ExportConfig
from eagle3kit.target import COMPARED


@dataclass
class ExportSource:
    model: Any
    """The Eagle3Drafter, fp32 on the CPU."""
    layout: str
    checkpoint: Path
    identity: dict
    """The target as the run recorded it: path, name_or_path, architectures, fingerprint."""
    coverage: float | None
    target_raw: dict | None
    """The target's config.json, when the target directory is at hand."""
    target_dir: Path | None
    warnings: list[str]
    run: dict | None = None
    """run.json, when the source is a run (None: a checkpoint)."""
    run_dir: Path | None = None
    ttt_steps: int | None = None
    """The training-time-test steps the drafter was trained with, when recorded."""


def load_source(cfg: ExportConfig) -> ExportSource:
    from eagle3kit.checkpoints.detect import inspect
    from eagle3kit.checkpoints.load import load_inspected

    run_dir = cfg.run
    run: dict = {}
    rd = RunDir(run_dir)
    if rd.exists():
        run = rd.load()
        checkpoint = rd.drafter
        if not rd.has_drafter():
            raise UserError(f"{checkpoint}: the run has no drafter yet (train writes it there)")
    elif (run_dir / "config.json").is_file():
        checkpoint = run_dir
    else:
        raise UserError(
            f"{run_dir}: neither a run directory (no run.json) nor a checkpoint (no config.json)"
        )
    info = inspect(checkpoint)
    identity = _identity(run, info)
    target_dir = cfg.target or existing_dir(identity.get("path"))
    target_raw = _checked_target(
        target_dir,
        identity,
        explicit=cfg.target is not None,
        trust_remote_code=cfg.trust_remote_code,
    )
    if target_raw is not None and info.target_layers is None:
        info.target_layers = target_raw.get("num_hidden_layers")
    _settle_layer_ids(cfg, info, run)
    model = load_inspected(info)
    warnings = list(info.warnings)
    if target_raw is None:
        warnings.append(
            "target config not found"
            + (f" at {identity['path']}" if identity.get("path") else "")
            + ": max_position_embeddings, RoPE and token ids are the values the "
            "drafter recorded from it; give --target to copy them from the target"
        )
    return ExportSource(
        model=model,
        layout=info.layout,
        checkpoint=checkpoint,
        identity=identity,
        coverage=info.coverage,
        target_raw=target_raw,
        target_dir=target_dir if target_raw is not None else None,
        warnings=warnings,
        run=run if rd.exists() else None,
        run_dir=run_dir if rd.exists() else None,
        ttt_steps=_trained_steps(run, info.config),
    )


def _trained_steps(run: dict, config: dict) -> int | None:
    """--ttt-steps as run.json's settings or the drafter's config.json recorded it."""
    block = config.get("eagle3kit")
    training = block.get("training") if isinstance(block, dict) else None
    for recorded in (run.get("config"), training):
        if isinstance(recorded, dict) and (steps := valid_ttt_steps(recorded.get("ttt_steps"))):
            return steps
    return None


def _identity(run: dict, info: Any) -> dict:
    recorded = run.get("target")
    if not isinstance(recorded, dict) and info.layout == "eagle3kit":
        recorded = info.config["eagle3kit"].get("target")
    if not isinstance(recorded, dict):  # an earlier export
        recorded = (read_provenance(Path(info.path)) or {}).get("target")
    if isinstance(recorded, dict):
        return dict(recorded)
    if info.layout == "speculators":
        verifier = info.config.get("speculators_config", {}).get("verifier") or {}
        return {
            "name_or_path": verifier.get("name_or_path"),
            "architectures": verifier.get("architectures") or [],
        }
    return {}


def existing_dir(path: Any) -> Path | None:
    return Path(path) if path and (Path(path) / "config.json").is_file() else None


def _checked_target(
    target_dir: Path | None, identity: dict, explicit: bool, trust_remote_code: bool = False
) -> dict | None:
    """The target's raw config, refused when it is not the target the run trained against."""
    if target_dir is None:
        return None
    from eagle3kit.checkpoints.base import target_dict
    from eagle3kit.target import TargetInfo, identity_mismatch

    raw, _ = target_dict(target_dir)
    if any(identity.get(key) is not None for key in COMPARED):
        flag = "--target" if explicit else "the recorded target"
        actual = TargetInfo.load(target_dir, trust_remote_code, flag).identity
        mismatch = identity_mismatch(identity, actual)
        if mismatch:
            key, recorded, found = mismatch
            flag = "--target" if explicit else "the recorded target path"
            raise UserError(
                f"{flag} {target_dir}: not the target the run was trained against "
                f"({key} {found}, the run recorded {recorded})"
            )
    return raw


def _settle_layer_ids(cfg: ExportConfig, info: Any, run: dict) -> None:
    """Layer ids come from the run or the checkpoint, or from --layers when it has none."""
    recorded = run.get("layer_ids")
    missing = info.layer_ids_source == "engine default"
    if cfg.layers is not None:
        if not missing:
            if list(cfg.layers) != info.aux_layer_ids:
                raise UserError(
                    f"--layers {','.join(map(str, cfg.layers))}: the drafter was "
                    f"trained on layers {info.aux_layer_ids}; leave --layers out"
                )
            return
        if info.num_aux is not None and len(cfg.layers) != info.num_aux:
            raise UserError(
                f"--layers: {len(cfg.layers)} ids, but the drafter's fc takes "
                f"{info.num_aux} aux states"
            )
        info.aux_layer_ids, info.layer_ids_source = list(cfg.layers), "--layers"
        info.problems = [p for p in info.problems if not p.startswith("no aux layer ids")]
        return
    if missing:
        raise UserError(
            f"{info.path}: records no aux layer ids; export never falls back to the "
            f"engines' default: give the layers the drafter was trained on with "
            f"--layers (boundary convention, like 2,18,33)"
        )
    if recorded is not None and list(recorded) != info.aux_layer_ids:
        raise UserError(
            f"{cfg.run}/run.json: layer_ids {recorded} differ from the drafter's "
            f"{info.aux_layer_ids}"
        )

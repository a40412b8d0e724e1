"""Saving and loading drafters in eagle3kit's own layout.

The layout is the speculators/vLLM one (EAGLE3.md, CHECKPOINTS.md §1): `config.json` with the
speculators fields plus an `eagle3kit` block holding the full DrafterConfig and training
provenance, and `model.safetensors` with `layers.0.*` names, `d2t` and `t2d`. The frozen
embedding is left out (engines share the target's); loading takes it from the target. A
drafter with its own embedding (`embed_requires_grad`) keeps it in every checkpoint.

`read_eagle3kit` is this layout's reader for `inspect` (no torch); `export_tensors` the tensors
every exported layout starts from. Importing it loads no torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from eagle3kit._durable import replace_durably, write_text_atomic
from eagle3kit.checkpoints.base import CheckpointInfo, _base, _coverage
from eagle3kit.checkpoints.rundir import RunDir
from eagle3kit.errors import UserError
from eagle3kit.model.config import DrafterConfig

if TYPE_CHECKING:
    import torch

    from eagle3kit.checkpoints.weights import Weights
    from eagle3kit.model.drafter import Eagle3Drafter

WEIGHTS = "model.safetensors"
CONFIG = "config.json"


def drafter_weights(
    model: Eagle3Drafter,
    with_embedding: bool = False,
    dtype: torch.dtype | None = None,
    state: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """The tensors a checkpoint stores: floats in `dtype`, d2t int64, t2d bool. `state`:
    the model's full state dict when its own holds shards (FSDP)."""
    with_embedding = with_embedding or model.config.embed_requires_grad
    weights = {}
    for name, tensor in (model.state_dict() if state is None else state).items():
        if name == "embed_tokens.weight" and not with_embedding:
            continue
        if tensor.is_floating_point() and dtype is not None:
            tensor = tensor.to(dtype)
        weights[name] = tensor.detach().contiguous().cpu()
    return weights


def save_drafter(
    model: Eagle3Drafter,
    out_dir: str | Path,
    *,
    extra: dict | None = None,
    dtype: torch.dtype | None = None,
    state: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write `model` (or its full `state`) to `out_dir` atomically per file (temp name,
    fsync, rename)."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / (WEIGHTS + ".tmp")
    save_file(drafter_weights(model, dtype=dtype, state=state), str(tmp), metadata={"format": "pt"})
    replace_durably(tmp, out / WEIGHTS)
    config = {"eagle3kit": {"drafter": model.config.to_dict(), **(extra or {})}}
    write_text_atomic(out / CONFIG, json.dumps(config, indent=2) + "\n")
    return out


def load_drafter(path: str | Path, embedding: torch.Tensor | None = None) -> Eagle3Drafter:
    """A drafter saved by `save_drafter`; `embedding` is the target's input embedding."""
    from safetensors.torch import load_file

    from eagle3kit.model.drafter import Eagle3Drafter

    path = Path(path)
    config = DrafterConfig.from_dict(
        json.loads((path / CONFIG).read_text())["eagle3kit"]["drafter"]
    )
    model = Eagle3Drafter(config)
    weights = load_file(str(path / WEIGHTS))
    if embedding is not None and not config.embed_requires_grad:
        weights["embed_tokens.weight"] = embedding
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [m for m in missing if m != "embed_tokens.weight" or embedding is not None]
    if missing or unexpected:
        raise ValueError(
            f"{path}: weights do not fit the config (missing {missing}, unexpected {unexpected})"
        )
    return model


# Reading (without torch), for `inspect` ----------------------------------------------------------
def read_eagle3kit(
    directory: Path, layout: str, config: dict, weights: Weights, shapes: dict
) -> CheckpointInfo:
    block = config["eagle3kit"]
    try:
        drafter = DrafterConfig.from_dict(block["drafter"])
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(
            f"{directory}/config.json: eagle3kit block without a valid drafter config ({exc})"
        ) from None
    info = _from_drafter_config(directory, "eagle3kit", weights, shapes, drafter)
    info.layer_ids_source = "eagle3kit.drafter.aux_layer_ids"
    target = block.get("target") or {}
    info.verifier = target.get("name_or_path") or target.get("path") or drafter.target_name_or_path
    info.target_layers = target.get("num_hidden_layers")
    run = RunDir.holding(directory)
    info.coverage = _coverage(block) or _coverage(run.record() if run else None)
    info.config = config
    return info


def _from_drafter_config(
    directory: Path, layout: str, weights: Weights, shapes: dict, drafter: DrafterConfig
) -> CheckpointInfo:
    info = _base(directory, layout, weights, shapes)
    info.drafter_config = drafter
    info.aux_layer_ids = list(drafter.aux_layer_ids)
    info.num_aux = len(drafter.aux_layer_ids)
    info.hidden_size = drafter.hidden_size
    info.target_hidden_size = drafter.target_hidden_size
    info.vocab_size = drafter.vocab_size
    info.draft_vocab_size = drafter.draft_vocab_size
    info.norm_before_residual = drafter.norm_before_residual
    info.variant = drafter.variant
    info.max_position_embeddings = drafter.max_position_embeddings
    info.sliding_window = drafter.sliding_window
    return info


# The tensors an export stores --------------------------------------------------------------------
def export_tensors(model: Eagle3Drafter, dtype: str) -> dict[str, torch.Tensor]:
    """The tensors every exported layout stores, in eagle3kit's names: floats in `dtype`,
    d2t int64, t2d bool, and no d2t/t2d for a full vocabulary."""
    import torch

    tensors = drafter_weights(model, dtype=getattr(torch, dtype))
    tensors["d2t"] = tensors["d2t"].to(torch.int64)
    tensors["t2d"] = tensors["t2d"].to(torch.bool)
    if len(tensors["d2t"]) == len(tensors["t2d"]):
        _full_vocabulary(tensors)
    return tensors


def _full_vocabulary(tensors: dict) -> None:
    """A draft vocabulary that is the target's whole vocabulary gets no d2t/t2d, as
    speculators writes it: vLLM creates `draft_id_to_target_id` only when draft_vocab_size
    differs from the target's vocab size and refuses a checkpoint that has one (SGLang reads
    the mapping only when present). A mapping that permutes the ids (ModelOpt orders by
    frequency) is folded into lm_head's rows, so row t drafts target id t."""
    import torch

    ids = tensors.pop("d2t") + torch.arange(len(tensors.pop("t2d")))
    if not torch.equal(ids, torch.arange(len(ids))):
        rows = torch.empty_like(ids)
        rows[ids] = torch.arange(len(ids))
        tensors["lm_head.weight"] = tensors["lm_head.weight"][rows].contiguous()

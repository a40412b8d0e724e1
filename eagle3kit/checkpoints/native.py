"""Saving and loading drafters in eagle3kit's own layout.

The layout is the speculators/vLLM one (EAGLE3.md, CHECKPOINTS.md §1): `config.json` with the
speculators fields plus an `eagle3kit` block holding the full DrafterConfig and training
provenance, and `model.safetensors` with `layers.0.*` names, `d2t` and `t2d`. The frozen
embedding is left out (engines share the target's); loading takes it from the target. A
drafter with its own embedding (`embed_requires_grad`) keeps it in every checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from eagle3kit._durable import replace_durably, write_text_atomic
from eagle3kit.model.config import DrafterConfig
from eagle3kit.model.drafter import Eagle3Drafter

WEIGHTS = "model.safetensors"
CONFIG = "config.json"


def drafter_weights(model: Eagle3Drafter, with_embedding: bool = False,
                    dtype: torch.dtype | None = None,
                    state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
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


def save_drafter(model: Eagle3Drafter, out_dir: str | Path, *, extra: dict | None = None,
                 dtype: torch.dtype | None = None,
                 state: dict[str, torch.Tensor] | None = None) -> Path:
    """Write `model` (or its full `state`) to `out_dir` atomically per file (temp name,
    fsync, rename)."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / (WEIGHTS + ".tmp")
    save_file(drafter_weights(model, dtype=dtype, state=state), str(tmp),
              metadata={"format": "pt"})
    replace_durably(tmp, out / WEIGHTS)
    config = {"eagle3kit": {"drafter": model.config.to_dict(), **(extra or {})}}
    write_text_atomic(out / CONFIG, json.dumps(config, indent=2) + "\n")
    return out


def load_drafter(path: str | Path, embedding: torch.Tensor | None = None) -> Eagle3Drafter:
    """A drafter saved by `save_drafter`; `embedding` is the target's input embedding."""
    from safetensors.torch import load_file

    path = Path(path)
    config = DrafterConfig.from_dict(json.loads((path / CONFIG).read_text())["eagle3kit"]
                                     ["drafter"])
    model = Eagle3Drafter(config)
    weights = load_file(str(path / WEIGHTS))
    if embedding is not None and not config.embed_requires_grad:
        weights["embed_tokens.weight"] = embedding
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [m for m in missing if m != "embed_tokens.weight" or embedding is not None]
    if missing or unexpected:
        raise ValueError(f"{path}: weights do not fit the config "
                         f"(missing {missing}, unexpected {unexpected})")
    return model

"""A checkpoint in any EAGLE-3 layout `inspect` reads, loaded into an `Eagle3Drafter`:
`drafter_config_of` builds its DrafterConfig (layer ids in the boundary convention),
`load_inspected` its weights under eagle3kit's names; `load_any` does both from a path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eagle3kit.checkpoints.base import CheckpointInfo, _int, layer_config, target_rope
from eagle3kit.checkpoints.detect import inspect
from eagle3kit.errors import UserError
from eagle3kit.model.config import DrafterConfig


def drafter_config_of(info: CheckpointInfo) -> DrafterConfig:
    """The DrafterConfig a checkpoint describes (layer ids in the boundary convention)."""
    if info.drafter_config is not None:
        return info.drafter_config
    if not info.supported:
        raise UserError(f"{info.path}: {info.problems[0]}")
    if info.aux_layer_ids is None:
        raise UserError(
            f"{info.path}: no aux layer ids and no target to take the engines' "
            f"default (2, N//2, N-3) from; give the target"
        )
    layer = layer_config(info.layout, info.config)
    hidden, heads = info.hidden_size, _int(layer.get("num_attention_heads"))
    if not hidden or not heads or not info.vocab_size or not info.draft_vocab_size:
        raise UserError(
            f"{info.path}/config.json: missing hidden_size, num_attention_heads or vocab_size"
        )
    theta, scaling = target_rope(layer)
    verifier = (info.config.get("speculators_config") or {}).get("verifier") or {}
    try:
        return _drafter_config(info, layer, hidden, heads, theta, scaling, verifier)
    except ValueError as exc:
        raise UserError(f"{info.path}/config.json: {exc}") from None


def _drafter_config(
    info: CheckpointInfo,
    layer: dict,
    hidden: int,
    heads: int,
    theta: float,
    scaling: dict | None,
    verifier: dict,
) -> DrafterConfig:
    # drafter_config_of refused a checkpoint without these
    assert info.vocab_size and info.draft_vocab_size and info.aux_layer_ids is not None
    return DrafterConfig(
        hidden_size=hidden,
        intermediate_size=_int(layer.get("intermediate_size")) or 0,
        num_attention_heads=heads,
        num_key_value_heads=_int(layer.get("num_key_value_heads")) or heads,
        head_dim=_int(layer.get("head_dim")) or hidden // heads,
        vocab_size=info.vocab_size,
        draft_vocab_size=info.draft_vocab_size,
        aux_layer_ids=list(info.aux_layer_ids),
        target_hidden_size=info.target_hidden_size,
        rms_norm_eps=float(layer.get("rms_norm_eps") or 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=info.max_position_embeddings or 2048,
        sliding_window=info.sliding_window,
        norm_before_residual=bool(info.norm_before_residual),
        **info.variant,
        hidden_act=layer.get("hidden_act") or "silu",
        target_architectures=list(verifier.get("architectures") or []),
        target_name_or_path=info.verifier or "",
        bos_token_id=layer.get("bos_token_id"),
        eos_token_id=layer.get("eos_token_id"),
        pad_token_id=layer.get("pad_token_id"),
    )


def load_any(path: str | Path, embedding: Any = None, *, target_config: Any = None):
    """An `Eagle3Drafter` from an EAGLE-3 checkpoint in any supported layout, and what
    `inspect` found. `embedding` is the target's input embedding (otherwise the checkpoint's,
    when it has one). `target_config` supplies N when the checkpoint has no layer ids."""
    info = inspect(path, target_config)
    return load_inspected(info, embedding), info


def load_inspected(info: CheckpointInfo, embedding: Any = None):
    """The drafter of a checkpoint `inspect` has read (its layer ids possibly set since)."""
    import torch

    from eagle3kit.model.drafter import Eagle3Drafter

    config = drafter_config_of(info)
    fatal = [p for p in info.problems if _unloadable(p)]
    if fatal:
        raise UserError(f"{info.path}: cannot load: {'; '.join(fatal)}")
    weights = {info.rename(n): t for n, t in info.weights.all().items()}
    _complete_vocab(weights, config)
    if embedding is not None and not config.embed_requires_grad:  # its own embedding stays
        weights["embed_tokens.weight"] = torch.as_tensor(embedding)
    model = Eagle3Drafter(config)
    expected = model.state_dict()
    wrong = [
        f"{n} {list(t.shape)} (expected {list(expected[n].shape)})"
        for n, t in weights.items()
        if n in expected and t.shape != expected[n].shape
    ]
    if wrong:
        raise UserError(f"{info.path}: tensors do not fit the config: {', '.join(wrong[:4])}")
    missing, unexpected = model.load_state_dict(weights, strict=False)
    # a norm the weights leave out keeps weight 1, as the engines build it
    missing = [m for m in missing if m not in ("embed_tokens.weight", "input_norm.weight")]
    if missing or unexpected:
        raise UserError(
            f"{info.path}: weights do not fit the {info.layout} layout "
            f"(missing {missing}, unexpected {unexpected})"
        )
    return model


def _unloadable(problem: str) -> bool:
    """Problems that make the tensors mean something else, as opposed to serving hazards."""
    return problem.startswith(
        (
            "d2t",
            "t2d",
            "lm_head has",
            "no d2t",
            "not an EAGLE-3",
            "input_norm.weight present",
            "fc_norm",
            "num_hidden_layers is",
            "embed_requires_grad is true",
            "norm_before_fc and fc_norm",
        )
    ) or ("aux layer ids but fc takes" in problem)


def _complete_vocab(weights: dict, config: DrafterConfig) -> None:
    """Derive the missing half of d2t/t2d (ModelOpt writes only d2t)."""
    import torch

    d2t, t2d = weights.get("d2t"), weights.get("t2d")
    if d2t is not None and t2d is None:
        ids = d2t.long() + torch.arange(len(d2t))
        t2d = torch.zeros(config.vocab_size, dtype=torch.bool)
        t2d[ids] = True
        weights["t2d"] = t2d
    elif d2t is None and t2d is not None:
        ids = torch.nonzero(t2d.bool()).flatten()
        weights["d2t"] = ids - torch.arange(len(ids))
    elif d2t is None and config.draft_vocab_size == config.vocab_size:
        weights["d2t"] = torch.zeros(config.draft_vocab_size, dtype=torch.long)
        weights["t2d"] = torch.ones(config.vocab_size, dtype=torch.bool)
    if "d2t" in weights:
        weights["d2t"] = weights["d2t"].long()
    if "t2d" in weights:
        weights["t2d"] = weights["t2d"].bool()

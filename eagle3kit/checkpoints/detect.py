"""Naming a checkpoint's layout and reading it (CHECKPOINTS.md).

`inspect(path)` reads a checkpoint directory's `config.json` and the names, shapes and dtypes
of its weights (plus the small `d2t`/`t2d`), names its layout and lists its problems
(`problems.py`) without loading the large tensors; `load.load_any(path)` turns any EAGLE-3
layout into an `Eagle3Drafter`. eagle3kit's own layout is read by `native.py`; the HF-style
ones (speculators, SGLang/SpecForge, original EAGLE-3, ModelOpt) by the one mapping here,
with each layout's own names (`speculators.py`, `sglang.py`).

Layer ids are always returned in the boundary convention (EAGLE3.md §1.1): SGLang's and
ModelOpt's nested `eagle_config` ids are layer-output ids and get +1; a checkpoint without ids
gets the engines' silent default (2, N//2, N-3), flagged as a problem.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eagle3kit.checkpoints.base import (
    CheckpointInfo,
    _base,
    _coverage,
    _decoder_layers,
    _int,
    _nested_ids,
    layer_config,
    window_of,
)
from eagle3kit.checkpoints.native import read_eagle3kit
from eagle3kit.checkpoints.problems import check
from eagle3kit.checkpoints.provenance import read_provenance
from eagle3kit.checkpoints.sglang import sglang_to_ours
from eagle3kit.checkpoints.weights import Weights
from eagle3kit.errors import UserError
from eagle3kit.target import config_dict, from_layer_output


def detect_layout(config: dict, names: list[str], shapes: dict) -> str:
    if isinstance(config.get("eagle3kit"), dict):
        return "eagle3kit"
    if "speculators_model_type" in config or "speculators_config" in config:
        return (
            "speculators"
            if config.get("speculators_model_type") == "eagle3"
            else "speculators-other"
        )
    fc = shapes.get("fc.weight")
    hidden = shapes.get("norm.weight", shapes.get("midlayer.input_layernorm.weight"))
    if "fc.bias" in names or (
        fc and hidden and fc[1] == 2 * hidden[0] and "d2t" not in names and "t2d" not in names
    ):
        return "eagle1"
    if any(n.startswith("midlayer.") for n in names):
        return (
            "sglang"
            if _nested_ids(config) or config.get("eagle_aux_hidden_state_layer_ids")
            else "eagle3"
        )
    if "LlamaForCausalLMEagle3" in (config.get("architectures") or []) or "eagle_config" in config:
        return "modelopt"
    raise UserError(
        "not a checkpoint layout eagle3kit knows (eagle3kit, speculators, SGLang/"
        "SpecForge, original EAGLE-3, ModelOpt, EAGLE-1/2)"
    )


def inspect(path: str | Path, target_config: Any = None) -> CheckpointInfo:
    """Describe the checkpoint in `path` and list its problems (CHECKPOINTS.md §5).

    `target_config` (a model directory, a config dict or a transformers config) enables the
    checks against the target; without it a local verifier/target path the checkpoint
    records is used when it exists.
    """
    directory = Path(path)
    if not directory.is_dir():
        raise UserError(f"{directory}: no such checkpoint directory")
    config = config_dict(directory, f"{directory}: not a checkpoint directory (no config.json)")
    weights = Weights(directory)
    shapes = {n: weights.meta[n][0] for n in weights.names}
    try:
        layout = detect_layout(config, weights.names, shapes)
    except UserError as exc:
        raise UserError(f"{directory}: {exc}") from None
    reader = _READERS.get(layout, _read_unsupported)
    info = reader(directory, layout, config, weights, shapes)
    info.tensors = {n: [list(s), weights.meta[n][1]] for n, s in shapes.items()}
    if info.supported:
        check(info, config, weights, shapes, target_config)
    return info


def checkpoint_problems(path: str | Path, target_config: Any = None) -> list[str]:
    """The CHECKPOINTS.md §5 problems of the checkpoint in `path`; [] when none."""
    return inspect(path, target_config).problems


# The readers --------------------------------------------------------------------------------
def _read_unsupported(
    directory: Path, layout: str, config: dict, weights: Weights, shapes: dict
) -> CheckpointInfo:
    info = _base(directory, layout, weights, shapes)
    info.config = config
    kind = config.get("speculators_model_type", "EAGLE-1/2")
    info.problems.append(
        f"not an EAGLE-3 checkpoint ({kind}): EAGLE-3 engines cannot serve it "
        f"and eagle3kit cannot load it"
    )
    return info


def _read_third_party(
    directory: Path, layout: str, config: dict, weights: Weights, shapes: dict
) -> CheckpointInfo:
    """speculators, SGLang/SpecForge, original EAGLE-3 and ModelOpt: one mapping, per-layout
    names for the ids, the residual convention and the weights."""
    layer = layer_config(layout, config)
    info = _base(directory, layout, weights, shapes)
    info.config = config
    if layout == "sglang" or layout == "eagle3":
        info.rename = sglang_to_ours
    hidden = _int(layer.get("hidden_size")) or info.hidden_size
    fc = shapes.get("fc.weight")
    info.hidden_size = hidden
    info.target_hidden_size = _int(config.get("target_hidden_size")) or (
        _int(layer.get("target_hidden_size"))
    )
    aux_width = info.target_hidden_size or hidden
    info.num_aux = fc[1] // aux_width if fc and aux_width else None
    t2d, lm_head = shapes.get("t2d"), shapes.get("lm_head.weight")
    info.vocab_size = _int(layer.get("vocab_size"))
    if t2d:  # the mask's length is V whatever the config says (see the vocab_size check)
        info.vocab_size = t2d[0]
    info.draft_vocab_size = _int(config.get("draft_vocab_size")) or (
        lm_head[0] if lm_head else info.vocab_size
    )
    info.max_position_embeddings = _int(layer.get("max_position_embeddings"))
    info.sliding_window = window_of(layer, info.warnings)
    # vLLM assumes true when a speculators config omits it; everything else means false.
    info.norm_before_residual = bool(config.get("norm_before_residual", layout == "speculators"))
    if layout == "speculators":
        verifier = (config.get("speculators_config") or {}).get("verifier") or {}
        info.verifier = verifier.get("name_or_path")
    info.coverage = _coverage((read_provenance(directory) or {}).get("draft_vocab"))
    info.aux_layer_ids, info.layer_ids_source = _ids_of(layout, config)
    info.variant = _variant_of(layout, config, layer, info)
    return info


def _variant_of(layout: str, config: dict, layer: dict, info: CheckpointInfo) -> dict:
    """The variant fields where vLLM reads them: the top level (speculators, and the HF
    config of the other layouts), norm_before_fc also from `eagle_config`, the layer count
    from the decoder config; unset means off, as vLLM takes it."""
    nested = config.get("eagle_config")
    if isinstance(nested, str):
        try:
            nested = json.loads(nested)
        except ValueError:
            nested = None
    nested = nested if isinstance(nested, dict) else {}

    def flag(name: str) -> bool:
        value = config.get(name, nested.get(name))
        return bool(value) if isinstance(value, bool | int) else False

    stated = _int(layer.get("num_hidden_layers"))
    held = _decoder_layers(info)
    return {
        "norm_before_fc": flag("norm_before_fc"),
        "fc_norm": flag("fc_norm"),
        "norm_output": flag("norm_output"),
        # a layout other than speculators may state the target's count (or none): the
        # weights decide there, and _check_variant compares them with a speculators config
        "num_hidden_layers": (stated or 1) if layout == "speculators" else max(held, 1),
        "embed_requires_grad": layout == "speculators" and flag("embed_requires_grad"),
    }


def _ids_of(layout: str, config: dict) -> tuple[list[int] | None, str]:
    top = config.get("eagle_aux_hidden_state_layer_ids")
    nested = _nested_ids(config)
    if layout in ("sglang", "modelopt") and nested:
        return from_layer_output(nested), "eagle_config.eagle_aux_hidden_state_layer_ids (+1)"
    if top:
        return [int(i) for i in top], "eagle_aux_hidden_state_layer_ids"
    if nested:  # a speculators config with only nested ids: vLLM reads them as boundary ids
        return [int(i) for i in nested], "eagle_config.eagle_aux_hidden_state_layer_ids"
    return None, "none"


_READERS = {
    "eagle3kit": read_eagle3kit,
    "speculators": _read_third_party,
    "sglang": _read_third_party,
    "eagle3": _read_third_party,
    "modelopt": _read_third_party,
}

"""The problems `inspect` lists (CHECKPOINTS.md §5): the hazards of serving a checkpoint
(layer ids missing or in the other convention, a vocabulary mapping vLLM refuses, a variant
the config does not state, a config past what the engines accept), and, when the target is
known, its disagreements with the target. A problem that changes what the tensors mean also
stops `load_inspected` (`load._unloadable`); the rest are shown by `eagle3kit info`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from eagle3kit.checkpoints.base import (
    CheckpointInfo,
    _decoder_layers,
    _int,
    _nested_ids,
    target_dict,
)
from eagle3kit.checkpoints.speculators import check_speculators
from eagle3kit.checkpoints.weights import Weights, target_embedding
from eagle3kit.model.vocab import vocab_problems
from eagle3kit.target import default_layer_ids, from_layer_output

# Tensors of the EAGLE-3.1 variants (norm_before_fc, fc_norm).
_V31_PREFIXES = ("input_norm.", "fc_norm.")


def _implicit_target(info: CheckpointInfo) -> Any:
    """A local target directory the checkpoint names (verifier path, run target path)."""
    candidates = [info.verifier]
    if info.layout == "eagle3kit":
        candidates.insert(0, (info.config["eagle3kit"].get("target") or {}).get("path"))
    for c in candidates:
        if c and (Path(c) / "config.json").is_file():
            return Path(c)
    return None


def check(
    info: CheckpointInfo, config: dict, weights: Weights, shapes: dict, target_config: Any
) -> None:
    given = target_config is not None
    target, target_dir = target_dict(target_config if given else _implicit_target(info))
    if target is not None:
        info.target_layers = _int(target.get("num_hidden_layers")) or info.target_layers
    problems = info.problems
    if info.num_aux is not None and info.num_aux != 3:
        problems.append(
            f"fc takes {info.num_aux} aux states (fc.weight "
            f"{list(shapes['fc.weight'])}); engines before vLLM PR #54598 "
            f"assume 3 and fail to load it"
        )
    if info.aux_layer_ids is None:
        default = default_layer_ids(info.target_layers) if info.target_layers else None
        info.aux_layer_ids = default
        info.layer_ids_source = "engine default"
        problems.append(
            "no aux layer ids: engines silently use (2, N//2, N-3)"
            + (f" = {default}" if default else "")
            + "; a drafter trained on other layers collapses to acceptance ~1"
        )
    elif info.num_aux is not None and len(info.aux_layer_ids) != info.num_aux:
        problems.append(
            f"{len(info.aux_layer_ids)} aux layer ids but fc takes {info.num_aux} aux states"
        )
    _check_conventions(info, config)
    _check_vocab(info, config, weights, shapes)
    if info.layout == "speculators":
        check_speculators(info, config)
    _check_variant(info, shapes)
    if _use_cache_null(config, info.layout):
        problems.append("use_cache is null: vLLM's strict config validation rejects it")
    if target is not None:
        _check_against_target(info, target, target_dir, weights, explicit=given)


def _check_variant(info: CheckpointInfo, shapes: dict) -> None:
    """The variant the config states against the tensors the weights hold."""
    variant, problems = info.variant, info.problems
    names = [info.rename(n) for n in shapes]
    if variant["norm_before_fc"] and variant["fc_norm"]:
        problems.append(
            "norm_before_fc and fc_norm are both set: they exclude each other "
            "(speculators refuses the config)"
        )
    if "input_norm.weight" in names and not variant["norm_before_fc"]:
        problems.append(
            "input_norm.weight present but norm_before_fc is not set: vLLM drops "
            "the norm and serves another function than the one trained (set "
            '"norm_before_fc": true in config.json)'
        )
    elif variant["norm_before_fc"] and "input_norm.weight" not in names:
        info.warnings.append(
            "norm_before_fc is set but the weights hold no input_norm.weight: "
            "the engines use a norm of weight 1, and so does eagle3kit"
        )
    has_fc_norm = any(n.startswith("fc_norm.") for n in names)
    if has_fc_norm and not variant["fc_norm"]:
        problems.append(
            "fc_norm.* tensors present but fc_norm is not set: vLLM refuses them "
            '(set "fc_norm": true in config.json)'
        )
    elif variant["fc_norm"] and not has_fc_norm:
        problems.append("fc_norm is set but the weights hold no fc_norm.* tensors")
    held = _decoder_layers(info)
    if held != variant["num_hidden_layers"]:
        problems.append(
            f"num_hidden_layers is {variant['num_hidden_layers']} but the weights "
            f"hold {held} decoder layers: the engine builds the config's count"
        )
    if variant["embed_requires_grad"] and not info.has_embedding:
        problems.append(
            "embed_requires_grad is true but the checkpoint has no "
            "embed_tokens.weight: the drafter's own embedding is missing"
        )
    if any(n.startswith(_V31_PREFIXES) for n in names) or variant["norm_output"]:
        info.warnings.append(
            "EAGLE-3.1 variant ("
            + ", ".join(k for k in ("norm_before_fc", "fc_norm", "norm_output") if variant[k])
            + "): read only by recent engines (vLLM's llama_eagle3.py; SGLang reads none)"
        )
    _check_sliding_window(info)


def _check_sliding_window(info: CheckpointInfo) -> None:
    """speculators' trainer writes `layer_types: sliding_attention` by default, which vLLM
    serves with the window; eagle3kit's drafter attends to the whole context."""
    layer = (
        info.config.get("transformer_layer_config") if info.layout == "speculators" else info.config
    )
    if not isinstance(layer, dict):
        return
    types, window = layer.get("layer_types"), _int(layer.get("sliding_window"))
    if isinstance(types, list) and "sliding_attention" in types and window:
        info.warnings.append(
            f"the draft layers use sliding-window attention (window {window}) "
            f"where vLLM serves them; eagle3kit's drafter sees the whole "
            f"context, so its figures differ on contexts past {window} tokens"
        )


def _check_conventions(info: CheckpointInfo, config: dict) -> None:
    ids = info.aux_layer_ids
    if not ids or info.layer_ids_source == "engine default":
        return
    if info.layout == "sglang":
        nested, top = _nested_ids(config), config.get("eagle_aux_hidden_state_layer_ids")
        if nested and top and from_layer_output(nested) != list(top):
            info.problems.append(
                f"top-level ids {list(top)} (boundary, read by vLLM) and "
                f"eagle_config ids {nested} (layer-output, read by SGLang) "
                f"name different layers"
            )
        if nested and nested[0] != 1:
            info.warnings.append(
                f"eagle_config ids {nested} do not start at 1: SGLang before "
                f"PR #25454 adds 1 to them, newer SGLang reads them as "
                f"boundary ids; check per-position acceptance"
            )
    elif info.layout in ("speculators", "eagle3kit") and ids[0] == 1:
        info.warnings.append(
            f"boundary ids {ids} start at 1: the layer-output convention's "
            f"first id; if they were meant as layer-output ids every layer is "
            f"off by one"
        )
    if min(ids) < 0:
        info.problems.append(f"aux layer ids {ids}: negative boundary id")


def _check_vocab(info: CheckpointInfo, config: dict, weights: Weights, shapes: dict) -> None:
    lm_head = shapes.get("lm_head.weight")
    if lm_head and info.draft_vocab_size and lm_head[0] != info.draft_vocab_size:
        info.problems.append(
            f"lm_head has {lm_head[0]} rows but draft_vocab_size is {info.draft_vocab_size}"
        )
    if info.vocab_size is None or info.draft_vocab_size is None:
        return
    d2t = _small(weights, "d2t")
    t2d = _small(weights, "t2d")
    if d2t is not None and "int" not in weights.meta["d2t"][1]:
        info.problems.append(f"d2t is {weights.meta['d2t'][1]}, expected int64 offsets")
    if t2d is not None and weights.meta["t2d"][1] != "bool":
        info.problems.append(f"t2d is {weights.meta['t2d'][1]}, expected bool")
        t2d = t2d.astype(bool)
    if d2t is not None and info.draft_vocab_size == info.vocab_size:
        _full_vocabulary_mapping(info)
    if d2t is None and t2d is not None and info.draft_vocab_size != info.vocab_size:
        info.problems.append(
            "t2d without d2t: vLLM reads only d2t, so it would map draft rows "
            "to the wrong target ids"
        )
        return
    info.problems.extend(vocab_problems(d2t, t2d, info.vocab_size, info.draft_vocab_size))


FULL_VOCAB_D2T = "the draft vocabulary is the target's whole vocabulary, yet the checkpoint has d2t"


def _full_vocabulary_mapping(info: CheckpointInfo) -> None:
    """vLLM creates `draft_id_to_target_id` only when draft_vocab_size differs from the
    target's vocab size, so it refuses a full-vocabulary d2t at load ("There is no module or
    parameter named 'draft_id_to_target_id' in Eagle3LlamaForCausalLM"). speculators writes
    none there, and so does `eagle3kit export`; eagle3kit's own training checkpoint always
    keeps it (export drops it)."""
    if info.layout == "eagle3kit":
        return
    text = (
        f"{FULL_VOCAB_D2T} ({info.vocab_size} ids): vLLM refuses to load it (no parameter "
        f"draft_id_to_target_id); re-export it with `eagle3kit export`, which writes no "
        f"d2t/t2d for a full vocabulary"
    )
    # vLLM is the engine of the speculators layout; SGLang reads the mapping when present.
    (info.problems if info.layout == "speculators" else info.warnings).append(
        text if info.layout == "speculators" else text + " (when vLLM serves it)"
    )


def _small(weights: Weights, name: str) -> np.ndarray | None:
    if name not in weights.meta:
        return None
    return weights.get(name).numpy()


def _use_cache_null(config: dict, layout: str) -> bool:
    holders = [config]
    if layout == "speculators" and isinstance(config.get("transformer_layer_config"), dict):
        holders.append(config["transformer_layer_config"])
    return any("use_cache" in h and h["use_cache"] is None for h in holders)


def _check_against_target(
    info: CheckpointInfo, target: dict, target_dir: Path | None, weights: Weights, explicit: bool
) -> None:
    where = "the target" if explicit else f"the target it names ({target_dir})"
    n = _int(target.get("num_hidden_layers"))
    if info.aux_layer_ids and n is not None and max(info.aux_layer_ids) > n:
        info.problems.append(f"aux layer ids {info.aux_layer_ids} reach past {where}'s {n} layers")
    target_max = _int(target.get("max_position_embeddings"))
    if target_max and info.max_position_embeddings and info.max_position_embeddings < target_max:
        info.problems.append(
            f"max_position_embeddings {info.max_position_embeddings} is shorter "
            f"than {where}'s {target_max}: acceptance drops past it"
        )
    h_t = _int(target.get("hidden_size"))
    if h_t and (info.target_hidden_size or info.hidden_size) != h_t:
        info.problems.append(
            f"built for hidden size {info.target_hidden_size or info.hidden_size}"
            f", {where} has {h_t}"
        )
    v = _int(target.get("vocab_size"))
    if v and info.vocab_size and v != info.vocab_size:
        info.problems.append(f"vocabulary of {info.vocab_size} ids, {where} has {v}")
    if info.has_embedding and target_dir is not None and not info.variant["embed_requires_grad"]:
        mine = weights.get("embed_tokens.weight")
        theirs = target_embedding(target_dir)
        if theirs is not None and (
            mine.shape != theirs.shape or not _same_when_rounded(mine, theirs)
        ):
            info.problems.append(
                f"embed_tokens differs from {where}'s embedding: vLLM keeps a "
                f"differing draft embedding (PR #28549) and acceptance drops"
            )


def _same_when_rounded(a, b) -> bool:
    """a == b at the narrower of their dtypes: a checkpoint saved in bf16 beside an fp32 target
    (speculators writes its drafters so) holds the target's embedding rounded to bf16."""
    narrow = a.dtype if a.element_size() <= b.element_size() else b.dtype
    return bool((a.to(narrow) == b.to(narrow)).all())

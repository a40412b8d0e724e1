"""What the layout files share: the layout names, `CheckpointInfo` (what `inspect` found in a
checkpoint directory), the small readers of config values (the decoder layer's dict, nested
ids, the target's config and RoPE), and the Llama decoder config both written layouts
describe the one draft layer with. Importing it loads no torch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from eagle3kit.checkpoints.weights import Weights
from eagle3kit.errors import UserError
from eagle3kit.model.config import VARIANT_FIELDS, VARIANTS, DrafterConfig, named_rope_kind, rope_of
from eagle3kit.target import to_layer_output

LAYOUTS = {
    "eagle3kit": "eagle3kit (speculators weights, an eagle3kit config block)",
    "speculators": "speculators / vLLM (speculators_model_type eagle3)",
    "sglang": "SGLang / SpecForge (LlamaForCausalLMEagle3, midlayer.*)",
    "eagle3": "original EAGLE-3 (midlayer.*, no layer ids)",
    "modelopt": "ModelOpt (LlamaForCausalLMEagle3, layers.0.*, eagle_config)",
    "eagle1": "EAGLE-1/2 (not EAGLE-3: fc takes 2H)",
    "speculators-other": "speculators, not EAGLE-3",
}
"""Layout name -> what it is. The last two are recognised only, never loaded."""


_PLAIN = {name: VARIANTS["eagle3"][name] for name in VARIANT_FIELDS}


# What a checkpoint is ----------------------------------------------------------------------------
@dataclass
class CheckpointInfo:
    """What `inspect` found in a checkpoint directory."""

    path: str
    layout: str
    """A key of LAYOUTS."""
    description: str
    weights_files: list[str]
    aux_layer_ids: list[int] | None
    """Boundary convention (vLLM's); the default the engines would use when ids are missing."""
    layer_ids_source: str
    """Where the ids came from: the config key read, or 'engine default'."""
    num_aux: int | None
    hidden_size: int | None
    target_hidden_size: int | None
    vocab_size: int | None
    draft_vocab_size: int | None
    coverage: float | None
    """Share of the training tokens the draft vocabulary covers, when recorded."""
    norm_before_residual: bool | None
    """As the layout implies when the config does not say (speculators: true; others: false)."""
    variant: dict
    """norm_before_fc, fc_norm, norm_output, num_hidden_layers, embed_requires_grad, as the
    config states them (model.config.VARIANT_FIELDS); the engines' defaults where it is
    silent."""
    max_position_embeddings: int | None
    target_layers: int | None
    """N, the target's decoder layers, when known."""
    verifier: str | None
    has_embedding: bool
    dtype: str | None
    weights: Weights = field(repr=False)
    sliding_window: int | None = None
    """The draft layers' sliding window (keys seen, the query's own included) as vLLM reads
    it: `sliding_window` where `layer_types` names the layers sliding_attention; None: full."""
    tensors: dict[str, list] = field(default_factory=dict)
    """name -> [shape, dtype], as the file stores them."""
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    config: dict = field(default_factory=dict, repr=False)
    rename: Callable[[str], str] = field(default=lambda n: n, repr=False)
    drafter_config: DrafterConfig | None = field(default=None, repr=False)

    @property
    def aux_layer_ids_output(self) -> list[int] | None:
        """The same ids in the layer-output convention (SGLang, SpecForge, ModelOpt)."""
        return None if self.aux_layer_ids is None else to_layer_output(self.aux_layer_ids)

    @property
    def supported(self) -> bool:
        return self.layout not in ("eagle1", "speculators-other")

    def to_dict(self) -> dict:
        keys = (
            "path",
            "layout",
            "description",
            "weights_files",
            "aux_layer_ids",
            "layer_ids_source",
            "num_aux",
            "hidden_size",
            "target_hidden_size",
            "vocab_size",
            "draft_vocab_size",
            "coverage",
            "norm_before_residual",
            "variant",
            "max_position_embeddings",
            "sliding_window",
            "target_layers",
            "verifier",
            "has_embedding",
            "dtype",
            "tensors",
            "problems",
            "warnings",
        )
        out = {k: getattr(self, k) for k in keys}
        out["aux_layer_ids_output"] = self.aux_layer_ids_output
        return out


def _base(directory: Path, layout: str, weights: Weights, shapes: dict) -> CheckpointInfo:
    fc = shapes.get("fc.weight")
    return CheckpointInfo(
        path=str(directory),
        layout=layout,
        description=LAYOUTS[layout],
        weights_files=[f.name for f in weights.files],
        aux_layer_ids=None,
        layer_ids_source="none",
        num_aux=None,
        hidden_size=fc[0] if fc else None,
        target_hidden_size=None,
        vocab_size=None,
        draft_vocab_size=None,
        coverage=None,
        norm_before_residual=None,
        variant=dict(_PLAIN),
        max_position_embeddings=None,
        target_layers=None,
        verifier=None,
        has_embedding="embed_tokens.weight" in shapes,
        dtype=weights.meta["fc.weight"][1] if fc else None,
        weights=weights,
    )


def _decoder_layers(info: CheckpointInfo) -> int:
    """How many decoder layers the weights hold (layers.i.*, SGLang's midlayer.* as 0)."""
    found = set()
    for name in info.weights.names:
        match = re.match(r"layers\.(\d+)\.", info.rename(name))
        if match:
            found.add(int(match.group(1)))
    return len(found)


def _coverage(record: dict | None) -> float | None:
    if not isinstance(record, dict):
        return None
    for holder in (record, record.get("vocab"), record.get("draft_vocab")):
        if isinstance(holder, dict) and isinstance(holder.get("coverage"), int | float):
            return float(holder["coverage"])
    return None


# Reading config values ---------------------------------------------------------------------------
def layer_config(layout: str, config: dict) -> dict:
    """The dict holding the decoder layer's shape fields."""
    if layout == "eagle3kit":
        return config["eagle3kit"]["drafter"]
    if layout == "speculators":
        tlc = config.get("transformer_layer_config")
        if not isinstance(tlc, dict):
            raise UserError("speculators config without a transformer_layer_config object")
        return tlc
    return config


def _nested_ids(config: dict) -> list[int] | None:
    nested = config.get("eagle_config")
    if isinstance(nested, str):  # some writers store it as a JSON string
        try:
            nested = json.loads(nested)
        except ValueError:
            return None
    ids = nested.get("eagle_aux_hidden_state_layer_ids") if isinstance(nested, dict) else None
    return list(ids) if ids else None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def target_dict(target: Any) -> tuple[dict | None, Path | None]:
    """A target given as a directory, a config dict or a transformers config -> (raw config
    dict, directory or None). Multimodal configs give their text config."""
    if target is None:
        return None, None
    directory = None
    if isinstance(target, str | Path):
        directory = Path(target)
        if not (directory / "config.json").is_file():
            raise UserError(f"{directory}: not a model directory (no config.json)")
        raw = json.loads((directory / "config.json").read_text())
    elif isinstance(target, dict):
        raw = target
    else:
        raw = target.to_dict()
    text = raw.get("text_config")
    return (text if isinstance(text, dict) and "hidden_size" in text else raw), directory


def target_rope(raw: dict) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling) of a raw target config, transformers 4.x or 5.x style."""
    return rope_of(
        SimpleNamespace(
            **{k: raw.get(k) for k in ("rope_parameters", "rope_theta", "rope_scaling")}
        )
    )


# Writing: the draft layer's decoder config -------------------------------------------------------
def _rope_fields(drafter: Any, target: dict | None, warnings: list[str]) -> dict:
    """max_position_embeddings and RoPE as the target has them (CHECKPOINTS.md §6)."""
    if target is None:
        theta, scaling, max_pos = (
            drafter.rope_theta,
            drafter.rope_scaling,
            drafter.max_position_embeddings,
        )
        params = None
    else:
        theta, scaling = target_rope(target)
        max_pos = target.get("max_position_embeddings") or drafter.max_position_embeddings
        params = target.get("rope_parameters")
        trained = named_rope_kind(drafter.rope_scaling) if drafter.rope_scaling else None
        if theta != drafter.rope_theta or (scaling or None) != trained:
            warnings.append(
                f"the drafter was trained with rope_theta {drafter.rope_theta}, "
                f"scaling {drafter.rope_scaling}; the export has the target's "
                f"({theta}, {scaling})"
            )
    if not isinstance(params, dict):
        kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
        params = {
            **{k: v for k, v in (scaling or {}).items() if k != "type"},
            "rope_type": kind,
            "rope_theta": theta,
        }
    return {
        "max_position_embeddings": max_pos,
        "rope_theta": theta,
        "rope_scaling": scaling,
        "rope_parameters": params,
    }


def _token_ids(drafter: Any, target: dict | None) -> dict:
    source = (
        target
        if target is not None
        else {
            "bos_token_id": drafter.bos_token_id,
            "eos_token_id": drafter.eos_token_id,
            "pad_token_id": drafter.pad_token_id,
        }
    )
    return {k: source.get(k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}


def window_fields(drafter: Any) -> dict:
    """A sliding window as vLLM's Llama attention reads it for the draft (and transformers
    for any Llama): `sliding_window` applies to the layers `layer_types` names
    sliding_attention, and only when `layer_types` is there (a bare `sliding_window` is
    ignored, and the draft then takes the target's window, if any). Nothing for full
    attention: the configs stay as they were."""
    if not drafter.sliding_window:
        return {}
    return {
        "sliding_window": drafter.sliding_window,
        "layer_types": ["sliding_attention"] * drafter.num_hidden_layers,
    }


def window_of(layer: dict, warnings: list[str]) -> int | None:
    """The sliding window a decoder config gives its draft layers, as vLLM reads it."""
    types, window = layer.get("layer_types"), _int(layer.get("sliding_window"))
    if not isinstance(types, list) or "sliding_attention" not in types or not window:
        return None
    if any(t != "sliding_attention" for t in types):
        warnings.append(
            f"layer_types {types}: only some draft layers use the sliding window "
            f"of {window}; eagle3kit applies it to every draft layer"
        )
    return window


def decoder_fields(drafter: Any, target: dict | None, warnings: list[str]) -> dict:
    """The Llama decoder config both layouts describe the one draft layer with."""
    return {
        "model_type": "llama",  # the draft layer is Llama-style (no q/k norms) for any target
        "hidden_size": drafter.hidden_size,
        "intermediate_size": drafter.intermediate_size,
        "num_attention_heads": drafter.num_attention_heads,
        "num_key_value_heads": drafter.num_key_value_heads,
        "head_dim": drafter.head_dim,
        "num_hidden_layers": drafter.num_hidden_layers,
        "hidden_act": drafter.hidden_act,
        "rms_norm_eps": drafter.rms_norm_eps,
        "attention_bias": False,
        "mlp_bias": False,
        **_rope_fields(drafter, target, warnings),
        **window_fields(drafter),
        "vocab_size": drafter.vocab_size,  # V, never Vd (speculators PR #188)
        "tie_word_embeddings": False,
        "use_cache": True,  # null fails vLLM's strict config validation
        **_token_ids(drafter, target),
    }

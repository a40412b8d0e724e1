"""Reading EAGLE-3 checkpoints in the layouts engines and trainers write (CHECKPOINTS.md).

`inspect(path)` reads a checkpoint directory's `config.json` and the names, shapes and dtypes
of its weights (plus the small `d2t`/`t2d`), names its layout and lists its problems without
loading the large tensors. `load_any(path)` turns any EAGLE-3 layout into an `Eagle3Drafter`.

Layer ids are always returned in the boundary convention (EAGLE3.md §1.1): SGLang's and
ModelOpt's nested `eagle_config` ids are layer-output ids and get +1; a checkpoint without ids
gets the engines' silent default (2, N//2, N-3), flagged as a problem.
"""

from __future__ import annotations

import json
import pickle
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from eagle3kit.errors import UserError
from eagle3kit.model.config import VARIANT_FIELDS, VARIANTS, DrafterConfig, rope_of
from eagle3kit.model.vocab import vocab_problems
from eagle3kit.target import (
    config_dict,
    default_layer_ids,
    from_layer_output,
    to_layer_output,
)
from eagle3kit.train.rundir import RunDir, read_provenance

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

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
# Tensors of the EAGLE-3.1 variants (norm_before_fc, fc_norm).
_V31_PREFIXES = ("input_norm.", "fc_norm.")
_PLAIN = {name: VARIANTS["eagle3"][name] for name in VARIANT_FIELDS}


# Reading the files --------------------------------------------------------------------------
class Weights:
    """A checkpoint's tensors: names, shapes and dtypes from the file headers, data on demand.

    `pytorch_model.bin` files are read only with `torch.load(weights_only=True)`: a pickle
    that holds anything but tensors is refused, never executed.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.files = _weight_files(directory)
        self._where: dict[str, Path] = {}
        self.meta: dict[str, tuple[tuple[int, ...], str]] = {}
        self._bins: dict[Path, dict] = {}
        for f in self.files:
            for name, meta in self._headers(f).items():
                self._where[name] = f
                self.meta[name] = meta

    @property
    def names(self) -> list[str]:
        return list(self.meta)

    def shape(self, name: str) -> tuple[int, ...] | None:
        return self.meta[name][0] if name in self.meta else None

    def _headers(self, f: Path) -> dict[str, tuple[tuple[int, ...], str]]:
        if f.suffix == ".safetensors":
            from safetensors import safe_open

            try:
                with safe_open(str(f), framework="pt") as handle:
                    return {n: (tuple(handle.get_slice(n).get_shape()),
                                _dtype_name(handle.get_slice(n).get_dtype()))
                            for n in handle.keys()}  # noqa: SIM118 (not a dict)
            except Exception as exc:  # safetensors raises its own error types
                raise UserError(f"{f}: not a readable safetensors file ({exc})") from None
        return {n: (tuple(t.shape), _dtype_name(t.dtype)) for n, t in self._bin(f).items()}

    def _bin(self, f: Path) -> dict:
        if f not in self._bins:
            import torch

            try:
                try:
                    data = torch.load(f, map_location="cpu", weights_only=True, mmap=True)
                except RuntimeError:  # the legacy (non-zip) format cannot be memory-mapped
                    data = torch.load(f, map_location="cpu", weights_only=True)
            except pickle.UnpicklingError as exc:
                raise UserError(f"{f}: holds more than tensors; eagle3kit reads .bin weights "
                                f"only with torch.load(weights_only=True) "
                                f"({str(exc).splitlines()[0]})") from None
            except (OSError, EOFError, RuntimeError) as exc:
                raise UserError(f"{f}: not a readable PyTorch weights file ({exc})") from None
            if not isinstance(data, dict) or not all(isinstance(v, torch.Tensor)
                                                     for v in data.values()):
                raise UserError(f"{f}: expected a dict of tensors")
            self._bins[f] = data
        return self._bins[f]

    def get(self, name: str):
        f = self._where[name]
        if f.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(f), framework="pt") as handle:
                return handle.get_tensor(name)
        return self._bin(f)[name]

    def all(self) -> dict:
        return {name: self.get(name) for name in self.meta}


def _dtype_name(dtype: Any) -> str:
    """'bfloat16', 'int64', 'bool'... for both torch dtypes and safetensors' 'BF16' codes."""
    text = str(dtype).removeprefix("torch.")
    return {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64",
            "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
            "BOOL": "bool"}.get(text, text)


def _weight_files(directory: Path) -> list[Path]:
    for name in WEIGHT_FILES:
        path = directory / name
        if not path.is_file():
            continue
        if not name.endswith(".index.json"):
            return [path]
        try:
            weight_map = json.loads(path.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as exc:
            raise UserError(f"{path}: not a weights index ({exc})") from None
        files = [directory / f for f in sorted(set(weight_map.values()))]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise UserError(f"{path}: names files that are missing: {', '.join(missing)}")
        return files
    loose = sorted(directory.glob("*.safetensors"))
    if len(loose) == 1:
        return loose
    raise UserError(f"{directory}: no weights found (expected one of {', '.join(WEIGHT_FILES)})")


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
    return rope_of(SimpleNamespace(**{k: raw.get(k) for k in
                                      ("rope_parameters", "rope_theta", "rope_scaling")}))


# What a checkpoint is ------------------------------------------------------------------------
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
    tensors: dict[str, list] = field(default_factory=dict)
    """name -> [shape, dtype], as the file stores them."""
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    config: dict = field(default_factory=dict, repr=False)
    weights: Weights | None = field(default=None, repr=False)
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
        keys = ("path", "layout", "description", "weights_files", "aux_layer_ids",
                "layer_ids_source", "num_aux", "hidden_size", "target_hidden_size",
                "vocab_size", "draft_vocab_size", "coverage", "norm_before_residual",
                "variant", "max_position_embeddings", "target_layers", "verifier", "has_embedding",
                "dtype", "tensors", "problems", "warnings")
        out = {k: getattr(self, k) for k in keys}
        out["aux_layer_ids_output"] = self.aux_layer_ids_output
        return out


def detect_layout(config: dict, names: list[str], shapes: dict) -> str:
    if isinstance(config.get("eagle3kit"), dict):
        return "eagle3kit"
    if "speculators_model_type" in config or "speculators_config" in config:
        return "speculators" if config.get("speculators_model_type") == "eagle3" \
            else "speculators-other"
    fc = shapes.get("fc.weight")
    hidden = shapes.get("norm.weight", shapes.get("midlayer.input_layernorm.weight"))
    if "fc.bias" in names or (fc and hidden and fc[1] == 2 * hidden[0]
                              and "d2t" not in names and "t2d" not in names):
        return "eagle1"
    if any(n.startswith("midlayer.") for n in names):
        return "sglang" if _nested_ids(config) or config.get(
            "eagle_aux_hidden_state_layer_ids") else "eagle3"
    if "LlamaForCausalLMEagle3" in (config.get("architectures") or []) or "eagle_config" in config:
        return "modelopt"
    raise UserError("not a checkpoint layout eagle3kit knows (eagle3kit, speculators, SGLang/"
                    "SpecForge, original EAGLE-3, ModelOpt, EAGLE-1/2)")


def _nested_ids(config: dict) -> list[int] | None:
    nested = config.get("eagle_config")
    if isinstance(nested, str):  # some writers store it as a JSON string
        try:
            nested = json.loads(nested)
        except ValueError:
            return None
    ids = nested.get("eagle_aux_hidden_state_layer_ids") if isinstance(nested, dict) else None
    return list(ids) if ids else None


def _layer_config(layout: str, config: dict) -> dict:
    """The dict holding the decoder layer's shape fields."""
    if layout == "eagle3kit":
        return config["eagle3kit"]["drafter"]
    if layout == "speculators":
        tlc = config.get("transformer_layer_config")
        if not isinstance(tlc, dict):
            raise UserError("speculators config without a transformer_layer_config object")
        return tlc
    return config


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
    shapes = {n: weights.shape(n) for n in weights.names}
    try:
        layout = detect_layout(config, weights.names, shapes)
    except UserError as exc:
        raise UserError(f"{directory}: {exc}") from None
    reader = _READERS.get(layout, _read_unsupported)
    info = reader(directory, layout, config, weights, shapes)
    info.tensors = {n: [list(s), weights.meta[n][1]] for n, s in shapes.items()}
    if info.supported:
        _check(info, config, weights, shapes, target_config)
    return info


def checkpoint_problems(path: str | Path, target_config: Any = None) -> list[str]:
    """The CHECKPOINTS.md §5 problems of the checkpoint in `path`; [] when none."""
    return inspect(path, target_config).problems


# Per-layout readers -------------------------------------------------------------------------
def _base(directory: Path, layout: str, weights: Weights, shapes: dict) -> CheckpointInfo:
    fc = shapes.get("fc.weight")
    return CheckpointInfo(
        path=str(directory), layout=layout, description=LAYOUTS[layout],
        weights_files=[f.name for f in weights.files], aux_layer_ids=None,
        layer_ids_source="none", num_aux=None, hidden_size=fc[0] if fc else None,
        target_hidden_size=None, vocab_size=None, draft_vocab_size=None, coverage=None,
        norm_before_residual=None, variant=dict(_PLAIN), max_position_embeddings=None,
        target_layers=None,
        verifier=None, has_embedding="embed_tokens.weight" in shapes,
        dtype=weights.meta["fc.weight"][1] if fc else None, weights=weights)


def _read_unsupported(directory: Path, layout: str, config: dict, weights: Weights,
                      shapes: dict) -> CheckpointInfo:
    info = _base(directory, layout, weights, shapes)
    info.config = config
    kind = config.get("speculators_model_type", "EAGLE-1/2")
    info.problems.append(f"not an EAGLE-3 checkpoint ({kind}): EAGLE-3 engines cannot serve it "
                         f"and eagle3kit cannot load it")
    return info


def _read_eagle3kit(directory: Path, layout: str, config: dict, weights: Weights,
                    shapes: dict) -> CheckpointInfo:
    block = config["eagle3kit"]
    try:
        drafter = DrafterConfig.from_dict(block["drafter"])
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"{directory}/config.json: eagle3kit block without a valid drafter "
                        f"config ({exc})") from None
    info = _from_drafter_config(directory, "eagle3kit", weights, shapes, drafter)
    info.layer_ids_source = "eagle3kit.drafter.aux_layer_ids"
    target = block.get("target") or {}
    info.verifier = target.get("name_or_path") or target.get("path") or drafter.target_name_or_path
    info.target_layers = target.get("num_hidden_layers")
    run = RunDir.holding(directory)
    info.coverage = _coverage(block) or _coverage(run.record() if run else None)
    info.config = config
    return info


def _from_drafter_config(directory: Path, layout: str, weights: Weights, shapes: dict,
                         drafter: DrafterConfig) -> CheckpointInfo:
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
    return info


def _coverage(record: dict | None) -> float | None:
    if not isinstance(record, dict):
        return None
    for holder in (record, record.get("vocab"), record.get("draft_vocab")):
        if isinstance(holder, dict) and isinstance(holder.get("coverage"), int | float):
            return float(holder["coverage"])
    return None


def _read_third_party(directory: Path, layout: str, config: dict, weights: Weights,
                      shapes: dict) -> CheckpointInfo:
    """speculators, SGLang/SpecForge, original EAGLE-3 and ModelOpt: one mapping, per-layout
    names for the ids, the residual convention and the weights."""
    layer = _layer_config(layout, config)
    info = _base(directory, layout, weights, shapes)
    info.config = config
    if layout == "sglang" or layout == "eagle3":
        info.rename = _sglang_to_ours
    hidden = _int(layer.get("hidden_size")) or info.hidden_size
    fc = shapes.get("fc.weight")
    info.hidden_size = hidden
    info.target_hidden_size = _int(config.get("target_hidden_size")) or (
        _int(layer.get("target_hidden_size")))
    aux_width = info.target_hidden_size or hidden
    info.num_aux = fc[1] // aux_width if fc and aux_width else None
    t2d, lm_head = shapes.get("t2d"), shapes.get("lm_head.weight")
    info.vocab_size = _int(layer.get("vocab_size"))
    if t2d:  # the mask's length is V whatever the config says (see the vocab_size check)
        info.vocab_size = t2d[0]
    info.draft_vocab_size = _int(config.get("draft_vocab_size")) or (
        lm_head[0] if lm_head else info.vocab_size)
    info.max_position_embeddings = _int(layer.get("max_position_embeddings"))
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
    return {"norm_before_fc": flag("norm_before_fc"), "fc_norm": flag("fc_norm"),
            "norm_output": flag("norm_output"),
            # a layout other than speculators may state the target's count (or none): the
            # weights decide there, and _check_variant compares them with a speculators config
            "num_hidden_layers": (stated or 1) if layout == "speculators" else max(held, 1),
            "embed_requires_grad": layout == "speculators" and flag("embed_requires_grad")}


def _decoder_layers(info: CheckpointInfo) -> int:
    """How many decoder layers the weights hold (layers.i.*, SGLang's midlayer.* as 0)."""
    found = set()
    for name in info.weights.names:
        match = re.match(r"layers\.(\d+)\.", info.rename(name))
        if match:
            found.add(int(match.group(1)))
    return len(found)


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


def _sglang_to_ours(name: str) -> str:
    return "layers.0." + name.removeprefix("midlayer.") if name.startswith("midlayer.") else name


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


_READERS = {"eagle3kit": _read_eagle3kit, "speculators": _read_third_party,
            "sglang": _read_third_party, "eagle3": _read_third_party,
            "modelopt": _read_third_party}


# Checks -------------------------------------------------------------------------------------
def _implicit_target(info: CheckpointInfo) -> Any:
    """A local target directory the checkpoint names (verifier path, run target path)."""
    candidates = [info.verifier]
    if info.layout == "eagle3kit":
        candidates.insert(0, (info.config["eagle3kit"].get("target") or {}).get("path"))
    for c in candidates:
        if c and (Path(c) / "config.json").is_file():
            return Path(c)
    return None


def _check(info: CheckpointInfo, config: dict, weights: Weights, shapes: dict,
           target_config: Any) -> None:
    given = target_config is not None
    target, target_dir = target_dict(target_config if given else _implicit_target(info))
    if target is not None:
        info.target_layers = _int(target.get("num_hidden_layers")) or info.target_layers
    problems = info.problems
    if info.num_aux is not None and info.num_aux != 3:
        problems.append(f"fc takes {info.num_aux} aux states (fc.weight "
                        f"{list(shapes['fc.weight'])}); engines before vLLM PR #54598 "
                        f"assume 3 and fail to load it")
    if info.aux_layer_ids is None:
        default = default_layer_ids(info.target_layers) if info.target_layers else None
        info.aux_layer_ids = default
        info.layer_ids_source = "engine default"
        problems.append("no aux layer ids: engines silently use (2, N//2, N-3)"
                        + (f" = {default}" if default else "")
                        + "; a drafter trained on other layers collapses to acceptance ~1")
    elif info.num_aux is not None and len(info.aux_layer_ids) != info.num_aux:
        problems.append(f"{len(info.aux_layer_ids)} aux layer ids but fc takes "
                        f"{info.num_aux} aux states")
    _check_conventions(info, config)
    _check_vocab(info, config, weights, shapes)
    if info.layout == "speculators":
        _check_speculators(info, config)
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
        problems.append("norm_before_fc and fc_norm are both set: they exclude each other "
                        "(speculators refuses the config)")
    if "input_norm.weight" in names and not variant["norm_before_fc"]:
        problems.append("input_norm.weight present but norm_before_fc is not set: vLLM drops "
                        "the norm and serves another function than the one trained (set "
                        "\"norm_before_fc\": true in config.json)")
    elif variant["norm_before_fc"] and "input_norm.weight" not in names:
        info.warnings.append("norm_before_fc is set but the weights hold no input_norm.weight: "
                             "the engines use a norm of weight 1, and so does eagle3kit")
    has_fc_norm = any(n.startswith("fc_norm.") for n in names)
    if has_fc_norm and not variant["fc_norm"]:
        problems.append("fc_norm.* tensors present but fc_norm is not set: vLLM refuses them "
                        "(set \"fc_norm\": true in config.json)")
    elif variant["fc_norm"] and not has_fc_norm:
        problems.append("fc_norm is set but the weights hold no fc_norm.* tensors")
    held = _decoder_layers(info)
    if held != variant["num_hidden_layers"]:
        problems.append(f"num_hidden_layers is {variant['num_hidden_layers']} but the weights "
                        f"hold {held} decoder layers: the engine builds the config's count")
    if variant["embed_requires_grad"] and not info.has_embedding:
        problems.append("embed_requires_grad is true but the checkpoint has no "
                        "embed_tokens.weight: the drafter's own embedding is missing")
    if any(n.startswith(_V31_PREFIXES) for n in names) or variant["norm_output"]:
        info.warnings.append("EAGLE-3.1 variant (" + ", ".join(
            k for k in ("norm_before_fc", "fc_norm", "norm_output") if variant[k])
            + "): read only by recent engines (vLLM's llama_eagle3.py; SGLang reads none)")
    _check_sliding_window(info)


def _check_sliding_window(info: CheckpointInfo) -> None:
    """speculators' trainer writes `layer_types: sliding_attention` by default, which vLLM
    serves with the window; eagle3kit's drafter attends to the whole context."""
    layer = info.config.get("transformer_layer_config") if info.layout == "speculators" \
        else info.config
    if not isinstance(layer, dict):
        return
    types, window = layer.get("layer_types"), _int(layer.get("sliding_window"))
    if isinstance(types, list) and "sliding_attention" in types and window:
        info.warnings.append(f"the draft layers use sliding-window attention (window {window}) "
                             f"where vLLM serves them; eagle3kit's drafter sees the whole "
                             f"context, so its figures differ on contexts past {window} tokens")


def _check_conventions(info: CheckpointInfo, config: dict) -> None:
    ids = info.aux_layer_ids
    if not ids or info.layer_ids_source == "engine default":
        return
    if info.layout == "sglang":
        nested, top = _nested_ids(config), config.get("eagle_aux_hidden_state_layer_ids")
        if nested and top and from_layer_output(nested) != list(top):
            info.problems.append(f"top-level ids {list(top)} (boundary, read by vLLM) and "
                                 f"eagle_config ids {nested} (layer-output, read by SGLang) "
                                 f"name different layers")
        if nested and nested[0] != 1:
            info.warnings.append(f"eagle_config ids {nested} do not start at 1: SGLang before "
                                 f"PR #25454 adds 1 to them, newer SGLang reads them as "
                                 f"boundary ids; check per-position acceptance")
    elif info.layout in ("speculators", "eagle3kit") and ids[0] == 1:
        info.warnings.append(f"boundary ids {ids} start at 1: the layer-output convention's "
                             f"first id; if they were meant as layer-output ids every layer is "
                             f"off by one")
    if min(ids) < 0:
        info.problems.append(f"aux layer ids {ids}: negative boundary id")


def _check_vocab(info: CheckpointInfo, config: dict, weights: Weights, shapes: dict) -> None:
    lm_head = shapes.get("lm_head.weight")
    if lm_head and info.draft_vocab_size and lm_head[0] != info.draft_vocab_size:
        info.problems.append(f"lm_head has {lm_head[0]} rows but draft_vocab_size is "
                             f"{info.draft_vocab_size}")
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
        info.problems.append("t2d without d2t: vLLM reads only d2t, so it would map draft rows "
                             "to the wrong target ids")
        return
    info.problems.extend(vocab_problems(d2t, t2d, info.vocab_size, info.draft_vocab_size))


FULL_VOCAB_D2T = ("the draft vocabulary is the target's whole vocabulary, yet the checkpoint "
                  "has d2t")


def _full_vocabulary_mapping(info: CheckpointInfo) -> None:
    """vLLM creates `draft_id_to_target_id` only when draft_vocab_size differs from the
    target's vocab size, so it refuses a full-vocabulary d2t at load ("There is no module or
    parameter named 'draft_id_to_target_id' in Eagle3LlamaForCausalLM"). speculators writes
    none there, and so does `eagle3kit export`; eagle3kit's own training checkpoint always
    keeps it (export drops it)."""
    if info.layout == "eagle3kit":
        return
    text = (f"{FULL_VOCAB_D2T} ({info.vocab_size} ids): vLLM refuses to load it (no parameter "
            f"draft_id_to_target_id); re-export it with `eagle3kit export`, which writes no "
            f"d2t/t2d for a full vocabulary")
    # vLLM is the engine of the speculators layout; SGLang reads the mapping when present.
    (info.problems if info.layout == "speculators" else info.warnings).append(
        text if info.layout == "speculators" else text + " (when vLLM serves it)")


def _small(weights: Weights, name: str) -> np.ndarray | None:
    if name not in weights.meta:
        return None
    return weights.get(name).numpy()


def _check_speculators(info: CheckpointInfo, config: dict) -> None:
    tlc = config["transformer_layer_config"]
    vd, tlc_vocab = info.draft_vocab_size, _int(tlc.get("vocab_size"))
    if tlc_vocab is not None and vd is not None and tlc_vocab == vd and info.vocab_size != vd:
        info.problems.append(f"transformer_layer_config.vocab_size is {tlc_vocab}, the draft "
                             f"vocabulary; vLLM needs the target's ({info.vocab_size})")
    if "norm_before_residual" not in config:
        info.problems.append("norm_before_residual missing: vLLM assumes true; weights trained "
                             "the reference way (SpecForge, EAGLE) need false")
    if tlc.get("model_type") not in ("llama", "qwen3"):
        info.problems.append(f"transformer_layer_config.model_type "
                             f"{tlc.get('model_type')!r}: vLLM accepts llama (qwen3 in newer "
                             f"builds)")
    spec = config.get("speculators_config") or {}
    verifier = spec.get("verifier") or {}
    if not verifier.get("name_or_path"):
        info.problems.append("speculators_config.verifier.name_or_path missing: `vllm serve` "
                             "on the draft does not know which model to load")
    methods = spec.get("proposal_methods") or []
    if not methods or "speculative_tokens" not in methods[0]:
        info.problems.append("speculators_config.proposal_methods[0].speculative_tokens "
                             "missing: vLLM requires it")


def _use_cache_null(config: dict, layout: str) -> bool:
    holders = [config]
    if layout == "speculators" and isinstance(config.get("transformer_layer_config"), dict):
        holders.append(config["transformer_layer_config"])
    return any("use_cache" in h and h["use_cache"] is None for h in holders)


def _check_against_target(info: CheckpointInfo, target: dict, target_dir: Path | None,
                          weights: Weights, explicit: bool) -> None:
    where = "the target" if explicit else f"the target it names ({target_dir})"
    n = _int(target.get("num_hidden_layers"))
    if info.aux_layer_ids and n is not None and max(info.aux_layer_ids) > n:
        info.problems.append(f"aux layer ids {info.aux_layer_ids} reach past {where}'s {n} "
                             f"layers")
    target_max = _int(target.get("max_position_embeddings"))
    if (target_max and info.max_position_embeddings
            and info.max_position_embeddings < target_max):
        info.problems.append(f"max_position_embeddings {info.max_position_embeddings} is shorter "
                             f"than {where}'s {target_max}: acceptance drops past it")
    h_t = _int(target.get("hidden_size"))
    if h_t and (info.target_hidden_size or info.hidden_size) != h_t:
        info.problems.append(f"built for hidden size {info.target_hidden_size or info.hidden_size}"
                             f", {where} has {h_t}")
    v = _int(target.get("vocab_size"))
    if v and info.vocab_size and v != info.vocab_size:
        info.problems.append(f"vocabulary of {info.vocab_size} ids, {where} has {v}")
    if info.has_embedding and target_dir is not None and not info.variant["embed_requires_grad"]:
        mine = weights.get("embed_tokens.weight")
        theirs = target_embedding(target_dir)
        if theirs is not None and (mine.shape != theirs.shape
                                   or not _same_when_rounded(mine, theirs)):
            info.problems.append(f"embed_tokens differs from {where}'s embedding: vLLM keeps a "
                                 f"differing draft embedding (PR #28549) and acceptance drops")


def _same_when_rounded(a, b) -> bool:
    """a == b at the narrower of their dtypes: a checkpoint saved in bf16 beside an fp32 target
    (speculators writes its drafters so) holds the target's embedding rounded to bf16."""
    narrow = a.dtype if a.element_size() <= b.element_size() else b.dtype
    return bool((a.to(narrow) == b.to(narrow)).all())


def target_embedding(target_dir: Path):
    """The target's input embedding as stored (its dtype), or None when it cannot be found."""
    try:
        weights = Weights(target_dir)
    except UserError:
        return None
    for name in ("model.embed_tokens.weight", "model.language_model.embed_tokens.weight",
                 "embed_tokens.weight", "transformer.wte.weight"):
        if name in weights.meta:
            return weights.get(name)
    return None


# Loading ------------------------------------------------------------------------------------
def drafter_config_of(info: CheckpointInfo) -> DrafterConfig:
    """The DrafterConfig a checkpoint describes (layer ids in the boundary convention)."""
    if info.drafter_config is not None:
        return info.drafter_config
    if not info.supported:
        raise UserError(f"{info.path}: {info.problems[0]}")
    if info.aux_layer_ids is None:
        raise UserError(f"{info.path}: no aux layer ids and no target to take the engines' "
                        f"default (2, N//2, N-3) from; give the target")
    layer = _layer_config(info.layout, info.config)
    hidden, heads = info.hidden_size, _int(layer.get("num_attention_heads"))
    if not hidden or not heads or not info.vocab_size or not info.draft_vocab_size:
        raise UserError(f"{info.path}/config.json: missing hidden_size, num_attention_heads or "
                        f"vocab_size")
    theta, scaling = target_rope(layer)
    verifier = (info.config.get("speculators_config") or {}).get("verifier") or {}
    try:
        return _drafter_config(info, layer, hidden, heads, theta, scaling, verifier)
    except ValueError as exc:
        raise UserError(f"{info.path}/config.json: {exc}") from None


def _drafter_config(info: CheckpointInfo, layer: dict, hidden: int, heads: int, theta: float,
                    scaling: dict | None, verifier: dict) -> DrafterConfig:
    return DrafterConfig(
        hidden_size=hidden,
        intermediate_size=_int(layer.get("intermediate_size")) or 0,
        num_attention_heads=heads,
        num_key_value_heads=_int(layer.get("num_key_value_heads")) or heads,
        head_dim=_int(layer.get("head_dim")) or hidden // heads,
        vocab_size=info.vocab_size, draft_vocab_size=info.draft_vocab_size,
        aux_layer_ids=list(info.aux_layer_ids), target_hidden_size=info.target_hidden_size,
        rms_norm_eps=float(layer.get("rms_norm_eps") or 1e-6), rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=info.max_position_embeddings or 2048,
        norm_before_residual=bool(info.norm_before_residual),
        **info.variant,
        hidden_act=layer.get("hidden_act") or "silu",
        target_architectures=list(verifier.get("architectures") or []),
        target_name_or_path=info.verifier or "",
        bos_token_id=layer.get("bos_token_id"), eos_token_id=layer.get("eos_token_id"),
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
    wrong = [f"{n} {list(t.shape)} (expected {list(expected[n].shape)})"
             for n, t in weights.items() if n in expected and t.shape != expected[n].shape]
    if wrong:
        raise UserError(f"{info.path}: tensors do not fit the config: {', '.join(wrong[:4])}")
    missing, unexpected = model.load_state_dict(weights, strict=False)
    # a norm the weights leave out keeps weight 1, as the engines build it
    missing = [m for m in missing if m not in ("embed_tokens.weight", "input_norm.weight")]
    if missing or unexpected:
        raise UserError(f"{info.path}: weights do not fit the {info.layout} layout "
                        f"(missing {missing}, unexpected {unexpected})")
    return model


def _unloadable(problem: str) -> bool:
    """Problems that make the tensors mean something else, as opposed to serving hazards."""
    return problem.startswith(("d2t", "t2d", "lm_head has", "no d2t", "not an EAGLE-3",
                               "input_norm.weight present", "fc_norm", "num_hidden_layers is",
                               "embed_requires_grad is true",
                               "norm_before_fc and fc_norm")) or (
        "aux layer ids but fc takes" in problem)


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


def training_prediction(checkpoint: Path) -> dict | None:
    """The `eval` block train wrote into the drafter's config.json, or an earlier export's."""
    try:
        config = json.loads((checkpoint / "config.json").read_text())
    except (OSError, ValueError):
        config = None
    block = config.get("eagle3kit") if isinstance(config, dict) else None
    for data in (block, read_provenance(checkpoint)):
        evaluation = data.get("eval") if isinstance(data, dict) else None
        if isinstance(evaluation, dict):
            return evaluation
    return None

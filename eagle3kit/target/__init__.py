"""The target model, as every stage sees it.

- `identity`: its config, the one identity record of which target a dataset, run or export
  was made with and the one comparison of two records; the tokenizer's identity likewise.
- `layers`: layer ids parsed, defaulted and checked once for every stage, and the one
  conversion between eagle3kit's boundary convention and SGLang's layer-output one.
- `device`: the device and dtype the target runs in, and the one dtype vocabulary.
- `capture`: the one hooked forward that takes the aux and last states (extract, online
  training). `head`: the final norm and lm_head (`TargetHead`).

This face loads no torch (configs import it); `Capture` and `TargetHead` load their modules,
and torch, on first use.
"""

from eagle3kit._lazy import attribute_loader
from eagle3kit.target.device import (
    DTYPES,
    OLD_SPELLINGS,
    device_problem,
    dtype_name,
    parse_dtype,
    resolve_device,
    resolve_dtype,
    to_device,
    wants_pinned_memory,
)
from eagle3kit.target.identity import (
    COMPARED,
    TargetInfo,
    config_dict,
    config_fingerprint,
    config_hash,
    has_tokenizer,
    identity,
    identity_mismatch,
    location,
    read_config,
    text_config,
    tokenizer_identity,
    tokenizer_mismatch,
    weights_fingerprint,
)
from eagle3kit.target.layers import (
    LAYERS_EXAMPLE,
    MIN_DEFAULT_DEPTH,
    check_layer_ids,
    default_layer_ids,
    from_layer_output,
    parse_layer_ids,
    resolve_layer_ids,
    to_layer_output,
)

__getattr__ = attribute_loader(__name__, {"Capture": "capture", "TargetHead": "head"})

__all__ = [
    "COMPARED",
    "DTYPES",
    "LAYERS_EXAMPLE",
    "MIN_DEFAULT_DEPTH",
    "OLD_SPELLINGS",
    "Capture",
    "TargetHead",
    "TargetInfo",
    "check_layer_ids",
    "config_dict",
    "config_fingerprint",
    "config_hash",
    "default_layer_ids",
    "device_problem",
    "dtype_name",
    "from_layer_output",
    "has_tokenizer",
    "identity",
    "identity_mismatch",
    "location",
    "parse_dtype",
    "parse_layer_ids",
    "read_config",
    "resolve_device",
    "resolve_dtype",
    "resolve_layer_ids",
    "text_config",
    "to_device",
    "to_layer_output",
    "tokenizer_identity",
    "tokenizer_mismatch",
    "wants_pinned_memory",
    "weights_fingerprint",
]

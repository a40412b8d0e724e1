"""The SGLang / SpecForge layout (CHECKPOINTS.md §2): `LlamaForCausalLMEagle3` with the draft
layer's tensors under `midlayer.*` and the aux layer ids in SGLang's layer-output convention.
Its config, weights and the refusals and warnings of writing it, and the tensor names of
reading it (the original EAGLE-3 layout shares them); the reader is the one of every HF-style
layout (`detect.py`).
"""

from __future__ import annotations

from typing import Any

from eagle3kit.checkpoints.base import decoder_fields
from eagle3kit.checkpoints.native import export_tensors
from eagle3kit.errors import UserError
from eagle3kit.target import to_layer_output


def sglang_config(drafter: Any, dtype: str, target: dict | None, warnings: list[str]) -> dict:
    """The SpecForge/SGLang config (CHECKPOINTS.md §2).

    `eagle_config` carries the ids in SGLang's layer-output convention. The same layers also go
    in the top-level `eagle_aux_hidden_state_layer_ids` in the boundary convention: vLLM reads
    that key first when it serves this layout (long form), where it would otherwise ignore the
    nested ids (older builds) or read them one layer early (newer ones); SGLang reads only the
    nested ids.
    """
    ids = list(drafter.aux_layer_ids)
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        **decoder_fields(drafter, target, warnings),
        "draft_vocab_size": drafter.draft_vocab_size,
        "torch_dtype": dtype,
        "norm_before_residual": drafter.norm_before_residual,
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": to_layer_output(ids),
            "use_aux_hidden_state": True,
        },
        "eagle_aux_hidden_state_layer_ids": ids,
    }
    if drafter.target_hidden_size is not None:
        config["target_hidden_size"] = drafter.target_hidden_size
    return config


def sglang_weights(model: Any, dtype: str) -> dict:
    """The tensors of the SGLang layout: the draft layer's under `midlayer.*`, no embedding
    (SGLang always uses the target's)."""
    return {
        ("midlayer." + n.removeprefix("layers.0.") if n.startswith("layers.0.") else n): t
        for n, t in export_tensors(model, dtype).items()
    }


def sglang_to_ours(name: str) -> str:
    return "layers.0." + name.removeprefix("midlayer.") if name.startswith("midlayer.") else name


def sglang_warnings(drafter: Any) -> list[str]:
    from eagle3kit.model.config import VARIANTS, describe_variant

    plain = VARIANTS["eagle3"]
    if any(getattr(drafter, k) != plain[k] for k in drafter.variant):
        raise UserError(
            f"--format sglang: SGLang's LlamaForCausalLMEagle3 builds one plain "
            f"decoder layer over the target's embedding, and this drafter is "
            f"{describe_variant(drafter.variant)}; use --format vllm"
        )
    if min(drafter.aux_layer_ids) < 1:
        raise UserError(
            f"layer id 0 (the embedding output) has no layer-output id: the SGLang "
            f"layout cannot name it ({drafter.aux_layer_ids}); use --format vllm"
        )
    out = []
    if drafter.sliding_window:
        out.append(
            f"sliding window of {drafter.sliding_window}: SGLang takes a draft's window "
            f"from its launch flag, not from config.json; serve with "
            f"--speculative-draft-window-size {drafter.sliding_window - 1} (the card's "
            f"launch line has it), or the drafter attends to every position"
        )
    if drafter.norm_before_residual:
        out.append(
            "norm_before_residual is true: SGLang builds that do not read it take the "
            "residual from the raw hidden input (false) and serve this drafter wrongly"
        )
    if drafter.aux_layer_ids[0] != 2:
        out.append(
            f"SGLang layer-output ids {to_layer_output(drafter.aux_layer_ids)} do not "
            f"start at 1: SGLang before PR #25454 adds 1, newer SGLang reads them as "
            f"boundary ids; check per-position acceptance after serving"
        )
    return out

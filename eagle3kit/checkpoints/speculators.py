"""The speculators / vLLM layout (CHECKPOINTS.md §1): its config and weights as
`eagle3kit export` writes them, and the problems of such a config that vLLM trips on.
The reader is the one of every HF-style layout (`detect.py`).
"""

from __future__ import annotations

from typing import Any

from eagle3kit.checkpoints.base import CheckpointInfo, _int, decoder_fields
from eagle3kit.checkpoints.native import export_tensors

SPECULATORS_FORMAT = "0.9.0"
"""The speculators release whose config format the vLLM export follows (and is tested with)."""


def vllm_config(
    drafter: Any,
    verifier: str,
    architectures: list[str],
    tokens: int,
    dtype: str,
    target: dict | None,
    warnings: list[str],
) -> dict:
    """The speculators config (CHECKPOINTS.md §1), every field explicit."""
    import transformers

    layer = decoder_fields(drafter, target, warnings)
    layer["dtype"] = dtype
    return {
        "architectures": ["Eagle3DraftModel"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_FORMAT,
        "transformers_version": transformers.__version__,
        "dtype": dtype,
        "torch_dtype": dtype,
        "draft_vocab_size": drafter.draft_vocab_size,
        "target_hidden_size": drafter.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(drafter.aux_layer_ids),
        "norm_before_residual": drafter.norm_before_residual,
        "norm_before_fc": drafter.norm_before_fc,
        "fc_norm": drafter.fc_norm,
        "norm_output": drafter.norm_output,
        "embed_requires_grad": drafter.embed_requires_grad,
        "tie_word_embeddings": False,
        "transformer_layer_config": layer,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": tokens,
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            "verifier": {"name_or_path": verifier, "architectures": architectures},
        },
    }


def speculators_weights(model: Any, dtype: str, embedding: Any = None) -> dict:
    """The tensors of the speculators layout: eagle3kit's names; `embedding`, the target's,
    added bit-exact in its own dtype (unless the drafter trained its own)."""
    tensors = export_tensors(model, dtype)
    if embedding is not None and not model.config.embed_requires_grad:
        tensors["embed_tokens.weight"] = embedding.detach().contiguous()  # bit-exact, its dtype
    return tensors


# Problems ----------------------------------------------------------------------------------------
def check_speculators(info: CheckpointInfo, config: dict) -> None:
    tlc = config["transformer_layer_config"]
    vd, tlc_vocab = info.draft_vocab_size, _int(tlc.get("vocab_size"))
    if tlc_vocab is not None and vd is not None and tlc_vocab == vd and info.vocab_size != vd:
        info.problems.append(
            f"transformer_layer_config.vocab_size is {tlc_vocab}, the draft "
            f"vocabulary; vLLM needs the target's ({info.vocab_size})"
        )
    if "norm_before_residual" not in config:
        info.problems.append(
            "norm_before_residual missing: vLLM assumes true; weights trained "
            "the reference way (SpecForge, EAGLE) need false"
        )
    if tlc.get("model_type") not in ("llama", "qwen3"):
        info.problems.append(
            f"transformer_layer_config.model_type "
            f"{tlc.get('model_type')!r}: vLLM accepts llama (qwen3 in newer "
            f"builds)"
        )
    spec = config.get("speculators_config") or {}
    verifier = spec.get("verifier") or {}
    if not verifier.get("name_or_path"):
        info.problems.append(
            "speculators_config.verifier.name_or_path missing: `vllm serve` "
            "on the draft does not know which model to load"
        )
    methods = spec.get("proposal_methods") or []
    if not methods or "speculative_tokens" not in methods[0]:
        info.problems.append(
            "speculators_config.proposal_methods[0].speculative_tokens missing: vLLM requires it"
        )


def embedding_warning(info: CheckpointInfo) -> str | None:
    """A speculators-layout checkpoint without `embed_tokens` serves correctly (vLLM takes
    the target's embedding) but does not load as the same drafter in speculators itself."""
    if info.layout != "speculators" or info.has_embedding:
        return None
    return (
        "no embed_tokens: vLLM takes the target's embedding, but speculators' own "
        "Eagle3DraftModel.from_pretrained then starts from a random one, so the drafter "
        "evaluated or trained further with speculators is not this one; `eagle3kit export "
        "--with-embedding` adds the target's embedding"
    )

"""The drafter's shape, derived from the target's config (EAGLE3.md §1.2)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from eagle3kit.target import config_fingerprint, default_layer_ids

__all__ = [
    "VARIANTS",
    "VARIANT_FIELDS",
    "DrafterConfig",
    "config_fingerprint",
    "default_layer_ids",
    "describe_variant",
    "rope_of",
]

VARIANT_FIELDS = (
    "norm_before_fc",
    "fc_norm",
    "norm_output",
    "num_hidden_layers",
    "embed_requires_grad",
)
"""The DrafterConfig fields that change the drafter's function beyond norm_before_residual,
named as speculators' config and vLLM's llama_eagle3.py read them."""

VARIANTS = {
    "eagle3": {
        "norm_before_residual": False,
        "norm_before_fc": False,
        "fc_norm": False,
        "norm_output": False,
        "num_hidden_layers": 1,
        "embed_requires_grad": False,
    },
    "speculators": {
        "norm_before_residual": True,
        "norm_before_fc": True,
        "fc_norm": False,
        "norm_output": True,
        "num_hidden_layers": 1,
        "embed_requires_grad": False,
    },
    "eagle3.1": {
        "norm_before_residual": False,
        "norm_before_fc": False,
        "fc_norm": True,
        "norm_output": True,
        "num_hidden_layers": 1,
        "embed_requires_grad": False,
    },
}
"""Named layouts for `train --variant`: eagle3 is the reference EAGLE-3 drafter (eagle3kit's
default), speculators the one speculators 0.9.0's trainer builds with its CLI defaults,
eagle3.1 the EAGLE-3.1 paper's per-state norms and post-norm feedback."""


def describe_variant(fields: dict) -> str:
    """'norm_before_fc, norm_output, 2 decoder layers, own embedding'; the plain EAGLE-3
    drafter says so."""
    parts = [name for name in ("norm_before_fc", "fc_norm", "norm_output") if fields.get(name)]
    layers = fields.get("num_hidden_layers") or 1
    if layers > 1:
        parts.append(f"{layers} decoder layers")
    if fields.get("embed_requires_grad"):
        parts.append("own embedding")
    return ", ".join(parts) or "plain EAGLE-3 (1 decoder layer, the target's embedding)"


def rope_of(target_config: Any) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling) of a transformers config, 4.x or 5.x style.

    The scaling names its kind `rope_type` only: transformers 5 keeps a 4.x config's `type`
    beside the `rope_type` it adds, and Kimi-K2's config.json says `type`, so the same YaRN
    read from a config.json and from its loaded config would otherwise differ.
    """
    params = getattr(target_config, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        scaling = named_rope_kind({k: v for k, v in params.items() if k != "rope_theta"})
        plain = scaling.get("rope_type", "default") == "default"
        return float(params["rope_theta"]), None if plain else scaling
    theta = getattr(target_config, "rope_theta", None) or 10000.0
    legacy = getattr(target_config, "rope_scaling", None)
    return float(theta), named_rope_kind(legacy) if isinstance(legacy, dict) else legacy


def named_rope_kind(scaling: dict) -> dict:
    """A rope scaling with its kind under `rope_type` only (see rope_of)."""
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    return {
        **{k: v for k, v in scaling.items() if k not in ("type", "rope_type")},
        "rope_type": kind,
    }


@dataclass
class DrafterConfig:
    """Everything needed to build an EAGLE-3 drafter and describe it to a serving engine."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    """The target's vocabulary V (the embedding's rows)."""
    draft_vocab_size: int
    """Vd: the rows of the drafter's lm_head."""
    aux_layer_ids: list[int]
    """Boundary-convention ids of the three target states the drafter reads."""
    target_hidden_size: int | None = None
    """The target's hidden size when it differs from the drafter's."""
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 2048
    sliding_window: int | None = None
    """Keys each draft position attends to, itself included (the transformers and vLLM
    convention: position p sees p-W+1..p); None: every earlier position."""
    norm_before_residual: bool = False
    """Residual taken after hidden_norm (speculators) or from the raw hidden input (reference)."""
    norm_before_fc: bool = False
    """One RMSNorm (`input_norm`) over the concatenated aux states before `fc` (EAGLE-3.1,
    gpt-oss style; speculators' and vLLM's name)."""
    fc_norm: bool = False
    """One RMSNorm per aux state (`fc_norm.i`) before `fc`; excludes norm_before_fc."""
    norm_output: bool = False
    """The next step's hidden input is the final norm's output, not its input (EAGLE-3.1);
    the logits then read it without a second norm."""
    num_hidden_layers: int = 1
    """Decoder layers; the first reads [embedding, hidden] (2H), the others H."""
    embed_requires_grad: bool = False
    """The drafter trains its own input embedding (from the target's) and every checkpoint
    stores it; False: it shares the target's, which loaders take from the target."""
    hidden_act: str = "silu"
    target_model_type: str = "llama"
    target_architectures: list[str] = field(default_factory=list)
    target_name_or_path: str = ""
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        if self.norm_before_fc and self.fc_norm:
            raise ValueError(
                "norm_before_fc and fc_norm exclude each other (both normalise "
                "the aux states before fc)"
            )
        if self.sliding_window is not None and (
            isinstance(self.sliding_window, bool)
            or not isinstance(self.sliding_window, int)
            or self.sliding_window < 1
        ):
            raise ValueError(
                f"sliding_window must be an integer >= 1 or null (got {self.sliding_window!r})"
            )
        if not isinstance(self.num_hidden_layers, int) or self.num_hidden_layers < 1:
            raise ValueError(
                f"num_hidden_layers must be an integer >= 1 (got {self.num_hidden_layers!r})"
            )

    @property
    def aux_width(self) -> int:
        return len(self.aux_layer_ids) * (self.target_hidden_size or self.hidden_size)

    @classmethod
    def from_target(
        cls,
        target_config: Any,
        *,
        draft_vocab_size: int | None = None,
        aux_layer_ids: list[int] | None = None,
        target_name_or_path: str = "",
    ) -> DrafterConfig:
        """The drafter a target gets: its width, heads and RoPE, one decoder layer."""
        theta, scaling = rope_of(target_config)
        hidden = target_config.hidden_size
        heads = target_config.num_attention_heads
        vocab = target_config.vocab_size
        return cls(
            hidden_size=hidden,
            intermediate_size=target_config.intermediate_size,
            num_attention_heads=heads,
            num_key_value_heads=getattr(target_config, "num_key_value_heads", None) or heads,
            head_dim=getattr(target_config, "head_dim", None) or hidden // heads,
            vocab_size=vocab,
            draft_vocab_size=min(draft_vocab_size or vocab, vocab),
            aux_layer_ids=list(aux_layer_ids or default_layer_ids(target_config.num_hidden_layers)),
            rms_norm_eps=getattr(target_config, "rms_norm_eps", 1e-6),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=target_config.max_position_embeddings,
            hidden_act=getattr(target_config, "hidden_act", "silu"),
            target_model_type=target_config.model_type,
            target_architectures=list(getattr(target_config, "architectures", None) or []),
            target_name_or_path=target_name_or_path,
            bos_token_id=getattr(target_config, "bos_token_id", None),
            eos_token_id=getattr(target_config, "eos_token_id", None),
            pad_token_id=getattr(target_config, "pad_token_id", None),
        )

    @property
    def variant(self) -> dict:
        return {name: getattr(self, name) for name in VARIANT_FIELDS}

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> DrafterConfig:
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in known})

"""The EAGLE-3 draft model, its configuration and its draft vocabulary.

The names below load on first use: `eagle3kit.model.acceptance` (what `bench server` needs)
and the config helpers must not pay for importing torch, which the drafter module does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from eagle3kit._lazy import attribute_loader

_HOMES = {
    "DrafterConfig": "config",
    "config_fingerprint": "config",
    "default_layer_ids": "config",
    "rope_of": "config",
    "VARIANTS": "config",
    "VARIANT_FIELDS": "config",
    "describe_variant": "config",
    "DraftCache": "drafter",
    "Eagle3Drafter": "drafter",
    "TTTState": "drafter",
    "DraftVocab": "vocab",
    "build_vocab": "vocab",
    "count_tokens": "vocab",
    "vocab_problems": "vocab",
}

__all__ = [
    "VARIANTS",
    "VARIANT_FIELDS",
    "DraftCache",
    "DraftVocab",
    "DrafterConfig",
    "Eagle3Drafter",
    "TTTState",
    "build_vocab",
    "config_fingerprint",
    "count_tokens",
    "default_layer_ids",
    "describe_variant",
    "rope_of",
    "vocab_problems",
]

if TYPE_CHECKING:
    from eagle3kit.model.config import (
        VARIANT_FIELDS,
        VARIANTS,
        DrafterConfig,
        config_fingerprint,
        default_layer_ids,
        describe_variant,
        rope_of,
    )
    from eagle3kit.model.drafter import DraftCache, Eagle3Drafter, TTTState
    from eagle3kit.model.vocab import DraftVocab, build_vocab, count_tokens, vocab_problems


__getattr__ = attribute_loader(__name__, _HOMES)

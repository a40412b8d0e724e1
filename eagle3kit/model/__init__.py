"""The EAGLE-3 draft model, its configuration and its draft vocabulary."""

from eagle3kit.model.config import DrafterConfig, config_fingerprint, default_layer_ids, rope_of
from eagle3kit.model.drafter import DraftCache, Eagle3Drafter, TTTState
from eagle3kit.model.vocab import DraftVocab, build_vocab, count_tokens, vocab_problems

__all__ = [
    "DraftCache",
    "DraftVocab",
    "DrafterConfig",
    "Eagle3Drafter",
    "TTTState",
    "build_vocab",
    "config_fingerprint",
    "count_tokens",
    "default_layer_ids",
    "rope_of",
    "vocab_problems",
]

"""A target and drafter small enough to sample from by the thousand, whose drafts are both
kept and rejected at temperature 1: the sampled-decoding tests of bench accept
(test_bench.py) and the data-path prediction of train (test_train_datapath.py). Not a test
module."""

from __future__ import annotations

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from eagle3kit.model import DrafterConfig, Eagle3Drafter, build_vocab

AUX_LAYERS = [1, 2, 3]
"""The drafter's aux ids over the 3-layer target (id 3, N: the last layer's pre-norm output)."""


def build_small_pair() -> tuple[LlamaForCausalLM, Eagle3Drafter]:
    """A 3-layer target over 6 tokens with peaked distributions (aux ids 0..3: id N is the
    last layer's pre-norm output), and a random drafter over 4 of the 6 tokens."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=6,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
        initializer_range=0.6,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    drafter = Eagle3Drafter(
        DrafterConfig.from_target(config, draft_vocab_size=4, aux_layer_ids=AUX_LAYERS)
    )
    vocab = build_vocab(np.array([5, 0, 4, 3, 9, 1]), 4)
    drafter.set_vocab(torch.from_numpy(vocab.d2t), torch.from_numpy(vocab.t2d))
    drafter.load_target_embedding(model.get_input_embeddings().weight)
    for p in drafter.trainable_parameters():
        torch.nn.init.normal_(p, std=0.5)
    return model, drafter.eval()

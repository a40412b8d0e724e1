"""A small drafter with its target head and a batch for it, the unroll they are run with:
for the TTT loss tests and the sliding-window ones. Not a test module."""

from __future__ import annotations

import torch
from transformers import LlamaConfig

from eagle3kit.model import DrafterConfig, Eagle3Drafter, build_vocab
from eagle3kit.train.target import TargetBatch, TargetHead

VOCAB, HIDDEN, DRAFT = 97, 32, 50
STEPS = 4
DECAY = 0.8


def drafter_and_head(seed: int = 0) -> tuple[Eagle3Drafter, TargetHead]:
    target = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    gen = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, 50, (VOCAB,), generator=gen).numpy()
    vocab = build_vocab(counts, DRAFT)
    drafter = Eagle3Drafter(DrafterConfig.from_target(target, draft_vocab_size=DRAFT))
    with torch.no_grad():
        for p in drafter.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    drafter.set_vocab(torch.from_numpy(vocab.d2t), torch.from_numpy(vocab.t2d))
    head = TargetHead(
        drafter.embed_tokens.weight.detach().clone(),
        torch.nn.Identity(),
        torch.randn(VOCAB, HIDDEN, generator=gen),
    )
    return drafter, head


def make_batch(head: TargetHead, lengths: list[int], seed: int = 1) -> TargetBatch:
    """Right-padded rows of random states; token ids biased toward the target's greedy
    ones, so some chains run long in the evaluation."""
    gen = torch.Generator().manual_seed(seed)
    t = max(lengths)
    n = torch.tensor(lengths)
    real = torch.arange(t)[None] < n[:, None]
    normed = torch.randn(len(lengths), t, HIDDEN, generator=gen) * real[..., None]
    argmax = head.argmax(normed)
    ids = torch.randint(0, VOCAB, (len(lengths), t), generator=gen)
    ids[:, 1:] = torch.where(
        torch.rand(len(lengths), t - 1, generator=gen) < 0.7, argmax[:, :-1], ids[:, 1:]
    )
    ids = ids * real
    mask = (torch.rand(len(lengths), t, generator=gen) < 0.8) & real
    mask[:, :3] = False  # a prompt
    aux = torch.randn(len(lengths), t, 3 * HIDDEN, generator=gen) * real[..., None]
    return TargetBatch(ids, mask, n, aux, normed, argmax)

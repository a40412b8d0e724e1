"""train's held-out prediction at a temperature (--eval-temperature, --eval-verify): the
expected acceptance of each draft from the target's distribution over its whole vocabulary
and the drafter's, chained over every chain start; at a vanishing temperature it is the
greedy verdicts' count."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from eagle3kit.model import DrafterConfig, Eagle3Drafter, TTTState, build_vocab
from eagle3kit.model.verification import Rule
from eagle3kit.train.heldout import (
    Sampled,
    chain_starts,
    conditional_counts,
    evaluate,
    position_verdicts,
    predicted_acceptance_length,
)
from eagle3kit.train.target import TargetBatch

pytestmark = pytest.mark.usefixtures("one_torch_thread")
VOCAB, HIDDEN, DRAFT_VOCAB = 40, 16, 24


@pytest.fixture(scope="module")
def setting():
    """A random drafter over 24 of 40 ids and a batch of two rows whose target is a random
    lm_head over random normed states (the data follows the target's argmax, as greedy data
    does)."""
    from transformers import LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=32,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    drafter = Eagle3Drafter(DrafterConfig.from_target(config, draft_vocab_size=DRAFT_VOCAB))
    vocab = build_vocab(np.random.default_rng(0).integers(1, 50, VOCAB), DRAFT_VOCAB)
    drafter.set_vocab(torch.from_numpy(vocab.d2t), torch.from_numpy(vocab.t2d))
    drafter.load_target_embedding(torch.randn(VOCAB, HIDDEN))
    lm_head = torch.randn(VOCAB, HIDDEN) * 0.8
    b, t = 2, 12
    normed = torch.randn(b, t, HIDDEN)
    argmax = (normed @ lm_head.T).argmax(-1)
    ids = torch.cat([torch.randint(0, VOCAB, (b, 1)), argmax[:, :-1]], dim=1)
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[:, :3] = False
    batch = TargetBatch(
        ids, mask, torch.tensor([t, t - 2]), torch.randn(b, t, 3 * HIDDEN), normed, argmax
    )
    return drafter.eval(), batch, lm_head


@pytest.mark.parametrize("rule", ["onehot", "probabilistic", "sglang"])
def test_the_first_drafts_chance_is_the_rule_on_both_whole_distributions(setting, rule):
    drafter, batch, lm_head = setting
    temperature = 0.8
    chosen = Rule(rule, 0.3, 0.6) if rule == "sglang" else Rule(rule)
    chances, observable = position_verdicts(
        drafter, batch, 2, Sampled(chosen, temperature, lm_head)
    )
    length = batch.ids.shape[1] - 1
    with torch.no_grad():  # step 0 by hand: the drafter at t proposes token t+2
        hidden = drafter.ttt_step(
            drafter.project(batch.aux[:, :length]),
            batch.ids[:, 1:],
            torch.arange(length)[None].expand(2, -1),
            TTTState(),
        )
        q = torch.softmax(drafter.logits(hidden) / temperature, -1)
        p_full = torch.softmax(batch.normed[:, 1:] @ lm_head.T / temperature, -1)
    p = p_full[..., drafter.draft_to_target(torch.arange(DRAFT_VOCAB))]
    assert p.sum(-1).min() < 0.5  # normalised over all 40 ids, not over the draft 24
    expected = chosen.expected(p, q)
    assert torch.allclose(chances[..., 0].float(), expected.float(), atol=1e-5)
    assert chances.dtype.is_floating_point and observable.dtype == torch.bool


def test_at_a_vanishing_temperature_the_prediction_is_the_greedy_count(setting):
    drafter, batch, lm_head = setting
    sampled = evaluate(drafter, [batch], k=3, sampled=Sampled(Rule("onehot"), 1e-4, lm_head))
    accepted, observable = position_verdicts(drafter, batch, 3)
    start = chain_starts(batch)
    acc, tried = conditional_counts(accepted[start], observable[start])
    rates = (acc / tried.clamp_min(1)).tolist()
    assert sampled.per_position == pytest.approx(rates, abs=1e-4)
    assert sampled.predicted_acceptance_length == pytest.approx(
        predicted_acceptance_length(rates), abs=1e-4
    )
    assert sampled.temperature == 1e-4 and sampled.extra["verify"] == "onehot"
    assert sampled.chains == int(start.sum())


def test_probabilistic_keeps_at_least_what_onehot_keeps_of_a_flat_target(setting):
    """Σ min(p, q) >= p(argmax q) whenever q's argmax holds at least p's mass there, and a
    flat target at temperature 5 keeps little of an argmax draft."""
    drafter, batch, lm_head = setting
    hot = {
        rule: evaluate(drafter, [batch], k=2, sampled=Sampled(Rule(rule), 5.0, lm_head))
        for rule in ("onehot", "probabilistic")
    }
    assert hot["onehot"].per_position[0] < 0.2
    assert hot["probabilistic"].per_position[0] > hot["onehot"].per_position[0]

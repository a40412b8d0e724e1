"""Verification at temperature > 0 as the engines run it (eagle3kit.model.verification):
each rule's expected acceptance against its closed form on fixed distributions, sampled
rounds converging to it inside their own interval, the target's distribution built as vLLM
builds it (temperature, then top-k, then top-p), and the flags that choose them."""

from __future__ import annotations

import math

import pytest
import torch

from eagle3kit.bench import decode
from eagle3kit.bench.stats import length_interval
from eagle3kit.errors import UserError
from eagle3kit.model.verification import Rule, target_probs

P = torch.tensor(
    [[0.5, 0.3, 0.1, 0.1, 0.0], [0.1, 0.1, 0.2, 0.3, 0.3], [0.2, 0.2, 0.2, 0.2, 0.2]],
    dtype=torch.float64,
)
"""The target's distribution at draft positions 1 and 2, and after them (the bonus)."""
Q = torch.tensor([[0.1, 0.2, 0.4, 0.2, 0.1], [0.05, 0.05, 0.1, 0.7, 0.1]], dtype=torch.float64)
"""The drafter's at positions 1 and 2: its argmax is 2, then 3."""
EXACT = {
    # p(argmax q): p1(2), p2(3)
    "onehot": (0.1, 0.3),
    # Σ min(p, q)
    "probabilistic": (0.1 + 0.2 + 0.1 + 0.1 + 0.0, 0.05 + 0.05 + 0.1 + 0.3 + 0.1),
    # SGLang, threshold_single 0.25, threshold_acc 0.5: min(1, 0.1/0.5); p2(3) = 0.3 >= 0.25
    "sglang": (0.2, 1.0),
}
THRESHOLDS = {"sglang": (0.25, 0.5)}


def rule_of(name: str) -> Rule:
    return Rule(name, *THRESHOLDS.get(name, (1.0, 1.0)))


@pytest.mark.parametrize("name", list(EXACT))
def test_expected_acceptance_is_each_rules_closed_form(name: str) -> None:
    got = rule_of(name).expected(P[:2], Q)
    assert got.tolist() == pytest.approx(EXACT[name], abs=1e-12)


def test_sglang_at_its_default_thresholds_is_vllms_onehot() -> None:
    assert Rule("sglang").expected(P[:2], Q).tolist() == Rule("onehot").expected(P[:2], Q).tolist()


def test_only_a_match_rule_lets_the_verdicts_be_read_off_sampled_data() -> None:
    """train's data-path prediction: a draft is kept exactly when the target's sample equals
    it under onehot and SGLang's defaults; not when drafts are drawn, nor when SGLang's
    thresholds keep a draft the target would not have sampled."""
    assert Rule("onehot").keeps_matching_samples and Rule("sglang").keeps_matching_samples
    assert not Rule("probabilistic").keeps_matching_samples
    assert not Rule("sglang", 0.9, 1.0).keeps_matching_samples
    assert not Rule("sglang", 1.0, 0.5).keeps_matching_samples


def sampled_rounds(rule: Rule, rounds: int, seed: int = 0) -> list[int]:
    """Accepted drafts of `rounds` rounds of k = 2 with the fixed P and Q, through the
    verification bench accept runs (drafts drawn or taken as argmax as the rule does)."""
    logits = P.float().clamp_min(1e-30).log()
    sampler = decode.Sampler(1.0, torch.Generator().manual_seed(seed), rule)
    q = Q.float()
    out = []
    for _ in range(rounds):
        if rule.samples_drafts:
            drafts, dists = [sampler.draw(q[0]), sampler.draw(q[1])], [q[0], q[1]]
        else:
            drafts, dists = [int(q[0].argmax()), int(q[1].argmax())], [None, None]
        accepted, _ = decode.verify_sampled(logits, drafts, dists, sampler)
        out.append(accepted)
    return out


@pytest.mark.parametrize("name", list(EXACT))
def test_sampled_rounds_converge_to_the_closed_form_within_their_interval(name: str) -> None:
    a1, a2 = EXACT[name]
    expected_length = 1 + a1 + a1 * a2  # the positions' distributions are fixed: independent
    # 40 "generations" of 100 rounds: the interval's by-generation form has something to use
    rounds = sampled_rounds(rule_of(name), 4000)
    interval = length_interval([rounds[i : i + 100] for i in range(0, 4000, 100)])
    assert interval is not None and interval.rounds == 4000 and interval.generations == 40
    assert interval.low <= expected_length <= interval.high, (interval, expected_length)
    # ... and the interval is narrow enough to tell the rules apart here
    assert interval.high - interval.low < 0.1


def test_the_rules_keep_the_target_distribution_after_a_rejection() -> None:
    """onehot and probabilistic emit p-distributed first tokens; the residuals are p with the
    draft removed, and max(0, p - q) renormalised."""
    p, q = P[0].float(), Q[0].float()
    assert Rule("onehot").residual(p, None, 2).tolist() == pytest.approx(
        [0.5 / 0.9, 0.3 / 0.9, 0.0, 0.1 / 0.9, 0.0]
    )
    assert Rule("probabilistic").residual(p, q, 2).tolist() == pytest.approx(
        [0.4 / 0.5, 0.1 / 0.5, 0.0, 0.0, 0.0]
    )
    for name in ("onehot", "probabilistic"):
        counts = torch.zeros(5)
        rule = Rule(name)
        sampler = decode.Sampler(1.0, torch.Generator().manual_seed(1), rule)
        logits = P.float().clamp_min(1e-30).log()
        for _ in range(4000):
            draft = sampler.draw(q) if rule.samples_drafts else int(q.argmax())
            accepted, bonus = decode.verify_sampled(
                logits[:1].repeat(2, 1), [draft], [q if rule.samples_drafts else None], sampler
            )
            counts[draft if accepted else bonus] += 1
        freq = counts / counts.sum()
        assert freq.tolist() == pytest.approx(p.tolist(), abs=0.03), name


def test_the_target_distribution_is_tempered_then_top_k_then_top_p() -> None:
    logits = torch.tensor([0.5, 0.3, 0.2]).log()
    # top-p 0.6 at temperature 1 keeps two tokens ...
    assert target_probs(logits, 1.0, top_p=0.6).tolist() == pytest.approx([0.625, 0.375, 0.0])
    # ... and at 0.5 one: the temperature comes first
    assert target_probs(logits, 0.5, top_p=0.6).tolist() == pytest.approx([1.0, 0.0, 0.0])
    # top-k 2 first leaves [0.625, 0.375], whose top-p 0.6 is the first alone (top-p first
    # would keep two)
    assert target_probs(logits, 1.0, top_k=2, top_p=0.6).tolist() == pytest.approx([1.0, 0.0, 0.0])
    assert target_probs(logits, 1.0, top_k=2).tolist() == pytest.approx([0.625, 0.375, 0.0])
    assert target_probs(logits, 2.0).tolist() == pytest.approx(
        (
            torch.tensor([0.5, 0.3, 0.2]) ** 0.5 / (torch.tensor([0.5, 0.3, 0.2]) ** 0.5).sum()
        ).tolist()
    )


def test_the_interval_rests_on_the_generations_when_their_rounds_are_alike() -> None:
    """Rounds correlated within a generation: the per-round error would be too small."""
    generations = [[3] * 50, [0] * 50, [3] * 50, [0] * 50]
    interval = length_interval(generations)
    assert interval is not None
    per_round = math.sqrt(sum((r - 1.5) ** 2 for g in generations for r in g) / 199 / 200)
    assert interval.standard_error > 1.5 * per_round
    assert interval.low < 2.5 < interval.high
    assert length_interval([[], []]) is None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"verify": "greedy"},
            "--verify must be one of onehot, probabilistic, sglang (got greedy)",
        ),
        ({"top_p": 0.0}, "--top-p must be in (0, 1] (got 0.0)"),
        ({"top_k": 0}, "--top-k must be -1 (off) or at least 1 (got 0)"),
        (
            {"speculative_accept_threshold_acc": 0.5},
            "--speculative-accept-threshold-acc is SGLang's: give it with --verify sglang",
        ),
        (
            {"verify": "sglang", "speculative_accept_threshold_single": 1.5},
            "--speculative-accept-threshold-single must be in (0, 1] (got 1.5)",
        ),
    ],
)
def test_bad_sampling_options_name_their_flag(options: dict, message: str) -> None:
    from types import SimpleNamespace

    from eagle3kit.bench.accept import check_sampling

    cfg = SimpleNamespace(
        **(
            {
                "verify": "onehot",
                "top_p": 1.0,
                "top_k": -1,
                "speculative_accept_threshold_single": 1.0,
                "speculative_accept_threshold_acc": 1.0,
            }
            | options
        )
    )
    with pytest.raises(UserError) as caught:
        check_sampling(cfg)
    assert str(caught.value) == message

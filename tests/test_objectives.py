"""train's objectives (--loss, --auf) in the fused loss give what plain autograd gives.

The fused loss writes each objective's gradient with respect to the logits by hand
(eagle3kit/train/soft_ce.py). The reference here writes only the loss, with torch ops, and
lets autograd differentiate it: every objective, with and without accept-until-fail, must
give the same loss and the same gradients (fp32, 1e-5), with blocks small enough that the
block loop runs several times.
"""

from __future__ import annotations

import pytest
import torch

from eagle3kit.train import soft_ce
from eagle3kit.train.losses import LK_ETA, STEP_LOSSES
from eagle3kit.train.soft_ce import Step, soft_cross_entropy

pytestmark = pytest.mark.usefixtures("one_torch_thread")

B, T, H, V, STEPS = 3, 12, 16, 24, 3


def world(seed: int = 0):
    """lm_head W, the target's draft-vocabulary distribution (sharp, so the drafter's top
    token often matches and chains run on), per-step drafter states and loss masks."""
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(V, H, generator=gen) * 0.5
    probs = torch.softmax(torch.randn(B, T, V, generator=gen) * 3, dim=-1) * 0.9  # 10% outside
    normed = []
    for k in range(STEPS):
        # States that lean toward the target's choice: some drafts hit, some miss.
        want = weight[probs[:, 1 + k :].argmax(-1)]
        n = T - 1 - k
        state = want[:, :n] + torch.randn(B, n, H, generator=gen) * 1.5
        normed.append(state.requires_grad_())
    masks = [torch.rand(B, T - 1 - k, generator=gen) < 0.85 for k in range(STEPS)]
    return weight.requires_grad_(), probs, normed, masks


def reference(weight, probs, normed, masks, loss_name: str, auf: str, decay: float = 0.8):
    best = probs.argmax(-1)
    chain = torch.ones(B, T - 1)
    total = torch.zeros(())
    for k in range(STEPS):
        n = normed[k].shape[1]
        p = probs[:, 1 + k : 1 + k + n]
        logits = normed[k] @ weight.T
        logq = torch.log_softmax(logits, -1)
        q = logq.exp()
        alpha = torch.minimum(p, q).sum(-1)
        ce = -(p * logq).sum(-1)
        tv = p.sum(-1) - alpha
        if loss_name == "soft-ce":
            loss = ce
        elif loss_name == "tv":
            loss = tv
        elif loss_name == "nla":
            loss = -alpha.clamp_min(1e-6).log()
        else:
            lam = torch.exp(-LK_ETA * alpha.detach())
            loss = lam * ce + (1 - lam) * tv
        mask = masks[k].float()
        weights = mask * (chain[:, :n] if auf != "off" else 1)
        coef = decay**k / max(1, int(masks[k].sum()))
        total = total + coef * (loss * weights).sum()
        if auf != "off":
            with torch.no_grad():
                top = logq.argmax(-1)
                if auf == "greedy":
                    kept = (top == best[:, 1 + k : 1 + k + n]).float()
                elif auf == "onehot":
                    kept = p.gather(-1, top[..., None])[..., 0]
                else:
                    kept = alpha
                chain[:, :n] = chain[:, :n] * kept * mask
    return total


def fused(weight, probs, normed, masks, loss_name: str, auf: str, decay: float = 0.8):
    best = probs.argmax(-1)
    steps = [
        Step(k, normed[k], masks[k], torch.tensor(decay**k / max(1, int(masks[k].sum()))))
        for k in range(STEPS)
    ]
    return soft_cross_entropy(weight, probs, best, steps, STEP_LOSSES[loss_name], auf)[0]


@pytest.mark.parametrize("auf", ["off", "greedy", "onehot", "probabilistic"])
@pytest.mark.parametrize("loss", ["soft-ce", "tv", "nla", "lk"])
def test_fused_objective_matches_autograd(loss, auf, monkeypatch):
    monkeypatch.setattr(soft_ce, "BLOCK_BYTES", 4 * V * B * 4)  # blocks of 4 positions
    weight, probs, normed, masks = world()
    want = reference(weight, probs, normed, masks, loss, auf)
    want_grads = torch.autograd.grad(want, [weight, *normed])
    got = fused(weight, probs, normed, masks, loss, auf)
    got_grads = torch.autograd.grad(got, [weight, *normed])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)


def test_accept_until_fail_drops_steps_after_a_miss():
    """Greedy AUF: where step 0's draft misses, step 1 and 2 at that chain start carry no
    gradient; where it hits, they do (and without AUF every masked position does)."""
    weight, probs, normed, masks = world(seed=3)
    masks = [torch.ones_like(m) for m in masks]
    best = probs.argmax(-1)
    with torch.no_grad():
        missed = (normed[0] @ weight.T).argmax(-1) != best[:, 1:T]
    assert missed.any() and (~missed).any()
    got = fused(weight, probs, normed, masks, "soft-ce", "greedy")
    grad_step1 = torch.autograd.grad(got, normed[1])[0]
    n1 = normed[1].shape[1]
    dropped = missed[:, :n1]
    assert grad_step1[dropped].abs().max() == 0
    assert grad_step1[~dropped].abs().sum(-1).gt(0).all()
    plain = fused(weight, probs, normed, masks, "soft-ce", "off")
    assert torch.autograd.grad(plain, normed[1])[0].abs().sum(-1).gt(0).all()


def test_accept_until_fail_weighs_the_total_only():
    """The logged per-step sums are the step loss's, unweighted: AUF changes the total."""
    weight, probs, normed, masks = world(seed=5)
    best = probs.argmax(-1)
    outs = []
    for auf in ("off", "probabilistic"):
        steps = [Step(k, normed[k], masks[k], torch.tensor(1.0)) for k in range(STEPS)]
        outs.append(soft_cross_entropy(weight, probs, best, steps, STEP_LOSSES["tv"], auf))
    torch.testing.assert_close(outs[0][1], outs[1][1])
    torch.testing.assert_close(outs[0][2], outs[1][2])
    assert outs[1][0] < outs[0][0]

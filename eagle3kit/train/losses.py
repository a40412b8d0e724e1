"""The loss of one training-time-test step, the seam where a loss is chosen (--loss).

A step loss takes the drafter's logits and the target's distribution at a block of
positions, both over the draft vocabulary, and returns the loss at each position and, when
asked, its gradient with respect to the logits. soft_ce.py walks the steps and their
positions in blocks, computing each block's logits from the drafter's head input, and
weighs and sums what the step loss returns (TTTLoss in ttt.py: decay^k over the global
batch's positions); so a new loss is one function here, named in `STEP_LOSSES` and in
option_values.LOSSES.
"""

from __future__ import annotations

from typing import Protocol

import torch


class StepLoss(Protocol):
    def __call__(
        self, logits: torch.Tensor, probs: torch.Tensor, want_grad: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(loss [B, n] fp32, d loss / d logits [B, n, V] fp32 or None without `want_grad`)
        from the drafter's `logits` [B, n, V] fp32 and the target's `probs` [B, n, V] at the
        same positions. The gradient may be written into `logits`' memory."""
        ...


def soft_cross_entropy(
    logits: torch.Tensor, probs: torch.Tensor, want_grad: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """−Σ_v p_v · log q_v, q = softmax(logits), against the target's whole distribution p;
    its gradient, softmax · Σp − p, is known as soon as the logits are."""
    logq = torch.log_softmax(logits, dim=-1)
    loss = -(probs * logq).sum(-1)
    if not want_grad:
        return loss, None
    return loss, logq.exp_().mul_(probs.sum(-1, keepdim=True)).sub_(probs)


LK_ETA = 3.0
"""η of the LK hybrid's λ = exp(−η·α): 3, as arXiv 2602.23881 and speculators use."""
_ALPHA_FLOOR = 1e-6
"""Floor of α under −log α: a draft with no overlap still gets a finite, large gradient."""


def _acceptance(
    logits: torch.Tensor, probs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, α = Σ_v min(p_v, q_v) [B, n], dα/dlogits [B, n, V]): α is the chance the engine
    keeps a draft sampled from q; its gradient is q ⊙ (g − ⟨q, g⟩) with g = 1[q < p] (a
    subgradient where they tie)."""
    q = torch.softmax(logits, dim=-1)
    alpha = torch.minimum(probs, q).sum(-1)
    below = (q < probs).to(q.dtype)
    return q, alpha, q * (below - (q * below).sum(-1, keepdim=True))


def total_variation(
    logits: torch.Tensor, probs: torch.Tensor, want_grad: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Σp − α: the share of the target's mass a sampled draft loses (1 − α over the whole
    vocabulary)."""
    _, alpha, grad_alpha = _acceptance(logits, probs)
    return probs.sum(-1) - alpha, (-grad_alpha if want_grad else None)


def negative_log_acceptance(
    logits: torch.Tensor, probs: torch.Tensor, want_grad: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """−log α."""
    _, alpha, grad_alpha = _acceptance(logits, probs)
    floor = alpha.clamp_min(_ALPHA_FLOOR)
    return -floor.log(), (-grad_alpha / floor[..., None] if want_grad else None)


def lk_hybrid(
    logits: torch.Tensor, probs: torch.Tensor, want_grad: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """λ·CE + (1 − λ)·TV with λ = exp(−η·α) held constant (arXiv 2602.23881): the
    cross-entropy while the drafter is far from the target, acceptance once it is close."""
    q, alpha, grad_alpha = _acceptance(logits, probs)
    psum = probs.sum(-1, keepdim=True)
    lam = torch.exp(-LK_ETA * alpha)[..., None]
    ce = -(probs * torch.log_softmax(logits, dim=-1)).sum(-1)
    loss = lam[..., 0] * ce + (1 - lam[..., 0]) * (psum[..., 0] - alpha)
    if not want_grad:
        return loss, None
    return loss, lam * (q * psum - probs) - (1 - lam) * grad_alpha


STEP_LOSSES: dict[str, StepLoss] = {
    "soft-ce": soft_cross_entropy,
    "tv": total_variation,
    "nla": negative_log_acceptance,
    "lk": lk_hybrid,
}
"""--loss's names (option_values.LOSSES) and their functions."""


def step_loss(name: str) -> StepLoss:
    """The step loss --loss names (TrainConfig has checked the name)."""
    return STEP_LOSSES[name]

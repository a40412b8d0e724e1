"""The loss of one training-time-test step, the seam where a loss is chosen (--loss).

A step loss takes the drafter's logits and the target's distribution at a block of
positions, both over the draft vocabulary, and returns the loss at each position and, when
asked, its gradient with respect to the logits. soft_ce.py walks the steps and their
positions in blocks, computing each block's logits from the drafter's head input, and
weighs and sums what the step loss returns (TTTLoss in ttt.py: decay^k over the global
batch's positions); so a new loss is one function here, named in `STEP_LOSSES` and in
config.LOSSES.
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


STEP_LOSSES: dict[str, StepLoss] = {"soft-ce": soft_cross_entropy}
"""--loss's names (config.LOSSES) and their functions."""


def step_loss(name: str) -> StepLoss:
    """The step loss --loss names (TrainConfig has checked the name)."""
    return STEP_LOSSES[name]

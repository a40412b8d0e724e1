"""The training-time-test loss over the draft vocabulary, in blocks of positions.

Σ_k coef_k · Σ_t mask_k,t · loss(q_k,t, p_t+1+k), with q_k = softmax(normed_k W^T) and the
loss a step loss of losses.py (--loss; the soft cross-entropy −Σ_v p_v · log q_v unless
another is asked).
Written as one autograd function over all the steps: the forward pass walks blocks of
positions, computes each block's logits, its loss and at once its gradients (the step loss
gives its gradient with respect to the logits, e.g. softmax · Σp − p for the soft
cross-entropy), and keeps only the gradients with respect to the hidden states (the size of
the hidden states) and one lm_head gradient for all steps. No [T, draft_vocab] tensor
outlives its block, and nothing is recomputed in the backward pass: it only scales what
the forward pass kept by the incoming gradient.

Accept-until-fail (--auf): a chain discards every draft after its first miss, so step k at
chain start t may count with weight Π_{j<k} a_j(t), the detached chance that the earlier
drafts of the same chain were kept under the serving rule (`AUF_RULES`): `greedy`
(temperature 0: 1 where the drafter's top token is the target's), `onehot` (vLLM's default
at T > 0: p(argmax q)) or `probabilistic` (α = Σ min(p, q)); `off` weighs every step fully,
as EAGLE-3 does. The steps are walked in order, so the product is ready when step k needs it.

Under autocast the matmuls run in the autocast dtype, as `nn.Linear` would, and the
softmax in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import eagle3kit.train.losses as losses
from eagle3kit.train.losses import StepLoss

BLOCK_BYTES = 32 << 20
"""Largest [B, block, draft_vocab] fp32 tensor of a block."""
AUF_RULES = ("off", "greedy", "onehot", "probabilistic")
"""How accept-until-fail counts an earlier draft as kept (TrainConfig.auf_rule)."""


@dataclass
class Step:
    """One training-time-test step's share of the loss."""

    k: int
    """The step: its targets are the target's distributions at t+1+k."""
    normed: torch.Tensor
    """[B, n, H] the drafter's final-norm output at positions 0..n-1."""
    mask: torch.Tensor
    """[B, n] bool: positions that carry loss."""
    coef: torch.Tensor
    """Scalar: decay**k / the global batch's position count."""


def kept(rule: str, logits: torch.Tensor, probs: torch.Tensor, hit: torch.Tensor) -> torch.Tensor:
    """[B, n] the chance the engine keeps the drafter's token at each position, under `rule`
    (one of AUF_RULES but off); `hit` is where its top token is the target's."""
    if rule == "greedy":
        return hit.to(probs.dtype)
    if rule == "onehot":
        return probs.gather(-1, logits.argmax(-1, keepdim=True))[..., 0]
    return torch.minimum(probs, torch.softmax(logits, dim=-1)).sum(-1)  # probabilistic


class _SoftCE(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        weight: torch.Tensor,
        probs: torch.Tensor,
        best: torch.Tensor,
        steps: list[Step],
        step_loss: StepLoss,
        auf: str,
        *normed: torch.Tensor,
    ):
        want_grads = any(ctx.needs_input_grad[6:]) or ctx.needs_input_grad[0]
        device = probs.device.type
        dtype = (
            torch.get_autocast_dtype(device)
            if torch.is_autocast_enabled(device)
            else normed[0].dtype
        )
        w = weight.to(dtype)
        grad_w = torch.zeros_like(weight, dtype=torch.float32) if want_grads else None
        grads_h = []
        b, vocab = probs.shape[0], probs.shape[-1]
        rows = max(1, BLOCK_BYTES // (4 * vocab * b))
        total = torch.zeros((), dtype=torch.float64, device=probs.device)
        sums, correct = [], []
        # Π_{j<k} a_j at each chain start: accept-until-fail's weight of step k there.
        chain = (
            torch.ones(b, steps[0].normed.shape[1], device=probs.device)
            if steps and auf != "off"
            else None
        )
        with torch.autocast(device, enabled=False):
            for step in steps:
                h, n = step.normed, step.normed.shape[1]
                grad_h = torch.empty_like(h) if want_grads else None
                ce_sum = torch.zeros((), dtype=torch.float64, device=probs.device)
                weighted_sum = torch.zeros((), dtype=torch.float64, device=probs.device)
                hits = torch.zeros((), dtype=torch.float64, device=probs.device)
                for start in range(0, n, rows):
                    stop = min(n, start + rows)
                    hb = h[:, start:stop].to(dtype)
                    p = probs[:, 1 + step.k + start : 1 + step.k + stop]
                    mask = step.mask[:, start:stop]
                    logits = torch.matmul(hb, w.T).float()
                    hit = (
                        logits.argmax(-1) == best[:, 1 + step.k + start : 1 + step.k + stop]
                    ) & mask
                    hits += hit.sum().double()
                    weight = mask.float()
                    if chain is not None:
                        weight = weight * chain[:, start:stop]
                        chain[:, start:stop] *= kept(auf, logits, p, hit) * mask
                    loss, g = step_loss(logits, p, want_grads)
                    del logits  # the step loss may have written its gradient there
                    ce_sum += (loss * mask).sum().double()
                    weighted_sum += (loss * weight).sum().double()
                    if grad_h is None or grad_w is None or g is None:
                        continue
                    g = g.mul_((weight * step.coef)[..., None]).to(dtype)
                    grad_h[:, start:stop] = torch.matmul(g, w).to(h.dtype)
                    grad_w += torch.matmul(
                        g.reshape(-1, vocab).T, hb.reshape(-1, hb.shape[-1])
                    ).float()
                total += step.coef.double() * weighted_sum
                sums.append(ce_sum)
                correct.append(hits)
                grads_h.append(grad_h)
        ctx.grad_w, ctx.grads_h, ctx.weight_dtype = grad_w, grads_h, weight.dtype
        sums_t, correct_t = torch.stack(sums), torch.stack(correct)
        ctx.mark_non_differentiable(sums_t, correct_t)
        return total.float(), sums_t, correct_t

    @staticmethod
    def backward(ctx, g_total: torch.Tensor, _sums: torch.Tensor, _correct: torch.Tensor):
        g = g_total.float()
        grad_w = (ctx.grad_w * g).to(ctx.weight_dtype) if ctx.needs_input_grad[0] else None
        grads_h = [None if gh is None else gh * g.to(gh.dtype) for gh in ctx.grads_h]
        ctx.grad_w = ctx.grads_h = None
        return grad_w, None, None, None, None, None, *grads_h


def soft_cross_entropy(
    weight: torch.Tensor,
    probs: torch.Tensor,
    best: torch.Tensor,
    steps: list[Step],
    step_loss: StepLoss = losses.soft_cross_entropy,
    auf: str = "off",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(Σ_k coef_k · loss_k, per-step loss sums [steps] fp64, per-step hits [steps] fp64);
    `step_loss` (losses.py, --loss) gives the loss at each position, the soft cross-entropy
    by default; `auf` (AUF_RULES) weighs each step's positions by accept-until-fail, in the
    total only (the per-step sums stay unweighted, so runs compare).

    weight: the drafter's lm_head [Vd, H]; probs [B, T, Vd]: the target's distribution
    over the draft vocabulary at every position; best [B, T]: its argmax. A hit is a
    loss-carrying position where the drafter's top draft token is the target's.
    """
    return _SoftCE.apply(weight, probs, best, steps, step_loss, auf, *[s.normed for s in steps])

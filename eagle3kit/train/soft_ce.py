"""The training-time-test loss over the draft vocabulary, in blocks of positions.

Σ_k coef_k · Σ_t mask_k,t · (−Σ_v p_t+1+k,v · log q_k,t,v), with q_k = softmax(normed_k W^T).
Written as one autograd function over all the steps: the forward pass walks blocks of
positions, computes each block's logits, its loss and at once its gradients (the
gradient of a soft cross-entropy is coef · mask · (softmax · Σp − p), known as soon as the
logits are), and keeps only the gradients with respect to the hidden states (the size of
the hidden states) and one lm_head gradient for all steps. No [T, draft_vocab] tensor
outlives its block, and nothing is recomputed in the backward pass: it only scales what
the forward pass kept by the incoming gradient.

`Objective` picks what each position is trained toward (QUALITY.md, "Levers"):
- `loss`: `kl`, the soft cross-entropy above (forward KL up to the target's entropy); `tv`,
  1 − α with α = Σ_v min(p_v, q_v), the chance a sampled draft is kept; `nla`, −log α; `lk`,
  λ·KL + (1 − λ)·TV with λ = exp(−η·α) detached (arXiv 2602.23881): KL while the drafter is
  far from the target, acceptance once it is close. Their gradients with respect to the
  logits are written out: dα/dz = q ⊙ (g − ⟨q, g⟩), g = 1[q < p] (a subgradient).
- `auf` (accept-until-fail): a chain discards every draft after its first miss, so step k
  at position t counts with weight Π_{j<k} a_j(t), the detached acceptance of the earlier
  drafts of the same chain under the serving rule: `greedy` (temperature 0: 1 where the
  drafter's top token is the target's), `onehot` (vLLM's default at T > 0: p(argmax q)),
  `probabilistic` (α); `off` weighs every step fully, as EAGLE-3 does.

Under autocast the matmuls run in the autocast dtype, as `nn.Linear` would, and the
softmax in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagle3kit.train.config import LOSSES

BLOCK_BYTES = 32 << 20
"""Largest [B, block, draft_vocab] fp32 tensor of a block."""
AUF_RULES = ("off", "greedy", "onehot", "probabilistic")
"""Objective.auf's choices: how an earlier draft's acceptance is counted."""
_EPS = 1e-6
"""Floor of α under −log α: a draft with no overlap still gets a finite, large gradient."""


@dataclass(frozen=True)
class Objective:
    """What every position is trained toward (the module docstring)."""

    loss: str = "kl"
    auf: str = "off"
    lk_eta: float = 3.0
    """η of the LK hybrid's λ = exp(−η·α): 3, as the paper and speculators use."""

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ValueError(f"unknown loss {self.loss!r} (one of {', '.join(LOSSES)})")
        if self.auf not in AUF_RULES:
            raise ValueError(f"unknown accept-until-fail rule {self.auf!r} "
                             f"(one of {', '.join(AUF_RULES)})")


def _objective(kind: str, eta: float, p: torch.Tensor, q: torch.Tensor, logq: torch.Tensor,
               psum: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss per position [B, n], its gradient with respect to the logits [B, n, V], α [B, n])
    of one block; p the target's draft-vocabulary distribution, q the drafter's."""
    ce = -(p * logq).sum(-1)
    alpha = torch.minimum(p, q).sum(-1)
    grad_kl = q * psum - p
    if kind == "kl":
        return ce, grad_kl, alpha
    below = (q < p).to(q.dtype)
    grad_alpha = q * (below - (q * below).sum(-1, keepdim=True))
    if kind == "tv":
        return psum[..., 0] - alpha, -grad_alpha, alpha
    if kind == "nla":
        floor = alpha.clamp_min(_EPS)
        return -floor.log(), -grad_alpha / floor[..., None], alpha
    lam = torch.exp(-eta * alpha)[..., None]  # "lk"; detached: the forward pass has no graph
    loss = lam[..., 0] * ce + (1 - lam[..., 0]) * (psum[..., 0] - alpha)
    return loss, lam * grad_kl - (1 - lam) * grad_alpha, alpha


def _accepted(rule: str, p: torch.Tensor, logq: torch.Tensor, alpha: torch.Tensor,
              hit: torch.Tensor) -> torch.Tensor:
    """[B, n] the chance the engine keeps the drafter's token here, under `rule`."""
    if rule == "greedy":
        return hit.to(p.dtype)
    if rule == "onehot":
        return p.gather(-1, logq.argmax(-1, keepdim=True))[..., 0]
    return alpha  # probabilistic


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
    objective: Objective = Objective()


class _SoftCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, weight: torch.Tensor, probs: torch.Tensor, best: torch.Tensor,
                steps: list[Step], *normed: torch.Tensor):
        want_grads = any(ctx.needs_input_grad[4:]) or ctx.needs_input_grad[0]
        device = probs.device.type
        dtype = (torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device)
                 else normed[0].dtype)
        w = weight.to(dtype)
        grad_w = torch.zeros_like(weight, dtype=torch.float32) if want_grads else None
        grads_h = []
        b, vocab = probs.shape[0], probs.shape[-1]
        rows = max(1, BLOCK_BYTES // (4 * vocab * b))
        total = torch.zeros((), dtype=torch.float64, device=probs.device)
        sums, correct = [], []
        # Π_{j<k} a_j per chain start t: the weight accept-until-fail gives step k there.
        chain = (torch.ones(b, steps[0].normed.shape[1], device=probs.device) if steps
                 else None)
        with torch.autocast(device, enabled=False):
            for step in steps:
                h, n, aim = step.normed, step.normed.shape[1], step.objective
                grad_h = torch.empty_like(h) if want_grads else None
                ce_sum = torch.zeros((), dtype=torch.float64, device=probs.device)
                loss_sum = torch.zeros((), dtype=torch.float64, device=probs.device)
                hits = torch.zeros((), dtype=torch.float64, device=probs.device)
                for start in range(0, n, rows):
                    stop = min(n, start + rows)
                    hb = h[:, start:stop].to(dtype)
                    p = probs[:, 1 + step.k + start:1 + step.k + stop]
                    mask = step.mask[:, start:stop]
                    logq = torch.log_softmax(torch.matmul(hb, w.T).float(), dim=-1)
                    q = logq.exp()
                    loss, g, alpha = _objective(aim.loss, aim.lk_eta, p, q, logq,
                                                p.sum(-1, keepdim=True))
                    hit = (logq.argmax(-1) == best[:, 1 + step.k + start:1 + step.k + stop]) & mask
                    weighted = mask.float()
                    if aim.auf != "off" and chain is not None:
                        weighted = weighted * chain[:, start:stop]
                        chain[:, start:stop] *= _accepted(aim.auf, p, logq, alpha, hit) * mask
                    ce_sum += (-(p * logq).sum(-1) * mask).sum().double()
                    loss_sum += (loss * weighted).sum().double()
                    hits += hit.sum().double()
                    if grad_h is None or grad_w is None:
                        continue
                    g = g.mul_((weighted * step.coef)[..., None]).to(dtype)
                    grad_h[:, start:stop] = torch.matmul(g, w).to(h.dtype)
                    grad_w += torch.matmul(g.reshape(-1, vocab).T,
                                           hb.reshape(-1, hb.shape[-1])).float()
                total += step.coef.double() * loss_sum
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
        return grad_w, None, None, None, *grads_h


def soft_cross_entropy(weight: torch.Tensor, probs: torch.Tensor, best: torch.Tensor,
                       steps: list[Step]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(Σ_k coef_k · loss_k, per-step CE sums [steps] fp64, per-step hits [steps] fp64).

    loss_k is each step's `Objective` summed over its (accept-until-fail weighted) positions;
    the CE sums are the plain soft cross-entropy whatever the objective, so the logged loss
    stays comparable across objectives.

    weight: the drafter's lm_head [Vd, H]; probs [B, T, Vd]: the target's distribution
    over the draft vocabulary at every position; best [B, T]: its argmax. A hit is a
    loss-carrying position where the drafter's top draft token is the target's.
    """
    return _SoftCE.apply(weight, probs, best, steps, *[s.normed for s in steps])

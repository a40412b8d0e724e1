"""How a serving engine verifies a draft at temperature > 0, and what that keeps.

Three rules, each the one an engine runs (docs/bench.md, "Sampled decoding"):
- `onehot`: vLLM's default (`draft_sample_method: greedy`, vllm/v1/sample/rejection_sampler.py
  with no draft probabilities). The draft x is the drafter's argmax; the target keeps it with
  probability p(x), and on a rejection the token is drawn from p with x removed.
- `probabilistic`: vLLM's `draft_sample_method: probabilistic`, the textbook rule. x is drawn
  from q = softmax(draft logits / T), kept with probability min(1, p(x) / q(x)); on a
  rejection the token comes from max(0, p - q) renormalised.
- `sglang`: SGLang's EAGLE worker with topk 1 (sgl-kernel's
  tree_speculative_sampling_target_only): x is the drafter's argmax, kept when a uniform coin
  is <= p(x) / threshold_acc or when p(x) >= threshold_single (the server's
  --speculative-accept-threshold-acc / -single, both 1 by default, where it is `onehot`);
  a rejection draws from p with x removed.

p is the target's distribution as the server samples from it: logits / T, then top-k, then
top-p (vLLM's apply_sampling_constraints; SGLang renormalises in the same order). Drafts are
never filtered by top-k or top-p (neither engine does). With a reduced draft vocabulary, q is
the drafter's softmax over its own vocabulary placed on the target ids through d2t (zero
elsewhere): what vLLM's Eagle3 `compute_logits` makes by filling the other ids with -inf.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from eagle3kit.model.acceptance import VERIFY_RULES as RULES


def target_probs(
    logits: torch.Tensor, temperature: float, top_k: int = -1, top_p: float = 1.0
) -> torch.Tensor:
    """p: the target's sampling distribution over the last dimension, as vLLM builds it
    (temperature, then top-k keeping ties with the k-th logit, then top-p keeping the
    smallest set of the likeliest tokens whose mass reaches top_p, at least one)."""
    scaled = logits.float() / temperature
    if 0 < top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, -math.inf)
    if top_p < 1.0:
        ordered, order = scaled.sort(dim=-1)
        below = ordered.softmax(dim=-1).cumsum(dim=-1) <= 1 - top_p
        below[..., -1] = False
        scaled = scaled.scatter(-1, order, ordered.masked_fill(below, -math.inf))
    return torch.softmax(scaled, dim=-1)


def draft_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """q: the drafter's distribution at `temperature` (no top-k or top-p: vLLM's draft
    sampler applies the temperature only)."""
    return torch.softmax(logits.float() / temperature, dim=-1)


@dataclass(frozen=True)
class Rule:
    """One verification rule (`RULES`), with SGLang's accept thresholds."""

    name: str = "onehot"
    threshold_single: float = 1.0
    threshold_acc: float = 1.0

    def __post_init__(self) -> None:
        if self.name not in RULES:
            raise ValueError(f"unknown verification rule {self.name!r} (one of {RULES})")

    @property
    def samples_drafts(self) -> bool:
        """Drafts are drawn from q (probabilistic), not the drafter's argmax."""
        return self.name == "probabilistic"

    @property
    def keeps_matching_samples(self) -> bool:
        """A draft is kept exactly when the token the target samples there equals it (in
        distribution): an argmax draft kept with p(x), the replacement drawn from p without
        it. onehot, and sglang at its default thresholds (which is onehot)."""
        at_defaults = self.threshold_acc == 1 and self.threshold_single >= 1
        return self.name == "onehot" or (self.name == "sglang" and at_defaults)

    @property
    def lossless(self) -> bool:
        """The output has the target's own distribution (SGLang's thresholds below 1 trade
        that for acceptance)."""
        return self.name != "sglang" or (self.threshold_single >= 1 and self.threshold_acc >= 1)

    def keep_probability(self, p: torch.Tensor, q: torch.Tensor | None, draft: int) -> float:
        """The chance the target keeps `draft` (a target id) given p and, for the
        probabilistic rule, the q it was drawn from."""
        px = float(p[draft])
        if self.name == "probabilistic":
            assert q is not None, "the probabilistic rule needs the draft distribution"
            qx = float(q[draft])
            return 0.0 if qx <= 0 else min(1.0, px / qx)
        if self.name == "sglang":
            return 1.0 if px >= self.threshold_single else min(1.0, px / self.threshold_acc)
        return px

    def residual(self, p: torch.Tensor, q: torch.Tensor | None, draft: int) -> torch.Tensor:
        """The distribution the token is drawn from after `draft` was rejected."""
        if self.name == "probabilistic":
            assert q is not None
            rest = (p - q.to(p.device)).clamp_min(0)
        else:
            rest = p.clone()
            rest[draft] = 0
        total = float(rest.sum())
        return rest / total if total > 0 else p

    def expected(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """The probability a draft is kept, before it is drawn, for each row of p and q
        (same shape, the target vocabulary last): p(argmax q) for onehot, its thresholded
        form for sglang, Σ min(p, q) for probabilistic."""
        if self.name == "probabilistic":
            return torch.minimum(p, q.to(p.device)).sum(-1)
        px = p.gather(-1, q.argmax(-1, keepdim=True).to(p.device)).squeeze(-1)
        if self.name == "sglang":
            kept = (px / self.threshold_acc).clamp(max=1.0)
            return torch.where(px >= self.threshold_single, torch.ones_like(px), kept)
        return px

"""The training-time-test attention and loss as eagle3kit computed them before they became
linear in the sequence length (main at 5850388): the full [B, heads, T, T] score matrix and
[B, T, draft_vocab] logits per step. Kept as the reference the linear path is tested
against (tests/test_ttt_linear.py) and as the baseline benchmarks/train_long_bench.py
measures in the same run.
"""

from __future__ import annotations

import math

import torch

from eagle3kit.model import Eagle3Drafter, TTTState
from eagle3kit.train.target import TargetBatch, TargetHead
from eagle3kit.train.ttt import loss_masks, shifted


def quadratic_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: TTTState, valid: torch.Tensor | None
) -> torch.Tensor:
    state.keys.append(k)
    state.values.append(v)
    scale = 1.0 / math.sqrt(q.shape[-1])
    t = q.shape[2]
    scores = torch.matmul(q, state.keys[0].transpose(-1, -2)) * scale  # [B, h, T, T]
    allowed = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    if valid is not None:
        allowed = allowed & valid[:, None, None, :].bool()
    scores = scores.masked_fill(~allowed, float("-inf"))
    diagonal = [(q * key).sum(-1, keepdim=True) * scale for key in state.keys[1:]]
    weights = torch.softmax(torch.cat([scores, *diagonal], dim=-1).float(), dim=-1).to(q.dtype)
    out = torch.matmul(weights[..., :t], state.values[0])
    for j, value in enumerate(state.values[1:]):
        out = out + weights[..., t + j : t + j + 1] * value
    return out


def quadratic_step(
    drafter: Eagle3Drafter,
    hidden: torch.Tensor,
    ids: torch.Tensor,
    positions: torch.Tensor,
    state: TTTState,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    return drafter.layer(
        hidden,
        ids,
        positions,
        lambda index, q, k, v: quadratic_attention(q, k, v, state.layer(index), valid),
    )


def quadratic_loss(
    drafter: Eagle3Drafter,
    head: TargetHead,
    batch: TargetBatch,
    counts: torch.Tensor,
    steps: int,
    decay: float,
    autocast: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """TTTLoss.forward as it was: (loss, per-step CE sums, per-step correct counts)."""
    draft_ids = drafter.d2t + torch.arange(len(drafter.d2t), device=drafter.d2t.device)
    masks = loss_masks(batch, drafter.t2d, steps)
    length = batch.ids.shape[1] - 1
    positions = torch.arange(length, device=batch.ids.device)[None].expand(batch.ids.shape[0], -1)
    valid = positions < (batch.lengths[:, None] - 1)
    logits = torch.matmul(batch.normed.to(head.lm_head.dtype), head.lm_head[draft_ids].T)
    probs = torch.softmax(logits.float(), dim=-1)
    best = probs.argmax(-1)
    state = TTTState()
    total = torch.zeros((), device=batch.ids.device)
    sums, correct = [], []
    with torch.autocast(
        batch.ids.device.type, dtype=autocast or torch.bfloat16, enabled=autocast is not None
    ):
        hidden = drafter.project(batch.aux[:, :length])
        for k in range(steps):
            ids = shifted(batch.ids, k, length)
            hidden = quadratic_step(drafter, hidden, ids, positions + k, state, valid)
            n = length - k
            if n <= 0:
                sums.append(total.new_zeros((), dtype=torch.float64))
                correct.append(total.new_zeros((), dtype=torch.float64))
                continue
            logq = torch.log_softmax(drafter.logits(hidden[:, :n]).float(), dim=-1)
            p = probs[:, 1 + k : 1 + k + n]
            mask = masks[k][:, :n]
            ce = -(p * logq).sum(-1) * mask
            total = total + (decay**k) * ce.sum() / counts[k].clamp_min(1).float()
            sums.append(ce.sum().detach().double())
            hit = (logq.argmax(-1) == best[:, 1 + k : 1 + k + n]) & mask
            correct.append(hit.sum().double())
    return total, torch.stack(sums), torch.stack(correct)


@torch.no_grad()
def quadratic_verdicts(
    drafter: Eagle3Drafter, batch: TargetBatch, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """ttt.chain_verdicts as it was."""
    length = batch.ids.shape[1] - 1
    b = batch.ids.shape[0]
    positions = torch.arange(length, device=batch.ids.device)[None].expand(b, -1)
    valid = positions < (batch.lengths[:, None] - 1)
    greedy = torch.cat([batch.ids[:, :1], batch.argmax[:, :-1]], dim=1)
    follows = batch.ids == greedy
    start = shifted(batch.loss_mask, 0, length, False) & valid
    state = TTTState()
    hidden = drafter.project(batch.aux[:, :length].to(drafter.fc.weight.dtype))
    accepted, observable = [], []
    seen = start.clone()
    for j in range(k):
        ids = batch.ids[:, 1 : 1 + length] if j == 0 else shifted(greedy, j, length)
        hidden = quadratic_step(drafter, hidden, ids, positions + j, state, valid)
        draft = drafter.draft_to_target(drafter.logits(hidden).argmax(-1))
        if j > 0:
            seen = seen & shifted(follows, j, length, False)
        inside = positions + 1 + j < batch.lengths[:, None]
        observable.append(seen & inside)
        accepted.append(draft == shifted(batch.argmax, j, length, -1))
    keep = start.reshape(-1)
    return (
        torch.stack(accepted, -1).reshape(-1, k)[keep],
        torch.stack(observable, -1).reshape(-1, k)[keep],
    )

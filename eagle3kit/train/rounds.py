"""The rounds a chain decode of a completion makes (where each starts, in which reasoning
phase, at which context depth): what train's held-out prediction counts its chains over, so
that it measures what bench accept and the engines do."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from eagle3kit.train.target import TargetBatch
from eagle3kit.train.ttt import shifted


def decoding_rounds(
    start: torch.Tensor, accepted: torch.Tensor, observable: torch.Tensor
) -> torch.Tensor:
    """[B, T-1] bool: the chain starts that chain decoding of each row's completions visits.

    Decoding does not start a round at every position: a round at t that accepts n drafts
    makes tokens up to t+2+n verified, so the next round starts at t+n+1. Easy stretches are
    crossed in few rounds and hard positions start more of them, so the rates over every
    position overstate the acceptance length bench accept and the engines measure (by 7% on
    benchmarks/quality_bench.py); the rates over the rounds a decode makes give it. Where
    the data leaves the target's greedy path (sampled data) decoding would leave it too, and
    the walk goes on along the data from the round's last observable verdict.
    """
    lead = torch.cumprod((accepted & observable).long(), dim=-1).sum(-1)  # drafts accepted
    advance = torch.where(start, lead + 1, 1).tolist()
    is_start = start.tolist()
    rounds = torch.zeros_like(start)
    for row, (steps, starts) in enumerate(zip(advance, is_start, strict=True)):
        t, visited = 0, []
        while t < len(steps):
            if starts[t]:
                visited.append(t)
            t += steps[t]
        rounds[row, visited] = True
    return rounds


def chain_starts(batch: TargetBatch) -> torch.Tensor:
    """[B, T-1] bool: position t starts a chain (token t+1 carries loss and is real)."""
    length = batch.ids.shape[1] - 1
    positions = torch.arange(length, device=batch.ids.device)[None]
    return shifted(batch.loss_mask, 0, length, False) & (positions < batch.lengths[:, None] - 1)


def start_phases(
    batch: TargetBatch, markers: Any, starts: torch.Tensor | None = None
) -> torch.Tensor:
    """[N] the reasoning phase (an index of eagle3kit.chat.phases.PHASES) of each chain
    start (or of each of `starts`, [B, T-1] bool), in chain_verdicts' order: the phase the
    context ids[:t+2] ends in, the one bench accept gives the verification round drafted
    there. A marker sets the phase it opens; a closing one returns to the answer; before any
    marker the phase is the answer."""
    from eagle3kit.chat.phases import PHASES

    ids = batch.ids
    code = torch.zeros_like(ids)
    answer = PHASES.index("answer") + 1
    for token, phase in markers.opens.items():
        code = torch.where(ids == token, PHASES.index(phase) + 1, code)
    for token in markers.closes:
        code = torch.where(ids == token, answer, code)
    at = torch.arange(ids.shape[1], device=ids.device)[None].expand_as(ids)
    last = torch.cummax(torch.where(code > 0, at, -1), dim=1).values
    phase = torch.where(last >= 0, code.gather(1, last.clamp_min(0)), answer) - 1
    return phase[:, 1:][chain_starts(batch) if starts is None else starts]


def round_buckets(rounds: torch.Tensor, edges: Sequence[int]) -> torch.Tensor:
    """[N] the context-depth bucket (eagle3kit.model.depth) of each round of `rounds`
    ([B, T-1] bool), in the order boolean indexing takes them: a chain drafted at t follows
    ids[:t+2], depth t+2."""
    from eagle3kit.model.depth import bucket_of

    depths = (torch.nonzero(rounds)[:, 1] + 2).tolist()
    return torch.tensor(
        [bucket_of(d, edges) for d in depths], dtype=torch.long, device=rounds.device
    )

"""train's held-out prediction per reasoning phase, on data whose phases are known: each
chain start gets the phase its context ends in (as bench accept gives a verification round),
and the per-phase counts add up to the overall ones."""

from __future__ import annotations

import pytest
import torch

from eagle3kit.chat.phases import PHASES, Markers, phase_after
from eagle3kit.train.heldout import chain_verdicts, evaluate
from eagle3kit.train.rounds import chain_starts, start_phases
from eagle3kit.train.target import TargetBatch

pytestmark = pytest.mark.usefixtures("one_torch_thread")
THINK, END_THINK, CALL, END_CALL = 60, 61, 62, 63
MARKERS = Markers({THINK: "think", CALL: "tool_call"}, {END_THINK: "think", END_CALL: "tool_call"})
K = 3


def batch(rows: list[list[int]], prompt: int = 3, hidden: int = 32) -> TargetBatch:
    length = max(map(len, rows))
    ids = torch.zeros(len(rows), length, dtype=torch.long)
    mask = torch.zeros(len(rows), length, dtype=torch.bool)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, prompt : len(row)] = True
    g = torch.Generator().manual_seed(0)
    return TargetBatch(
        ids,
        mask,
        torch.tensor([len(r) for r in rows]),
        torch.randn(len(rows), length, 3 * hidden, generator=g),
        torch.randn(len(rows), length, hidden, generator=g),
        torch.randint(0, 64, (len(rows), length), generator=g),
    )


ROWS = [
    [1, 2, THINK, 5, 6, 7, END_THINK, 8, 9, CALL, 10, 11, END_CALL, 12, 13],
    [1, 2, 3, 4, THINK, 5, 6, END_THINK, 7, 8],
]


def test_each_chain_start_gets_the_phase_its_context_ends_in() -> None:
    b = batch(ROWS)
    got = start_phases(b, MARKERS).tolist()
    expected = []
    for r, row in enumerate(ROWS):
        for t in chain_starts(b)[r].nonzero().flatten().tolist():
            expected.append(PHASES.index(phase_after(row[: t + 2], MARKERS)))
    assert got == expected
    assert {PHASES[p] for p in got} == {"think", "answer", "tool_call"}


def test_the_phases_split_the_held_out_counts() -> None:
    from transformers import LlamaConfig

    from eagle3kit.model import DrafterConfig, Eagle3Drafter

    target = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=8,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
    )
    torch.manual_seed(0)
    drafter = Eagle3Drafter(DrafterConfig.from_target(target))
    b = batch(ROWS)
    result = evaluate(drafter, [b], K, markers=MARKERS)
    phases = result.extra["phases"]
    assert set(phases) == {"think", "answer", "tool_call"}
    assert sum(f["chains"] for f in phases.values()) == result.chains
    acc, obs = chain_verdicts(drafter, b, K)
    which = start_phases(b, MARKERS)
    for name, f in phases.items():
        mine = which == PHASES.index(name)
        assert f["chains"] == int(mine.sum())
        first = acc[mine][:, 0] & obs[mine][:, 0]
        tried = int(obs[mine][:, 0].sum())
        assert f["per_position"][0] == pytest.approx(float(first.sum()) / tried, abs=1e-6)
    assert "phases" not in evaluate(drafter, [b], K).extra

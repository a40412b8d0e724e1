"""train's predicted acceptance length is what chain decoding measures on the same prompts.

The prediction walks the held-out completions the way a decode does (a round that accepts n
drafts is followed by one n+1 tokens later), so on greedy data it should equal
`bench accept` on the held-out prompts, up to the last round of each completion. The figure
over every position instead of those rounds overstates it, since easy stretches are
crossed in few rounds; the hand-made case pins the walk itself.
"""

from __future__ import annotations

import json

import pytest
import torch

from eagle3kit._ui import OutputOptions
from eagle3kit.train.heldout import conditional_counts, predicted_acceptance_length
from eagle3kit.train.rounds import decoding_rounds

pytestmark = pytest.mark.usefixtures("one_torch_thread")
QUIET = OutputOptions(quiet=True)


def test_the_walk_visits_the_rounds_a_decode_makes():
    # k=2 over one row: position 0 and 1 are prompt (no chain starts there).
    start = torch.tensor([[False, False, True, True, True, True, True, True, True, True]])
    yes, no = [True, True], [False, False]
    accepted = torch.tensor([[no, no, yes, yes, yes, [False, True], yes, [True, False], yes, yes]])
    observable = torch.ones_like(accepted)
    rounds = decoding_rounds(start, accepted, observable)
    # t=2 accepts 2 -> t=5 accepts 0 -> t=6 accepts 2 -> t=9 (the last).
    assert rounds[0].nonzero().flatten().tolist() == [2, 5, 6, 9]
    acc, tried = conditional_counts(accepted[rounds], observable[rounds])
    rates = (acc / tried).tolist()
    # Yields 3, 1, 3, 3: the walk's rates give their mean, the every-position rates do not.
    assert predicted_acceptance_length(rates) == pytest.approx((3 + 1 + 3 + 3) / 4)
    acc_all, tried_all = conditional_counts(accepted[start], observable[start])
    assert predicted_acceptance_length((acc_all / tried_all).tolist()) > 2.6


def test_an_unobservable_verdict_ends_the_round_there():
    start = torch.ones(1, 6, dtype=torch.bool)
    accepted = torch.ones(1, 6, 3, dtype=torch.bool)
    observable = torch.ones_like(accepted)
    observable[0, 0, 1] = False  # sampled data left the greedy path after the first draft
    rounds = decoding_rounds(start, accepted, observable)
    assert rounds[0].nonzero().flatten().tolist() == [0, 2]


def test_the_prediction_equals_bench_accept_on_the_held_out_prompts(tmp_path):
    from eagle3kit import extract as extract_stage
    from eagle3kit import gen as gen_stage
    from eagle3kit import train as train_stage
    from eagle3kit.bench import accept
    from eagle3kit.format import Dataset
    from eagle3kit.tiny import make_target, prompts, train_target
    from eagle3kit.train import data as tdata

    # A random target's greedy text has too little structure for a drafter to learn in a few
    # steps; a short training run gives it some.
    target = train_target(
        make_target(tmp_path / "target", hidden_size=32, seed=3), steps=200, seq_len=128
    )
    chats = prompts(32)
    all_prompts = tmp_path / "prompts.jsonl"
    all_prompts.write_text("".join(json.dumps({"messages": m}) + "\n" for m in chats))
    tokens, hidden = tmp_path / "tokens", tmp_path / "hidden"
    gen_stage.run(
        gen_stage.GenConfig(
            [all_prompts],
            tokens,
            engine="hf",
            target=target,
            temperature=0.0,
            max_tokens=40,
            output=QUIET,
        )
    )
    extract_stage.run(
        extract_stage.ExtractConfig(tokens, hidden, target=target, device="cpu", output=QUIET)
    )
    held = 8
    result = train_stage.run(
        train_stage.TrainConfig(
            [hidden],
            tmp_path / "run",
            target,
            epochs=10,
            batch_tokens=512,
            eval_split=held,
            eval_every=0,
            eval_k=3,
            lr=3e-3,
            device="cpu",
            output=QUIET,
        )
    )

    source = tdata.open_source(tokens, 1.0, online=True)
    mask = tdata.held_out([source], held)[0]
    ds = Dataset(tokens)
    lines = [ds[i].source["line"] for i in range(len(ds)) if mask[i]]
    bench_prompts = tmp_path / "held.jsonl"
    bench_prompts.write_text(
        "".join(json.dumps({"messages": chats[line - 1]}) + "\n" for line in lines)
    )
    report = accept.run(
        accept.AcceptConfig(
            target,
            tmp_path / "run" / "drafter",
            [bench_prompts],
            k=3,
            max_new_tokens=40,
            device="cpu",
            output=QUIET,
        )
    )
    predicted = result.eval["predicted_acceptance_length"]
    measured = report.acceptance_length
    assert 1.3 < measured < 3.7, "the drafter should accept some drafts, not all"
    assert predicted == pytest.approx(measured, rel=0.02)

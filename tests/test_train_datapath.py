"""train's held-out prediction on data sampled at the serving temperature walks the rounds
as a decode does (the "data-path" method, docs/train.md).

Under vLLM's default rule a draft is kept exactly when the token the target samples equals
it, so on completions the target sampled at the serving temperature the verdicts are the
data's tokens and the next round starts after the first miss. The walk must then keep, round
by round, exactly what the decode that sampled those completions kept. The data's
temperature comes from what gen recorded, through extract; data sampled otherwise, or not
recorded, keeps the expected method.
"""

from __future__ import annotations

import json
from itertools import cycle

import numpy as np
import pytest
import torch
from bench_fit import fit_drafter
from small_pair import AUX_LAYERS, build_small_pair
from tiny_train import QUIET, config, extract

from eagle3kit._ui import OutputOptions
from eagle3kit.bench import decode
from eagle3kit.format import Dataset, HiddenDataset
from eagle3kit.model import DrafterConfig, Eagle3Drafter
from eagle3kit.model.verification import Rule
from eagle3kit.train import run
from eagle3kit.train.heldout import Sampled, data_path_drafts, evaluate, round_verdicts
from eagle3kit.train.target import OnlineTarget, TargetBatch

pytestmark = pytest.mark.usefixtures("one_torch_thread")
K = 3
PROMPTS = [[1, 2, 3, 4], [5, 0, 2]]
NEW_TOKENS = [17, 30, 48]
"""Completion lengths of the decodes: rows of several lengths, so the batch is padded."""
RUNS = 12


# The walk is the decode -----------------------------------------------------------------
@pytest.fixture(scope="module")
def decoded():
    """Completions bench accept's decode sampled at temperature 1 under `onehot` from the
    small pair's target with a fitted drafter, each with its rounds' kept drafts and the
    drafts of each round, and the data batch they make."""
    model, _random = build_small_pair()
    target = decode.Target(model, AUX_LAYERS)
    drafter = fitted_drafter(model, target)
    runs = []
    for seed, prompt, new in zip(range(RUNS), cycle(PROMPTS), cycle(NEW_TOKENS), strict=False):
        sampler = decode.Sampler(1.0, torch.Generator().manual_seed(seed), Rule("onehot"))
        drafted: list[list[int]] = []
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(decode.Drafting, "chain", recording(decode.Drafting.chain, drafted))
            out = decode.speculate(target, drafter, prompt, new, set(), sampler, K)
        runs.append((prompt, out, drafted))
    rows = [
        (np.array(prompt + out.tokens), np.array([0] * len(prompt) + [1] * len(out.tokens)))
        for prompt, out, _ in runs
    ]
    online = OnlineTarget(model, AUX_LAYERS, torch.device("cpu"))
    return drafter, online, runs, online.batch(rows)


def fitted_drafter(model, target: decode.Target) -> Eagle3Drafter:
    """A drafter over the target's 6 tokens fitted for a few seconds to its own samples at
    temperature 1 (bench_fit): its later steps follow their inputs and positions, so a walk
    that fed them anything but the data's tokens, or elsewhere, drafts otherwise (the small
    pair's random drafter barely looks at them)."""
    samples = []
    for seed in range(8):
        prompt = [seed % 6, 7 * seed % 6, 3]
        sampler = decode.Sampler(1.0, torch.Generator().manual_seed(100 + seed))
        samples.append(prompt + decode.plain(target, prompt, 40, set(), sampler).tokens)
    torch.manual_seed(5)
    drafter = Eagle3Drafter(DrafterConfig.from_target(model.config, aux_layer_ids=AUX_LAYERS))
    drafter.load_target_embedding(model.get_input_embeddings().weight)
    return fit_drafter(model, drafter, samples, steps=150)


def recording(chain, drafted: list[list[int]]):
    """Drafting.chain, noting each round's drafts in `drafted`."""

    def chain_and_note(self, k):
        drafts, dists = chain(self, k)
        drafted.append(list(drafts))
        return drafts, dists

    return chain_and_note


def along_data(online: OnlineTarget) -> Sampled:
    return Sampled(Rule("onehot"), 1.0, online.head.lm_head, along_data=True)


def decode_rounds(out: decode.Decoded) -> list[tuple[int, int, int]]:
    """(kept, seen, known) of each round the decode made: `seen` the drafts whose data
    token exists, `known` the completion tokens known when it began (1 for the first; a
    round adds kept + 1)."""
    known, rounds = 1, []
    for kept in out.rounds:
        seen = min(K, len(out.tokens) - known)
        rounds.append((min(kept, seen), seen, known))
        known += kept + 1
    return rounds


def walked_rounds(drafter, batch: TargetBatch, sampled: Sampled) -> list[list[tuple[int, int]]]:
    """Per row, (kept, seen) of each round the data-path walk visits, leaving out a round
    with nothing to see (one starting at a completion's last token: the decode was done)."""
    kept, observable, rounds = round_verdicts(drafter, batch, K, sampled)
    lead = torch.cumprod((kept & observable).long(), dim=-1).sum(-1)
    seen = observable.sum(-1)
    out = []
    for row in range(batch.ids.shape[0]):
        pairs = zip(lead[row][rounds[row]].tolist(), seen[row][rounds[row]].tolist(), strict=True)
        out.append([(n, s) for n, s in pairs if s > 0])
    return out


def test_the_walk_keeps_in_every_round_what_the_decode_kept(decoded):
    drafter, online, runs, batch = decoded
    walked = walked_rounds(drafter, batch, along_data(online))
    for row, (_prompt, out, _drafted) in enumerate(runs):
        assert walked[row] == [(n, s) for n, s, _ in decode_rounds(out)], f"row {row}"
    kept = [n for _, out, _ in runs for n in out.rounds]
    # Teeth: rounds that keep nothing, some, and every draft, in rows of several lengths.
    assert {0, 1, 2, K} <= set(kept) and len({len(out.tokens) for _, out, _ in runs}) == 3


def test_the_walk_drafts_what_the_decode_drafted(decoded):
    """Draft j of a round the decode started after data token t+1 is the unroll's step j at
    t, for every j up to the first miss (later ones followed a rejected draft)."""
    drafter, _online, runs, batch = decoded
    drafts = data_path_drafts(drafter, batch, K)
    compared = 0
    for row, (prompt, out, drafted) in enumerate(runs):
        for (kept, seen, known), made in zip(decode_rounds(out), drafted, strict=True):
            reached = min(kept + 1, seen + 1, K)  # drafts whose inputs are the data's
            t = len(prompt) + known - 2
            assert drafts[row, t, :reached].tolist() == made[:reached], f"row {row}, t {t}"
            compared += reached
    assert compared > sum(len(d) for *_, d in runs)  # later steps too, not only the first


def test_the_prediction_counts_the_decodes_rounds(decoded):
    """evaluate's per-position counts are the decode's: draft j tried in each round whose
    earlier drafts were all kept (and whose token j exists), accepted where it was kept."""
    drafter, online, runs, batch = decoded
    accepted, tried = [0] * K, [0] * K
    for _, out, _ in runs:
        for kept, seen, _known in decode_rounds(out):
            for j in range(seen):
                tried[j] += j <= kept
                accepted[j] += j < kept
    result = evaluate(drafter, [batch], K, sampled=along_data(online))
    assert (result.accepted, result.tried) == (accepted, tried)
    assert result.prediction == "data-path" and result.temperature == 1.0
    assert result.extra["verify"] == "onehot"
    expected = evaluate(
        drafter, [batch], K, sampled=Sampled(Rule("onehot"), 1.0, online.head.lm_head)
    )
    assert expected.prediction == "expected" and expected.chains > result.chains


# The data's temperature reaches train ---------------------------------------------------
@pytest.fixture(scope="module")
def sampled(train_world, tmp_path_factory):
    """The training world's target sampled at temperature 1 by gen (the hf engine), and the
    hidden states extract made of it."""
    from eagle3kit import gen
    from eagle3kit.tiny import prompts

    root = tmp_path_factory.mktemp("sampled")
    chats = root / "prompts.jsonl"
    chats.write_text("".join(json.dumps({"messages": m}) + "\n" for m in prompts(12)))
    tokens = root / "tokens"
    gen.run(
        gen.GenConfig(
            [chats],
            tokens,
            engine="hf",
            target=train_world["target"],
            temperature=1.0,
            max_tokens=24,
            sampling_seed=0,
            output=QUIET,
        )
    )
    return {"tokens": tokens, "hidden": extract(tokens, root / "hidden", train_world["target"])}


def test_gens_temperature_reaches_train_through_extract(train_world, sampled, tmp_path, capsys):
    assert Dataset(sampled["tokens"]).recorded().drawn_at == 1.0
    hidden = HiddenDataset(sampled["hidden"])
    assert hidden.recorded().drawn_at == 1.0
    assert hidden.layout["tokens"]["sampling"]["temperature"] == 1.0
    shown = OutputOptions(no_progress=True)
    result = run(
        config(
            train_world,
            sampled["hidden"],
            tmp_path / "offline",
            max_steps=2,
            eval_temperature=1.0,
            output=shown,
        )
    )
    assert result.eval["prediction"] == result.initial_eval["prediction"] == "data-path"
    assert "temperature 1, verify onehot, prediction data-path)" in capsys.readouterr().err
    # Online the token dataset says it itself; SGLang's rule at its thresholds is onehot.
    online = run(
        config(
            train_world,
            sampled["tokens"],
            tmp_path / "online",
            online=True,
            max_steps=1,
            eval_temperature=1.0,
            eval_verify="sglang",
        )
    )
    assert online.eval["prediction"] == "data-path"


@pytest.mark.parametrize(
    ("data", "temperature", "verify", "prediction"),
    [
        ("sampled", 0.7, "onehot", "expected"),  # sampled at another temperature
        ("sampled", 1.0, "probabilistic", "expected"),  # drafts drawn: no verdict to read
        ("unrecorded", 1.0, "onehot", "expected"),  # made by another tool: unknown
        ("sampled", 0.0, "onehot", "greedy"),
    ],
)
def test_other_data_or_conditions_keep_their_method(
    train_world, sampled, tmp_path, data, temperature, verify, prediction
):
    hidden = sampled["hidden"] if data == "sampled" else train_world["hidden"]
    result = run(
        config(
            train_world,
            hidden,
            tmp_path / "run",
            max_steps=1,
            eval_temperature=temperature,
            eval_verify=verify,
        )
    )
    assert result.eval["prediction"] == prediction


def test_a_best_predicted_otherwise_is_chosen_afresh(train_world, sampled, tmp_path, capsys):
    """A run continued at another --eval-temperature (or begun by an eagle3kit whose
    prediction at a temperature was the expected one) does not compare its figures with the
    earlier best: those measured something else."""
    out = tmp_path / "run"
    run(config(train_world, sampled["hidden"], out, max_steps=2))
    capsys.readouterr()
    result = run(
        config(train_world, sampled["hidden"], out, max_steps=4, eval_temperature=1.0, force=True)
    )
    err = capsys.readouterr().err
    assert "the held-out prediction is now made at temperature 1, verify onehot, data-path" in err
    assert "was made at temperature 0" in err
    assert result.selection["best"]["step"] == 4

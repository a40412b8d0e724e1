"""The reasoning world shipped under benchmarks/worlds/reasoning/ is what it says it is.

`benchmarks/quality_world_bench.py` takes its target and its greedy training data from there
instead of spending ~45 minutes training the target and ~13 generating (docs/quality.md, "The
world, shipped"). These tests hold the copies to their records: the target is the default
recipe's (a changed `TargetRecipe` must ship a rebuilt world, or the script would quietly
build its own), the data was made from that target, and the data's answers are that target's
greedy answers, decoded again here with transformers.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from eagle3kit import tiny_reasoning
from eagle3kit.format import Dataset

SHIPPED = Path(__file__).resolve().parent.parent / "benchmarks" / "worlds" / "reasoning"
CHECKED_TOKENS = 48
"""Answer tokens decoded again per checked sample (the whole answers run to 1,024)."""


def _key(stage: str) -> dict:
    return json.loads((SHIPPED / stage / ".quality-bench.json").read_text())


def test_the_shipped_target_is_the_default_recipes():
    assert _key("target") == asdict(tiny_reasoning.TargetRecipe())
    record = tiny_reasoning.load_record(SHIPPED / "target")
    assert record["recipe"] == asdict(tiny_reasoning.TargetRecipe())


def test_the_shipped_data_was_made_from_the_shipped_target(samples):
    key = _key("tokens")
    assert key["target"] == _key("target")
    assert key["gen_temperature"] == 0.0
    assert len(samples) == key["train_prompts"]
    assert max(len(s.completion_ids) for s in samples) <= key["gen_tokens"]


@pytest.fixture(scope="module")
def target():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(SHIPPED / "target"))


@pytest.fixture(scope="module")
def samples() -> list:
    return list(Dataset(SHIPPED / "tokens"))


@pytest.mark.parametrize("index", [0, 1, 2])
def test_the_shipped_answers_are_the_targets_greedy_ones(index: int, target, samples):
    import torch

    sample = samples[index]
    prompt = torch.tensor([list(sample.prompt_ids)])
    want = list(sample.completion_ids)[:CHECKED_TOKENS]
    with torch.no_grad():
        out = target.generate(
            prompt, max_new_tokens=len(want), do_sample=False, pad_token_id=0, eos_token_id=None
        )
    assert out[0, prompt.shape[1] :].tolist() == [int(t) for t in want]


def test_the_shipped_drafters_were_trained_against_the_shipped_target():
    """The two tools' drafters the vLLM tier serves (tests/vllm/test_vllm_quality.py):
    eagle3kit's export records the target it was trained on, which must be this one (weights
    included); speculators' checkpoint names the target's shape and vocabulary."""
    from eagle3kit.target import identity, identity_mismatch, read_config

    target = SHIPPED / "target"
    actual = identity(target, read_config(target))
    export = json.loads((SHIPPED / "drafters" / "eagle3kit" / "eagle3kit-export.json").read_text())
    assert identity_mismatch(export["target"], actual) is None
    assert export["target"]["weights_xxh3"] == actual["weights_xxh3"]
    peer = json.loads((SHIPPED / "drafters" / "speculators" / "config.json").read_text())
    assert peer["speculators_model_type"] == "eagle3"
    layer = peer["transformer_layer_config"]
    assert (layer["hidden_size"], layer["vocab_size"]) == (
        actual["hidden_size"],
        actual["vocab_size"],
    )
    assert max(peer["eagle_aux_hidden_state_layer_ids"]) < actual["num_layers"]

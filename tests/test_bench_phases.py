"""Acceptance by reasoning phase (eagle3kit.chat.phases), on the real Qwen3 tokenizer, whose
<think>, </think>, <tool_call> and </tool_call> are single tokens: hand-built decodes whose
phases are known token by token."""

from __future__ import annotations

import pytest
from real_tokenizers import qwen3_tokenizer_dir

from eagle3kit.chat.markers import THINK_MARKER_PAIRS, TOOL_CALL_MARKERS, think_pair
from eagle3kit.chat.phases import Markers, by_phase, phase_after, round_phases


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir(tmp_path_factory.getbasetemp())))


def ids(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def test_markers_are_the_single_token_ones(tok) -> None:
    markers = Markers.of(tok)
    assert markers.known
    assert sorted(markers.opens.values()) == ["think", "tool_call"]
    assert phase_after(ids(tok, "<|im_start|>assistant\n<think>\n"), markers) == "think"
    assert phase_after(ids(tok, "<think>a</think>b"), markers) == "answer"
    assert phase_after(ids(tok, "</think>b<tool_call>{"), markers) == "tool_call"


def test_each_round_gets_the_phase_its_context_ends_in(tok) -> None:
    markers = Markers.of(tok)
    prompt = ids(tok, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n")
    think = ids(tok, " Let me see")  # 3 tokens
    close = ids(tok, "</think>")
    answer = ids(tok, " Hello there friend")
    call = ids(tok, "<tool_call>")
    tokens = [*think, *close, *answer, *call, *ids(tok, '{"a": 1}')]
    # Rounds: the prefill made tokens[0]; each round commits accepted + 1 tokens.
    rounds = [1, 0, 2, 1, 0]
    phases = round_phases(prompt, tokens, rounds, markers)
    # The context after tokens[:1] and [:3] is in the reasoning, after [:4] past </think>.
    assert len(think) == 3 and len(close) == 1
    expected, done = [], 1
    for accepted in rounds:
        expected.append(phase_after([*prompt, *tokens[:done]], markers))
        done += accepted + 1
    assert phases == expected
    assert phases[0] == phases[1] == "think" and "answer" in phases

    figures = by_phase([(phases, rounds)], k=3)
    assert sum(f["rounds"] for f in figures.values()) == len(rounds)
    think_rounds = [a for p, a in zip(phases, rounds, strict=True) if p == "think"]
    assert figures["think"]["acceptance_length"] == 1 + sum(think_rounds) / len(think_rounds)
    assert figures["think"]["per_position"][0] == sum(a >= 1 for a in think_rounds) / 2


def test_a_template_without_think_in_the_prompt_starts_in_the_answer(tok) -> None:
    markers = Markers.of(tok)
    prompt = ids(tok, "<|im_start|>assistant\n")
    tokens = ids(tok, "<think> x y</think> z w v")
    phases = round_phases(prompt, tokens, [0, 0, 0, 0, 0], markers)
    assert phases[0] == "think"  # tokens[0] is <think>: the first round drafts inside it
    assert phases[-1] == "answer"
    assert round_phases(prompt, ids(tok, "plain text here"), [0, 0], markers) == [
        "answer",
        "answer",
    ]


@pytest.mark.parametrize("pair", THINK_MARKER_PAIRS)
def test_every_think_pair_of_the_one_table_opens_the_think_phase(pair) -> None:
    """bench and train split phases by the same marker table gen renders with: a model whose
    reasoning is `<seed:think>` (Seed-OSS) or `◁think▷` has its think phase too (the old
    phase table knew `<think>` alone and put all of it in the answer)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "a", "b", *pair, *TOOL_CALL_MARKERS]
    model = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    model.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=model)
    markers = Markers.of(tok)
    assert think_pair(tok.get_vocab()) == pair
    assert sorted(markers.opens.values()) == ["think", "tool_call"]
    assert phase_after(ids(tok, f"a {pair[0]} b"), markers) == "think"
    assert phase_after(ids(tok, f"{pair[0]} a {pair[1]} b"), markers) == "answer"

"""eagle3kit.tiny_reasoning: the reasoning world's prompts, chats and a very small target.

Real parts: the real task generators, the real stdlib docstrings, a real BPE tokenizer and a
real (tiny) transformers Llama trained for two steps.
"""

from __future__ import annotations

import json
import random

import pytest

from eagle3kit import tiny
from eagle3kit import tiny_reasoning as tr


def test_splits_are_disjoint_and_each_question_keeps_its_split():
    drawn = {split: tr.chats(split, 60, seed=3) for split in tr.SPLITS}
    questions = {split: {q for q, _, _ in c} for split, c in drawn.items()}
    for split, found in questions.items():
        assert len(found) == 60  # distinct within a split
        assert all(tr.split_of(q) == split for q in found)
    assert not questions["train"] & questions["heldout"]
    assert not questions["train"] & questions["choice"]
    assert not questions["heldout"] & questions["choice"]
    # Another seed draws other problems, but never moves a question to another split.
    other = {q for q, _, _ in tr.chats("heldout", 60, seed=4)}
    assert other != questions["heldout"]
    assert not other & (questions["train"] | questions["choice"])


def test_chats_are_deterministic_from_the_seed_and_mix_every_task():
    first, again = tr.chats("train", 200, seed=7), tr.chats("train", 200, seed=7)
    assert first == again
    assert tr.chats("train", 200, seed=8) != first
    texts = {tiny.docstring_chat(d)[0] for d in tiny.stdlib_docstrings()}
    assert any(q in texts for q, _, _ in first)  # natural text is mixed in
    assert any(q.startswith("Sort from smallest") for q, _, _ in first)
    assert any(q.startswith("What is") and "+" in q for q, _, _ in first)
    assert any(q.startswith("How many") for q, _, _ in first)
    assert any(q.endswith("?") and q.startswith("Every") for q, _, _ in first)


@pytest.mark.parametrize("task", sorted(tr.TASKS))
def test_tasks_reach_the_right_answer_step_by_step(task):
    rng = random.Random(11)
    for _ in range(30):
        question, reasoning, answer = tr.TASKS[task](rng)
        assert reasoning.count("\n") >= 1  # written out in steps
        assert answer.rstrip(".").lower() in reasoning.lower()  # the thought reaches it
        if task in ("addition", "subtraction", "multiplication"):
            a, op, b = question.removeprefix("What is ").rstrip("?").split()
            value = {"+": int(a) + int(b), "-": int(a) - int(b), "x": int(a) * int(b)}[op]
            assert answer == f"{a} {op} {b} = {value}."
        if task == "sorting":
            values = [int(v) for v in question.split(": ")[1].rstrip(".").split(", ")]
            assert answer == ", ".join(map(str, sorted(values))) + "."


def test_sorting_gives_traces_of_a_thousand_tokens_and_more():
    rng = random.Random(0)
    longest = max(len(tr.sorting(rng)[1]) for _ in range(200))
    assert longest > 2000  # characters; a token for each digit, space or comma


def test_prompt_file_holds_the_split(tmp_path):
    path = tr.write_prompts(tmp_path / "p.jsonl", "choice", 5, seed=1)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["messages"][0]["content"] for r in rows] == [
        q for q, _, _ in tr.chats("choice", 5, 1)
    ]


def test_a_very_small_target_trains_deterministically(tmp_path):
    from transformers import AutoTokenizer

    recipe = tr.TargetRecipe(
        hidden_size=64,
        num_layers=8,
        heads=2,
        kv_heads=1,
        vocab_size=300,
        chats=30,
        steps=2,
        row_tokens=64,
        rows=2,
        seed=5,
    )
    first = tr.train_reasoning_target(tmp_path / "a", recipe)
    record = tr.load_record(first)
    assert record["recipe"]["seed"] == 5 and len(record["losses"]) == 2
    assert record["train_seconds"] >= 0
    config = json.loads((first / "config.json").read_text())
    assert config["num_hidden_layers"] == 8 and config["hidden_size"] == 64
    tok = AutoTokenizer.from_pretrained(str(first), local_files_only=True)
    prompt = tok.apply_chat_template(
        tr.prompts("heldout", 1, 0)[0], tokenize=False, add_generation_prompt=True
    )
    assert prompt.endswith(f"{tiny.IM_START}assistant\n{tiny.THINK}\n")
    assert tok.tokenize("2048") == ["2", "0", "4", "8"]  # digits one by one
    again = tr.train_reasoning_target(tmp_path / "b", recipe)
    assert tr.load_record(again)["losses"] == record["losses"]
    assert (first / "model.safetensors").read_bytes() == (again / "model.safetensors").read_bytes()

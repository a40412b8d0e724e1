"""The tiny offline target: briefly trained on stdlib docstrings, it answers like a reasoning
model (thought, </think>, answer, <|im_end|>) instead of looping over random tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from eagle3kit import tiny


def held_out_loss(target: Path, n: int = 16) -> float:
    """Mean next-token loss over whole chats built from docstrings training never saw."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(target))
    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    docs = tiny._split(tiny.stdlib_docstrings(), held_out=True)[:n]
    ids, labels = tiny._batch(tiny.chat_token_ids(tok, docs, 256), tok.pad_token_id)
    with torch.no_grad():
        return float(model(input_ids=ids, labels=labels).loss)


def greedy(target: Path, n: int, max_new_tokens: int = 200) -> list[str]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(target))
    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    end = tok.convert_tokens_to_ids(tiny.IM_END)
    texts = []
    for messages in tiny.prompts(n):
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt = tok(text, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            out = model.generate(
                torch.tensor([prompt]),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=end,
                pad_token_id=end,
            )
        texts.append(tok.decode(out[0, len(prompt) :]))
    return texts


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny.make_tokenizer(tmp_path_factory.mktemp("tok"))


def test_prompts_are_held_out_and_fixed() -> None:
    docs = tiny.stdlib_docstrings()
    trained = {tiny.docstring_chat(d)[0] for d in tiny._split(docs, held_out=False)}
    first = tiny.prompts(40)
    assert first == tiny.prompts(40)  # a fixed order
    assert tiny.prompts(10, offset=30) == first[30:]
    assert all(m[0]["role"] == "user" and m[0]["content"] for m in (p for p in first))
    # docstrings repeat across the stdlib ("Return self."), so compare as a share
    assert sum(p[0]["content"] in trained for p in first) <= 10
    with pytest.raises(ValueError, match="held-out prompts exist"):
        tiny.prompts(10_000)


def test_docstring_chat_is_bounded_and_rendered_with_think_tokens(tokenizer_dir: Path) -> None:
    from transformers import AutoTokenizer

    doc = "Return the thing. " + "It does many things in a long way. " * 30
    question, reasoning, answer = tiny.docstring_chat(doc)
    assert question == "Return the thing."
    assert reasoning.startswith("Let me think about this.") and len(reasoning) < 260
    assert answer == "In short: Return the thing."
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    [ids] = tiny.chat_token_ids(tok, [doc], 256)
    text = tok.decode(ids)
    assert text.startswith(
        "<|im_start|>user\nReturn the thing.<|im_end|>\n<|im_start|>assistant\n"
        "<think>\nLet me think about this."
    )
    assert "So the answer is short.\n</think>\n\nIn short: Return the thing.<|im_end|>" in text


def test_training_lowers_the_loss_and_saves_in_place(tmp_path: Path, tokenizer_dir: Path) -> None:
    target = tiny.make_target(tmp_path / "t", tokenizer_dir)
    before = held_out_loss(target)
    threads = torch.get_num_threads()
    assert tiny.train_target(target, steps=30) == target
    assert torch.get_num_threads() == threads  # restored after training on one thread
    after = held_out_loss(target)
    assert before > 6.5  # ~ln(1030): a random model
    assert after < before - 1.0, (before, after)
    log = json.loads((target / "tiny_training.json").read_text())
    assert len(log["losses"]) == 30 and log["losses"][-1] < log["losses"][0] - 1.0


def test_bad_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="steps must be >= 1"):
        tiny.train_target(tmp_path, steps=0)
    with pytest.raises(ValueError, match="threads must be >= 1"):
        tiny.train_target(tmp_path, threads=0)


@pytest.mark.slow
def test_default_training_gives_a_reasoning_shape(tmp_path: Path, tokenizer_dir: Path) -> None:
    target = tiny.make_target(tmp_path / "t", tokenizer_dir)
    tiny.train_target(target)
    assert held_out_loss(target) < 3.8
    texts = greedy(target, 20)
    ended = [t for t in texts if t.endswith(tiny.IM_END)]
    assert len(ended) >= 16, texts
    assert all(tiny.END_THINK in t for t in ended)
    assert sum(t.startswith("Let me think about this.") for t in texts) >= 16


@pytest.mark.slow
def test_training_is_deterministic(tmp_path: Path, tokenizer_dir: Path) -> None:
    from safetensors.torch import load_file

    weights = []
    for name in ("a", "b"):
        target = tiny.make_target(tmp_path / name, tokenizer_dir)
        tiny.train_target(target, steps=10)
        weights.append(load_file(str(target / "model.safetensors")))
    assert weights[0].keys() == weights[1].keys()
    for key in weights[0]:
        torch.testing.assert_close(weights[0][key], weights[1][key], rtol=0, atol=0)

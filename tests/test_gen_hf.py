"""`gen --engine hf --target DIR`: transformers in-process, the same exact-token dataset out.

The target is a tiny Qwen3 causal LM built from a config (hidden 32, 2 layers, the real
Qwen3 tokenizer's vocabulary) and saved with that tokenizer. Its end-of-turn logit is scaled
so that some prompts stop early and others run to max tokens. The test renders the prompts
itself with the tokenizer's chat template and runs `model.generate` on them: greedy gen must
store exactly those ids with the right finish reasons; sampling with a seed must reproduce.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest
from gen_harness import MT_BENCH, QA, cli, ints, prompt_file
from real_tokenizers import qwen3_tokenizer_dir

from eagle3kit import convert, gen
from eagle3kit._options import WRITE_KEYS, WriteOptions
from eagle3kit._ui import OutputOptions
from eagle3kit.format import Dataset

MAX_TOKENS = 16
END_OF_TURN = "<|im_end|>"


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """A 16-token generate of this tiny model takes ~0.13 s on one thread and ~0.5 s on two
    on a busy 2-core machine (its matmuls are too small to share); restored afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    tok_dir = qwen3_tokenizer_dir(tmp_path_factory.getbasetemp())
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    stop = tok.convert_tokens_to_ids(END_OF_TURN)
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        eos_token_id=stop,
    )
    model = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():  # the end-of-turn token wins at some positions, not most
        direction = torch.randn(config.hidden_size)
        model.lm_head.weight[stop] = 0.3 * direction / direction.norm()
    out = tmp_path_factory.mktemp("tiny-qwen3")
    model.save_pretrained(out)
    for f in tok_dir.iterdir():
        shutil.copy(f, out / f.name)
    return out


def run_hf(prompts: list[Path], out: Path, target: Path, **kw) -> gen.GenResult:
    kw.setdefault("max_tokens", MAX_TOKENS)
    kw.setdefault("commit_every", 3)
    write = WriteOptions(**{k: kw.pop(k) for k in WRITE_KEYS if k in kw})
    return gen.run(
        gen.GenConfig(
            prompts,
            out,
            engine="hf",
            target=target,
            output=OutputOptions(quiet=True),
            write=write,
            **kw,
        )
    )


def test_greedy_gen_stores_exactly_what_generate_gives(tmp_path, target):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    prompts = [prompt_file(tmp_path, 5, QA), prompt_file(tmp_path, 2, MT_BENCH)]
    out = tmp_path / "ds"
    result = run_hf(prompts, out, target, temperature=0.0)
    tok = AutoTokenizer.from_pretrained(str(target))
    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    stop = tok.convert_tokens_to_ids(END_OF_TURN)
    samples = list(Dataset(out))
    assert result.total == len(samples) == 9 and result.violations == 0
    finishes = set()
    for s in samples:
        if s.finish_reason.startswith("skipped"):
            assert s.finish_reason == "skipped:earlier_turn"
            continue
        prompt = ints(s.prompt_ids)
        if s.source["turn"] == 0:  # rendered exactly as the template renders the question
            question = next(line for line in _questions(prompts) if line[0] == s.source)
            text = tok.apply_chat_template(
                [{"role": "user", "content": question[1]}],
                tokenize=False,
                add_generation_prompt=True,
            )
            assert prompt == tok.encode(text, add_special_tokens=False)
        ids = torch.tensor([prompt])
        with torch.no_grad():
            want = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=MAX_TOKENS,
                eos_token_id=[stop],
                pad_token_id=stop,
            )[0, len(prompt) :].tolist()
        assert ints(s.completion_ids) == want, s.sample_id
        finish = "stop" if want[-1] == stop else "length"
        assert s.finish_reason == finish
        assert finish == "stop" or len(want) == MAX_TOKENS
        assert s.server["api"] == "hf" and s.metadata["sampling"]["max_tokens"] == MAX_TOKENS
        finishes.add(finish)
    assert finishes == {"stop", "length"}
    # The dataset round-trips: exported to JSONL and imported back, every sample is equal.
    jsonl = tmp_path / "ds.jsonl"
    quiet = OutputOptions(quiet=True)
    convert.run(convert.ConvertConfig(out, jsonl, output=quiet))
    convert.run(convert.ConvertConfig(jsonl, tmp_path / "back", output=quiet))
    back = {s.sample_id: s for s in Dataset(tmp_path / "back")}
    assert back.keys() == {s.sample_id for s in samples}
    for s in samples:
        b = back[s.sample_id]
        assert ints(b.prompt_ids) == ints(s.prompt_ids)
        assert ints(b.completion_ids) == ints(s.completion_ids)
        assert (b.finish_reason, b.metadata, b.source) == (s.finish_reason, s.metadata, s.source)
    assert Dataset(out).verify() == []


def _questions(prompts: list[Path]):
    """(the source gen records for a first turn, the question) per prompt line."""
    import json

    for path in prompts:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            yield (
                {"file": path.name, "line": n, "turn": 0, "index": 0},
                json.loads(line)["turns"][0],
            )


def test_sampling_with_a_seed_reproduces_on_rerun(tmp_path, target, capfd, monkeypatch):
    prompts = [prompt_file(tmp_path, 3, QA)]
    out = tmp_path / "ds"
    opts = {"temperature": 0.9, "top_k": 50, "sampling_seed": 5, "n": 2, "max_tokens": 8}
    run_hf(prompts, out, target, **opts)
    first = {s.sample_id: ints(s.completion_ids) for s in Dataset(out)}
    # The same settings from the command line, starting afresh.
    code, stdout, stderr = cli(
        capfd,
        monkeypatch,
        "gen",
        str(prompts[0]),
        str(out),
        "--engine",
        "hf",
        "--target",
        str(target),
        "--temperature",
        "0.9",
        "--top-k",
        "50",
        "--sampling-seed",
        "5",
        "--n",
        "2",
        "--max-tokens",
        "8",
        "--commit-every",
        "3",
        "--overwrite",
        "--json",
        "-q",
    )
    assert code == 0, stderr
    assert orjson.loads(stdout)["written"] == 6
    second = {s.sample_id: ints(s.completion_ids) for s in Dataset(out)}
    assert second == first
    # The two samples of each prompt have their own seeds, so they differ (sampling is on).
    by_prompt: dict[int, list] = {}
    for s in Dataset(out):
        by_prompt.setdefault(s.source["line"], []).append(tuple(ints(s.completion_ids)))
    assert all(len(set(pair)) == 2 for pair in by_prompt.values())

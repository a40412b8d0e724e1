"""Build examples/tiny.jsonl: twelve Qwen3 token samples from real third-party data.

    python examples/make_tiny.py [OUT]                  # OUT defaults to examples/tiny.jsonl
    python examples/make_tiny.py --save-tokenizer DIR   # the Qwen3 tokenizer, for --tokenizer

Deterministic and offline. It reads the project's test data collection, whose SOURCES.md
records where every file came from; each file is looked up in ``$EAGLE3KIT_TESTDATA``, then in
the repository's copy ``tests/data/``, then in ``../shared/testdata`` beside the repository.
examples/README.md says which file each sample is taken from and what was reconstructed.

* Tokenizer: Qwen3, rebuilt from ``tokenizers/qwen3/qwen.tiktoken`` (the Qwen BPE ranks) and
  ``tokenizers/qwen3/tokenizer_config.json`` (the 26 added tokens) with transformers'
  TikTokenConverter (needs the ``tiktoken`` package).
* Chat template: ``chat_templates/llama.cpp/Qwen-Qwen3-0.6B.jinja`` (Qwen3's first release).
* Prompts: EAGLE's copies of MT-Bench, GSM8K and HumanEval (``prompts/eagle/``), and the
  request examples of Dynamo's tool-calling docs for the recorded Qwen3 streams.
* Completions: the recorded Qwen3-0.6B streams in ``responses/dynamo-vllm/qwen3-0.6B/``
  (real model output, think tokens included), the recorded SGLang ``/generate`` output ids of
  DeepSeek-R1-Distill-Qwen-7B (same BPE ranks as Qwen3), and otherwise the reference answers
  the prompt sets ship (human-written, not model output). Metadata says which.

Each line uses the key order `eagle3kit convert` writes on export, so importing this file
and exporting the dataset again gives back the same bytes.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
from pathlib import Path

import orjson

from eagle3kit.format import make_sample_id

HERE = Path(__file__).resolve().parent
ROOTS = [Path(p) for p in (os.environ.get("EAGLE3KIT_TESTDATA"),) if p] + [
    HERE.parent / "tests" / "data",
    HERE.parent.parent / "shared" / "testdata",
]
TEMPLATE = "chat_templates/llama.cpp/Qwen-Qwen3-0.6B.jinja"
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
IM_END, THINK, END_THINK = 151645, 151667, 151668
R1_END_THINK = 151649  # </think> in DeepSeek-R1-Distill-Qwen's vocabulary


def data(path: str) -> Path:
    """A test data file by its path in shared/testdata (SOURCES.md), wherever a copy is."""
    # tests/data keeps the chat templates in one folder, without llama.cpp/.
    names = [path, path.replace("chat_templates/llama.cpp/", "chat_templates/")]
    for root in ROOTS:
        for name in names:
            if (root / name).is_file():
                return root / name
    raise FileNotFoundError(
        f"{path}: not in {', '.join(map(str, ROOTS))}; "
        "set EAGLE3KIT_TESTDATA to a copy of shared/testdata"
    )


def qwen3_tokenizer():
    """The Qwen3 tokenizer, rebuilt offline: BPE ranks plus the added tokens at their ids."""
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = data("tokenizers/qwen3/qwen.tiktoken")
    backend = TikTokenConverter(str(ranks), pattern=QWEN2_SPLIT).converted()
    backend.normalizer = normalizers.NFC()
    config = json.loads(data("tokenizers/qwen3/tokenizer_config.json").read_text())
    for token_id, spec in sorted(config["added_tokens_decoder"].items(), key=lambda kv: int(kv[0])):
        token = AddedToken(spec["content"], special=spec["special"], normalized=False)
        backend.add_special_tokens([token]) if spec["special"] else backend.add_tokens([token])
        assert backend.token_to_id(spec["content"]) == int(token_id), spec
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )


class Renderer:
    def __init__(self) -> None:
        self.tok = qwen3_tokenizer()
        self.template = data(TEMPLATE).read_text()

    def prompt(self, messages: list[dict], **kwargs) -> list[int]:
        text = self.tok.apply_chat_template(
            messages,
            chat_template=self.template,
            tokenize=False,
            add_generation_prompt=True,
            **kwargs,
        )
        return self.tok.encode(text, add_special_tokens=False)

    def text(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)


def record(
    source_name: str,
    messages: list[dict],
    turn: int,
    prompt_ids: list[int],
    completion_ids: list[int],
    finish_reason: str,
    partition: str,
    metadata: dict,
    *,
    index: int = 0,
    **optional,
) -> dict:
    """One JSONL line, keys in the order `eagle3kit convert` exports them."""
    rec = {
        "sample_id": make_sample_id(source_name, messages, turn, index),
        "prompt_ids": prompt_ids,
        "completion_ids": completion_ids,
        "finish_reason": finish_reason,
        "partition": partition,
        "metadata": metadata,
    }
    for key in ("source", "server", "latency", "counts"):
        if optional.get(key) is not None:
            rec[key] = optional[key]
    return rec


# Recorded Qwen3-0.6B streams (vLLM behind Dynamo, reasoning parser off) ------------------
# The requests were not recorded. Messages and tools come from the request examples of
# ai-dynamo/dynamo docs/agents/tool-calling.md @ 250cdc899087c525707f52da4bf8b73240dcb9fa,
# which call the same functions with the same arguments; the fourth question is the one the
# model quotes in its own reasoning. The server counted 16-18 fewer prompt tokens than this
# rendering, so the recorded tool definitions differed a little: metadata keeps both counts.
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a given location",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {
                    "type": "string",
                    "description": "City and state, e.g., 'San Francisco, CA'",
                },
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["location", "unit"],
        },
    },
}
TIME_NYC = {
    "type": "function",
    "function": {
        "name": "get_current_time_nyc",
        "description": "Get the current time in NYC.",
        "parameters": {},
    },
}
ATTRACTIONS = {
    "type": "function",
    "function": {
        "name": "get_tourist_attractions",
        "description": "Get a list of top tourist attractions for a given city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {
                    "type": "string",
                    "description": "The name of the city to find attractions for.",
                }
            },
            "required": ["city"],
        },
    },
}
STREAMS = [  # (recording id, user message, tools, docs example)
    (
        "8f33c28b-cb52-4272-9ac5-0cb9f80386d3",
        "What's the weather like in San Francisco in Celsius?",
        [WEATHER],
        "example 1",
    ),
    (
        "2bd5b0c6-1de1-4cfe-9f94-d682c4e44204",
        "What's the current time in New York?",
        [WEATHER, TIME_NYC],
        "example 2",
    ),
    (
        "5dc4c60a-9121-43e0-b42b-2a2c10a52a8a",
        "I'm planning a trip to Tokyo next week. what are some top tourist attractions in Tokyo? ",
        [ATTRACTIONS],
        "example 3",
    ),
    (
        "5627a4c6-39a4-4d9c-8f6a-0f2d853dc50e",
        "How's your day going in NYC?",
        [WEATHER],
        "quoted in the model's reasoning",
    ),
]


def stream_samples(r: Renderer) -> list[dict]:
    out = []
    for rid, question, tools, where in STREAMS:
        path = f"responses/dynamo-vllm/qwen3-0.6B/chat_completion_stream_{rid}.json"
        chunks = json.loads(data(path).read_text())["data"]
        deltas = [c["data"]["choices"][0]["delta"].get("content") or "" for c in chunks]
        usage = json.loads(chunks[-1]["comment"][0])
        # Each streamed delta carries one token's text (a split emoji arrives whole), so the
        # text is tokenized delta by delta; the stream ended with <|im_end|>, which vLLM does
        # not print but counts in output_tokens.
        completion = [t for d in deltas if d for t in r.text(d)] + [IM_END]
        assert completion[:-1] == r.text("".join(deltas))
        assert len(completion) == usage["output_tokens"], (rid, len(completion), usage)
        messages = [{"role": "user", "content": question}]
        prompt = r.prompt(messages, tools=tools)
        out.append(
            record(
                "dynamo/tool-calling",
                messages,
                0,
                prompt,
                completion,
                "stop",
                "tool-use",
                {
                    "origin": f"testdata/{path}",
                    "reconstructed": True,
                    "completion": "recorded Qwen3-0.6B stream text, one token per delta",
                    "prompt": f"rebuilt from the Dynamo tool-calling docs ({where}); the server "
                    f"counted {usage['input_tokens']} prompt tokens, this has {len(prompt)}",
                },
                source={"name": "dynamo/tool-calling", "request_id": f"chatcmpl-{rid}"},
                server={
                    "engine": "vllm",
                    "via": "dynamo",
                    "model": "Qwen/Qwen3-0.6B",
                    "endpoint": "/v1/chat/completions",
                },
                counts={"completion_tokens": usage["output_tokens"]},
            )
        )
    return out


# A recorded SGLang /generate response that hit max_new_tokens ----------------------------
def sglang_length_sample(r: Renderer) -> dict:
    path = "responses/sglang-docs/structured_outputs_for_reasoning_models.md"
    with open(data(path), encoding="utf-8", newline="") as f:
        line = f.read().split("\n")[482]  # line 483
    response = ast.literal_eval(line.strip())
    ids = response["output_ids"]
    meta = response["meta_info"]
    # R1-Distill-Qwen shares Qwen3's BPE ranks below 151643; only </think> has another id.
    assert all(t < 151643 or t == R1_END_THINK for t in ids)
    completion = [END_THINK if t == R1_END_THINK else t for t in ids]
    assert r.tok.decode(completion) == response["text"]
    # The docs' request sent this question in the assistant role; it is a user's question, and
    # R1's template ends the prompt with "<think>\n", so the Qwen3 prompt does too.
    messages = [
        {
            "role": "user",
            "content": "Give me the information and population of the "
            "capital of France in the JSON format.",
        }
    ]
    prompt = r.prompt(messages) + r.text("<think>\n")
    return record(
        "sglang-docs/structured-outputs",
        messages,
        0,
        prompt,
        completion,
        meta["finish_reason"]["type"],
        "json",
        {
            "origin": f"testdata/{path}, line 483",
            "reconstructed": True,
            "completion": "recorded output_ids of DeepSeek-R1-Distill-Qwen-7B (json_schema "
            "constrained), </think> mapped to Qwen3's id; re-tokenizing its text "
            f"gives other ids ({len(r.text(response['text']))}, not {len(ids)})",
            "prompt": "re-rendered with the Qwen3 template; the server counted "
            f"{meta['prompt_tokens']} prompt tokens with R1's template",
        },
        source={"name": "sglang-docs/structured-outputs", "request_id": meta["id"]},
        server={
            "engine": "sglang",
            "model": "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B",
            "endpoint": "/generate",
            "sampling": {"temperature": 0, "max_new_tokens": 2048},
        },
        latency=meta["e2e_latency"],
        counts={
            "completion_tokens": meta["completion_tokens"],
            "reasoning_tokens": meta["reasoning_tokens"],
        },
    )


# Prompt sets and the reference answers they ship ------------------------------------------
PICKS = [  # (set, question_id, turn, partition)
    ("mt_bench", 101, 0, "reasoning"),
    ("mt_bench", 111, 0, "math"),
    ("mt_bench", 111, 1, "math"),
    ("mt_bench", 121, 0, "coding"),
    ("gsm8k", 0, 0, "math"),
    ("humaneval", 0, 0, "coding"),
    ("mt_bench", 81, 0, "writing"),  # no reference answer: a skipped sample
]


def reference_samples(r: Renderer) -> list[dict]:
    out = []
    for name, qid, turn, partition in PICKS:
        path = f"prompts/eagle/{name}/question.jsonl"
        rows = [json.loads(line) for line in data(path).read_text().splitlines()]
        row = next(row for row in rows if row["question_id"] == qid)
        refs = row.get("reference") or []
        # One sample per assistant turn: earlier turns enter the history with their answers.
        messages: list[dict] = []
        for t in range(turn):
            messages += [
                {"role": "user", "content": row["turns"][t]},
                {"role": "assistant", "content": refs[t]},
            ]
        messages.append({"role": "user", "content": row["turns"][turn]})
        prompt = r.prompt(messages, enable_thinking=False)
        source = {"name": f"eagle/{name}", "question_id": qid, "turn": turn}
        if turn < len(refs):
            completion = [*r.text(refs[turn]), IM_END]
            finish = "stop"
            meta = {
                "origin": f"testdata/{path}",
                "reconstructed": True,
                "completion": "the set's reference answer (human-written, not model "
                "output), as a Qwen3 turn with thinking off",
            }
        else:
            completion, finish = [], "skipped:no-recorded-response"
            meta = {
                "origin": f"testdata/{path}",
                "completion": "none: the set ships no reference answer for this question",
            }
        out.append(
            record(
                f"eagle/{name}",
                messages,
                turn,
                prompt,
                completion,
                finish,
                partition,
                meta,
                source=source,
            )
        )
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("out", nargs="?", type=Path, default=HERE / "tiny.jsonl")
    parser.add_argument(
        "--save-tokenizer",
        metavar="DIR",
        type=Path,
        help="instead: save the rebuilt Qwen3 tokenizer and its chat template to "
        "DIR (for `eagle3kit convert --tokenizer DIR`)",
    )
    args = parser.parse_args(argv)
    try:
        r = Renderer()
        if args.save_tokenizer:
            r.tok.chat_template = r.template
            r.tok.save_pretrained(str(args.save_tokenizer))
            print(f"saved the Qwen3 tokenizer to {args.save_tokenizer}", file=sys.stderr)
            return 0
        records = [*stream_samples(r), sglang_length_sample(r), *reference_samples(r)]
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.out.write_bytes(b"".join(orjson.dumps(rec) + b"\n" for rec in records))
    tokens = sum(len(x["prompt_ids"]) + len(x["completion_ids"]) for x in records)
    print(f"wrote {len(records)} samples, {tokens:,} tokens, to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

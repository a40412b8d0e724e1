"""validate over a 10M-token dataset on one core, against the usual per-sample approach.

The per-sample approach (what validators commonly do): decode each sample's prompt and
completion to text with special tokens kept, find the think markers and the end-of-turn by
string search, and re-render the chat template for the round trip. `eagle3kit validate`
runs its checks as numpy passes over each shard's flat token array instead, and renders only
for the round trip. Both run in this process, pinned to one core, on the same dataset
(Qwen3 tokenizer rebuilt offline as in the tests, or with `--family gpt-oss` the gpt-oss
stand-in and its harmony channels; completions of random ordinary tokens between the real
markers; the source messages stored so the round trip runs in both).

    python benchmarks/validate_bench.py [--family qwen3|gpt-oss] [--tokens 10_000_000]
                                        [--workdir DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# One core, for both sides, before numpy and tokenizers start their thread pools.
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS"):
    os.environ[var] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
if hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})

import numpy as np  # noqa: E402
from _common import with_testkit  # noqa: E402

with_testkit()

from real_tokenizers import gpt_oss_tokenizer_dir, qwen3_tokenizer_dir  # noqa: E402

from eagle3kit._options import OutputOptions  # noqa: E402
from eagle3kit.chat import load_renderer  # noqa: E402
from eagle3kit.format import Dataset, DatasetWriter, TokenSample  # noqa: E402
from eagle3kit.validate import ValidateConfig, validate  # noqa: E402


@dataclass(frozen=True)
class Family:
    """How a completion of this model family is laid out, as text."""

    tokenizer_dir: Callable[[Path], Path]
    open: str
    """Opens the reasoning."""
    close: str
    """Closes the reasoning."""
    answer: str
    """Opens the answer after the reasoning is closed ("" when closing opens it)."""
    turn: str
    """What a turn's header starts with: the per-sample tail is the last one onwards."""


FAMILIES = {
    "qwen3": Family(qwen3_tokenizer_dir, "<think>", "</think>", "", "<|im_start|>"),
    "gpt-oss": Family(
        gpt_oss_tokenizer_dir,
        "<|channel|>analysis<|message|>",
        "<|end|>",
        "<|start|>assistant<|channel|>final<|message|>",
        "<|start|>",
    ),
}


def build(path: Path, tok_root: Path, tokens: int, mean_completion: int, fam: Family) -> None:
    renderer = load_renderer(fam.tokenizer_dir(tok_root))
    opening = renderer.encode(fam.open)
    closing = renderer.encode(fam.close + fam.answer)
    stop = renderer.stop_token_ids[:1]
    rng = np.random.default_rng(0)
    identity = renderer.identity()
    where = {k: identity.pop(k) for k in ("tokenizer", "chat_template_file")}
    total, i = 0, 0
    with DatasetWriter(
        path, config={"stage": "gen", "renderer": identity}, provenance=where, commit_every=1000
    ) as writer:
        writer.store_files("tokenizer", renderer.files())
        while total < tokens:
            messages = [{"role": "user", "content": f"Question {i}: explain item {i}."}]
            prompt = renderer.render(messages)
            n = int(rng.integers(mean_completion // 2, mean_completion * 3 // 2))
            body = rng.integers(300, 100_000, n).astype(np.int32)
            cut = n * 3 // 4
            length = i % 50 == 0
            completion = np.concatenate(
                [opening, body[:cut], closing, body[cut:], [] if length else stop]
            ).astype(np.int32)
            writer.add(
                TokenSample(
                    f"s{i:07d}",
                    prompt,
                    completion,
                    finish_reason="length" if length else "stop",
                    partition=("math", "code", "chat")[i % 3],
                    metadata={"messages": messages},
                )
            )
            total += len(prompt) + len(completion)
            i += 1


def per_sample(path: Path, fam: Family) -> dict[str, int]:
    """Decode, string-search, re-render: one sample at a time."""
    ds = Dataset(path)
    renderer = load_renderer(path / "tokenizer")
    found = {"structure": 0, "literal": 0, "truncated": 0, "no_reasoning": 0, "round_trip": 0}
    eos = renderer.decode([renderer.stop_token_ids[0]])
    special = renderer.encode(fam.open)[0]
    for s in ds.iter_samples():
        prompt = renderer.decode(s.prompt_ids.tolist())
        completion = renderer.decode(s.completion_ids.tolist())
        tail = prompt[prompt.rfind(fam.turn) :] + completion
        starts, ends = tail.count(fam.open), tail.count(fam.answer or fam.close)
        if s.finish_reason == "stop" and (starts != 1 or ends != 1 or not completion.endswith(eos)):
            found["structure"] += 1
        # A literal marker is one tokenized as plain text: re-encoding tells them apart.
        if fam.open in completion and special not in renderer.encode(completion):
            found["literal"] += 1
        found["truncated"] += s.finish_reason == "length"
        reasoning = tail.partition(fam.open)[2].partition(fam.close)[0]
        found["no_reasoning"] += not reasoning.strip()
        if renderer.render(s.metadata["messages"]) != s.prompt_ids.tolist():
            found["round_trip"] += 1
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", choices=sorted(FAMILIES), default="qwen3")
    ap.add_argument("--tokens", type=int, default=10_000_000)
    ap.add_argument("--mean-completion", type=int, default=1000)
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="validate-bench-"))
    fam = FAMILIES[args.family]
    path = work / ("dataset" if args.family == "qwen3" else f"dataset-{args.family}")
    if not (path / "manifest.json").exists():
        t = time.perf_counter()
        build(path, work, args.tokens, args.mean_completion, fam)
        print(f"built {path} in {time.perf_counter() - t:.1f}s", file=sys.stderr)
    ds = Dataset(path, verify_shards=False)
    print(f"dataset ({args.family}): {len(ds):,} samples, {ds.num_tokens:,} tokens, one core")
    load_renderer(path / "tokenizer")  # the tokenizer load is the same for both: not timed

    t = time.perf_counter()
    report = validate(ValidateConfig(path, output=OutputOptions(quiet=True)))
    ours = time.perf_counter() - t
    t = time.perf_counter()
    found = per_sample(path, fam)
    theirs = time.perf_counter() - t

    print(
        f"eagle3kit validate: {ours:6.2f} s  ({ds.num_tokens / ours / 1e6:.1f}M tok/s)  "
        f"{report.summary()}"
    )
    print(
        f"per-sample        : {theirs:6.2f} s  ({ds.num_tokens / theirs / 1e6:.1f}M tok/s)  {found}"
    )
    print(f"ratio: {theirs / ours:.1f}x faster (target >= 5x)")


if __name__ == "__main__":
    main()

"""Long contexts: acceptance by context depth for three ways of training the drafter.

A tiny target (eagle3kit.tiny: the stdlib tokenizer, a Llama of hidden size 64 trained for a
few minutes on docstring chats) and data with long contexts, made the cheap way: multi-turn
histories, each sample a run of whole docstring chats (question, reasoning, answer) rendered
by the target's chat template, `--sample-tokens` long, the loss on the assistant turns. The
same token dataset and the same tokens seen (same steps, same `--batch-tokens`) for:

- `truncated`: full attention trained on the first `--truncate` tokens of each sample
  (`train --max-len`), as a drafter trained on short contexts is: the baseline;
- `whole`: full attention trained on whole samples;
- `window W`: a sliding window of W positions (`train --sliding-window W`) on whole samples,
  for each W of `--windows`.

Each drafter is trained by `eagle3kit train --online` (the target in the loop) and measured
on held-out histories of the same length (docstrings the target and drafters never saw):
train's held-out prediction (chain decoding at temperature 0, k drafts, the rounds a decode
makes; positions where the data leaves the target's greedy path are left out), per bucket
of context depth, the position in the sequence where the verification round happens. The
table gives each bucket's acceptance length and its ratio to the baseline's.

    python benchmarks/long_context_bench.py [--quick] [--sample-tokens 2048]
        [--truncate 256] [--windows 64,256] [--steps 80] [--workdir DIR] [--json]

The figures in docs/train.md ("Long contexts") are this command's defaults (about 25
minutes on a busy 2-core machine; a --workdir keeps the target, the data and finished runs).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from eagle3kit._options import OutputOptions
from eagle3kit.checkpoints import load_drafter
from eagle3kit.format import DatasetWriter, TokenSample, has_dataset_files
from eagle3kit.tiny import (
    chat_token_ids,
    docstring_chat,
    make_target,
    make_tokenizer,
    stdlib_docstrings,
    train_target,
)
from eagle3kit.train import TargetBatch, TrainConfig, evaluate
from eagle3kit.train import run as train

QUIET = OutputOptions(quiet=True)
HELD_OUT_EVERY = 8  # as eagle3kit.tiny: every 8th docstring is held out of the target's text


def depth_edges(sample_tokens: int, truncate: int) -> list[int]:
    """Bucket edges for train's held-out prediction (`evaluate(depth_edges=...)`): the
    truncation, then doubling below the sample length."""
    edges = [truncate]
    while edges[-1] * 2 < sample_tokens:
        edges.append(edges[-1] * 2)
    return edges


# Data -------------------------------------------------------------------------------------
def histories(
    tokenizer, docs: list[str], count: int, length: int, seed: int
) -> list[tuple[list[int], list[int]]]:
    """`count` multi-turn histories of exactly `length` tokens: (ids, loss mask), whole
    chats back to back in a seeded order, the loss on each chat's assistant turn."""
    order = torch.Generator().manual_seed(seed)
    chats = chat_token_ids(tokenizer, docs, 1 << 30)
    prompts = [
        len(
            tokenizer(
                tokenizer.apply_chat_template(
                    [{"role": "user", "content": docstring_chat(d)[0]}],
                    tokenize=False,
                    add_generation_prompt=True,
                ),
                add_special_tokens=False,
            )["input_ids"]
        )
        for d in docs
    ]
    out, queue = [], []
    for _ in range(count):
        ids: list[int] = []
        mask: list[int] = []
        while len(ids) < length:
            if not queue:
                queue = torch.randperm(len(chats), generator=order).tolist()
            i = queue.pop()
            ids += chats[i]
            mask += [0] * prompts[i] + [1] * (len(chats[i]) - prompts[i])
        out.append((ids[:length], mask[:length]))
    return out


def write_dataset(path: Path, samples: list[tuple[list[int], list[int]]]) -> Path:
    with DatasetWriter(path, config={"stage": "long_context_bench"}) as w:
        for i, (ids, mask) in enumerate(samples):
            w.add(TokenSample(f"h{i}", ids[:1], ids[1:], loss_mask=mask))
    return path


@torch.no_grad()
def heldout_batch(
    model, samples: list[tuple[list[int], list[int]]], layers: list[int]
) -> TargetBatch:
    """The target's states and greedy tokens on the held-out histories (what extract and
    online training give: aux id k is HF's hidden_states[k])."""
    ids = torch.tensor([s[0] for s in samples])
    mask = torch.tensor([s[1] for s in samples]).bool()
    out = model(input_ids=ids, output_hidden_states=True)
    aux = torch.cat([out.hidden_states[k] for k in layers], dim=-1)
    lengths = torch.full((len(samples),), ids.shape[1])
    return TargetBatch(ids, mask, lengths, aux, out.hidden_states[-1], out.logits.argmax(-1))


# Measuring --------------------------------------------------------------------------------
def by_depth(drafter, batch: TargetBatch, edges: list[int], k: int) -> list[dict]:
    """Train's held-out prediction per context-depth bucket (the depth of a round: the
    tokens its drafts follow), and over every round."""
    result = evaluate(drafter, [batch], k=k, depth_edges=edges)
    rows = [
        {
            "bucket": name,
            "rounds": f["chains"],
            "acceptance_length": f["predicted_acceptance_length"],
        }
        for name, f in result.extra["depths"].items()
    ]
    return [
        *rows,
        {
            "bucket": "all",
            "rounds": result.chains,
            "acceptance_length": result.predicted_acceptance_length,
        },
    ]


def train_variant(work: Path, name: str, target: Path, tokens: Path, args, **options) -> dict:
    run_dir = work / f"run-{name.replace(' ', '-')}"
    started = time.perf_counter()
    result = train(
        TrainConfig(
            [tokens],
            run_dir,
            target,
            online=True,
            max_steps=args.steps,
            batch_tokens=args.batch_tokens,
            draft_vocab=args.draft_vocab,
            lr=args.lr,
            eval_split=0,
            eval_every=0,
            checkpoint_every=args.steps,
            seed=args.seed,
            device="cpu",
            dtype="float32",
            output=QUIET,
            **options,
        )
    )
    return {
        "run": run_dir,
        "tokens": result.tokens,
        "loss": result.loss,
        "seconds": time.perf_counter() - started,
    }


def table(results: dict[str, dict]) -> str:
    names = list(results)
    base = results[names[0]]["depths"]
    head = [
        "depth",
        "rounds",
        *[f"AL {n}" for n in names],
        *[f"{n} / {names[0]}" for n in names[1:]],
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, row in enumerate(base):
        als = [results[n]["depths"][i]["acceptance_length"] for n in names]
        ratios = [f"{a / als[0]:.3f}" if als[0] else "-" for a in als[1:]]
        lines.append(
            "| "
            + " | ".join([row["bucket"], str(row["rounds"]), *[f"{a:.3f}" for a in als], *ratios])
            + " |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="a small run of every part (seconds): the tests' form"
    )
    parser.add_argument("--sample-tokens", type=int, default=2048)
    parser.add_argument(
        "--truncate", type=int, default=256, help="the baseline's --max-len (default 256)"
    )
    parser.add_argument("--windows", default="64,256", help="sliding windows to train")
    parser.add_argument("--samples", type=int, default=48, help="training histories")
    parser.add_argument("--heldout", type=int, default=8, help="held-out histories")
    parser.add_argument("--steps", type=int, default=80, help="optimizer steps, each variant")
    parser.add_argument("--batch-tokens", type=int, default=2048)
    parser.add_argument("--draft-vocab", type=int, default=512)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--target-steps", type=int, default=300)
    parser.add_argument("--k", type=int, default=3, help="drafts per round")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.sample_tokens, args.truncate, args.windows = 256, 64, "32"
        args.samples, args.heldout, args.steps, args.batch_tokens = 4, 2, 3, 256
        args.target_steps, args.draft_vocab = 5, 256
    torch.set_num_threads(1)
    windows = [int(w) for w in args.windows.split(",") if w]
    work = args.workdir or Path(tempfile.mkdtemp(prefix="long-context-bench-"))
    started = time.perf_counter()
    docs = stdlib_docstrings()
    seen = [d for i, d in enumerate(docs) if i % HELD_OUT_EVERY != HELD_OUT_EVERY - 1]
    unseen = [d for i, d in enumerate(docs) if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1]
    target = work / "target"
    if not (target / "tiny_training.json").is_file():  # a --workdir keeps its target
        make_tokenizer(work / "tok")
        make_target(target, work / "tok", max_positions=2 * args.sample_tokens)
        train_target(target, steps=args.target_steps)
    tokenizer = AutoTokenizer.from_pretrained(str(target))
    tokens = work / "tokens"
    if not has_dataset_files(tokens):
        write_dataset(
            tokens, histories(tokenizer, seen, args.samples, args.sample_tokens, args.seed)
        )
    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    layers = [2, model.config.num_hidden_layers // 2, model.config.num_hidden_layers - 3]
    batch = heldout_batch(
        model, histories(tokenizer, unseen, args.heldout, args.sample_tokens, args.seed + 1), layers
    )
    embedding = model.get_input_embeddings().weight.detach()
    variants = {"truncated": {"max_len": args.truncate}, "whole": {}}
    variants.update({f"window {w}": {"sliding_window": w} for w in windows})
    edges = depth_edges(args.sample_tokens, args.truncate)
    results: dict[str, dict] = {}
    for name, options in variants.items():
        trained = train_variant(work, name, target, tokens, args, **options)
        drafter = load_drafter(trained["run"] / "drafter", embedding).eval()
        trained["depths"] = by_depth(drafter, batch, edges, args.k)
        trained["run"] = str(trained["run"])
        results[name] = trained
        loss = "" if trained["loss"] is None else f", loss {trained['loss']:.3f}"  # reused
        print(
            f"{name}: {trained['tokens']:,} tokens seen{loss}, {trained['seconds']:.0f} s",
            file=sys.stderr,
        )
    if args.json:
        print(
            json.dumps(
                {
                    "sample_tokens": args.sample_tokens,
                    "truncate": args.truncate,
                    "steps": args.steps,
                    "k": args.k,
                    "variants": results,
                    "seconds": round(time.perf_counter() - started, 1),
                },
                indent=2,
            )
        )
        return
    print(
        f"Acceptance length by context depth (held out, k={args.k}), histories of "
        f"{args.sample_tokens:,} tokens, {args.steps} steps of {args.batch_tokens:,} tokens "
        f"each; baseline: full attention trained on the first {args.truncate} tokens"
    )
    print(table(results))
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()

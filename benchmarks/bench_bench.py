"""`bench accept`'s speculative decoding against plain greedy decoding of the same target.

Builds the tiny pair of the tests (a random Llama target with the stdlib tokenizer, and a
drafter fitted for a few seconds on the target's own greedy continuations), then runs
`eagle3kit bench accept` on EAGLE's MT-bench and GSM8K prompts. Both decodings run in the
same process on the same device, prompt by prompt: the ratio of their tokens/s is the figure,
printed with the acceptance length, the drafting shape and the temperature.

    python benchmarks/bench_bench.py [--prompts 8] [--max-new-tokens 64] [--k 3]
                                     [--tree TOPK,DEPTH] [--hidden 64] [--layers 8]
                                     [--device cpu] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from _common import DATA, with_testkit

with_testkit()

import torch  # noqa: E402
from bench_fit import fit_drafter, greedy_sequences  # noqa: E402  (the tests' TTT fit)
from transformers import AutoModelForCausalLM  # noqa: E402

from eagle3kit._options import OutputOptions  # noqa: E402
from eagle3kit.bench import AcceptConfig, parse_tree, run_accept  # noqa: E402
from eagle3kit.checkpoints import save_drafter  # noqa: E402
from eagle3kit.model import DrafterConfig, Eagle3Drafter  # noqa: E402
from eagle3kit.tiny import make_target, make_tokenizer, stdlib_docstrings  # noqa: E402

PROMPTS = [
    DATA / "prompts/eagle/mt_bench/question.jsonl",
    DATA / "prompts/eagle/gsm8k/question.jsonl",
]


def build_pair(work: Path, hidden: int, layers: int, fit_steps: int) -> tuple[Path, Path]:
    make_tokenizer(work / "tok", corpus=stdlib_docstrings(100_000))
    target = make_target(
        work / "target", work / "tok", hidden_size=hidden, num_layers=layers, seed=3
    )
    model = AutoModelForCausalLM.from_pretrained(target).eval()
    sequences = greedy_sequences(model, target, 6, 48)
    torch.manual_seed(2)
    drafter = Eagle3Drafter(DrafterConfig.from_target(model.config))
    drafter.load_target_embedding(model.get_input_embeddings().weight)
    fit_drafter(model, drafter, sequences, steps=fit_steps)
    save_drafter(drafter, work / "drafter")
    return target, work / "drafter"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8, help="conversations (default 8)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--tree", metavar="TOPK,DEPTH", help="draft a tree instead of a chain")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--fit-steps", type=int, default=150)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench-bench-") as tmp:
        t0 = time.perf_counter()
        target, drafter = build_pair(Path(tmp), args.hidden, args.layers, args.fit_steps)
        built = time.perf_counter() - t0
        report = run_accept(
            AcceptConfig(
                target,
                drafter,
                PROMPTS,
                k=args.k,
                tree=parse_tree(args.tree),
                max_new_tokens=args.max_new_tokens,
                max_samples=args.prompts,
                device=args.device,
                dtype=args.dtype,
                output=OutputOptions(quiet=True),
            )
        )
    figures = {
        "shape": report.shape,
        "temperature": report.temperature,
        "device": f"{report.device} {report.dtype}",
        "threads": args.threads,
        "target": f"llama {args.layers} layers, hidden {args.hidden}",
        "generations": len(report.prompts),
        "tokens": report.tokens,
        "acceptance_length": report.acceptance_length,
        "per_position": report.per_position,
        "spec_tokens_per_s": report.spec_tokens_per_s,
        "plain_tokens_per_s": report.plain_tokens_per_s,
        "speedup": report.speedup,
        "lossless": report.lossless,
        "near_ties": report.near_ties,
        "pair_build_s": round(built, 1),
    }
    if args.json:
        print(json.dumps(figures, indent=2))
    rates = " ".join(f"{p:.2f}" for p in report.per_position if p is not None)
    print(
        f"bench accept ({report.shape}, temperature {report.temperature:g}, "
        f"{figures['device']}, {figures['target']}): {report.tokens} tokens over "
        f"{len(report.prompts)} generations\n"
        f"  acceptance length {report.acceptance_length:.2f} (per position {rates})\n"
        f"  speculative {report.spec_tokens_per_s:.1f} tok/s vs plain greedy "
        f"{report.plain_tokens_per_s:.1f} tok/s: {report.speedup:.2f}x\n"
        f"  lossless {report.lossless} ({report.near_ties} near-ties)",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()

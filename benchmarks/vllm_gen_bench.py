"""Benchmark `eagle3kit gen` against the OpenAI SDK client on a real vLLM CPU server, and
both against the engine's own throughput, all measured in the same run.

benchmarks/gen_bench.py measures the clients against a stand-in server that answers at once,
where the client sets the pace. Against a real engine the engine sets it: what matters is
how much of the engine's throughput a client leaves on the table. Here:

1. The engine alone: vLLM's offline `LLM.generate` on the same prompt ids with the same
   sampling settings, in the vLLM environment, timed around the generate call only (model
   load and warm-up excluded). That is the ceiling no HTTP client can pass.
2. One server (`python -m vllm.entrypoints.openai.api_server`, vLLM's defaults), then on it,
   alternately and --repeats times each:
   * the OpenAI SDK client (`benchmarks/gen_bench.py _sdk`: AsyncOpenAI with a semaphore,
     rendering each prompt with the same tokenizer and template, `completions.create` with
     the token ids and what gen asks for, one JSON line per answer);
   * `eagle3kit gen --api vllm` (rendering, invariant checks, shard writes and commits).
   Each client is a separate process timed from spawn to exit (imports included), with the
   same prompts, concurrency and max tokens; each run is fresh (a new output).

Printed: req/s of each (the median of the repeats), gen's over the SDK's (the ratio, same
run), and each one's share of the engine's own req/s. The target is a tiny random Llama
(eagle3kit.tiny, heads of 32 so that the CPU attention serves it); completions run to
--max-tokens (a random model seldom stops), so every client does the same work.

    python benchmarks/vllm_gen_bench.py [--prompts 512] [--max-tokens 64] [--concurrency 64]

Needs the vLLM environment (scripts/vllm_env.sh; EAGLE3KIT_VLLM_PYTHON to point elsewhere).
About 6-10 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import REPO, with_testkit

with_testkit()

import launch  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from eagle3kit import tiny  # noqa: E402

SAMPLING = {"temperature": 0.7, "top_p": 1.0, "top_k": -1, "min_p": 0.0}
"""gen's defaults (as in gen_bench.py): every client asks for the same."""

ENGINE = r"""
import json, sys, time
from pathlib import Path

from vllm import LLM, SamplingParams


def main():
    cfg = json.loads(Path(sys.argv[1]).read_text())
    llm = LLM(model=cfg["model"], dtype="float32", max_model_len=2048, seed=0)
    params = SamplingParams(max_tokens=cfg["max_tokens"], stop_token_ids=cfg["stops"],
                            temperature=cfg["temperature"], top_p=cfg["top_p"],
                            top_k=cfg["top_k"], min_p=cfg["min_p"])
    prompts = [{"prompt_token_ids": ids} for ids in cfg["prompts"]]
    llm.generate(prompts[:8], params, use_tqdm=False)  # warm-up
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds,
                      "tokens": sum(len(o.outputs[0].token_ids) for o in outs)}))


if __name__ == "__main__":
    main()
"""


def build(work: Path) -> tuple[Path, list[int]]:
    """A tiny random target and its stop ids."""
    target = tiny.make_target(work / "target")
    tok = AutoTokenizer.from_pretrained(str(target))
    return target, [tok.convert_tokens_to_ids(tiny.IM_END), tok.convert_tokens_to_ids(tiny.EOT)]


def write_prompts(path: Path, target: Path, n: int) -> list[list[int]]:
    texts = tiny.stdlib_docstrings()
    records = [
        [{"role": "user", "content": f"{i}: {texts[i % len(texts)][:200]}"}] for i in range(n)
    ]
    path.write_text("".join(json.dumps({"messages": m}) + "\n" for m in records))
    tok = AutoTokenizer.from_pretrained(str(target))
    return [
        tok.encode(
            tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True),
            add_special_tokens=False,
        )
        for m in records
    ]


def timed(argv: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, "PYTHONPATH": str(REPO), "VLLM_CPU_KVCACHE_SPACE": "1"},
    )  # as launch.py serves
    if proc.returncode:
        causes = [line for line in proc.stderr.splitlines() if "Error" in line]
        raise SystemExit(f"{argv[:4]} failed:\n{proc.stderr[-3000:]}\n" + "\n".join(causes))
    return time.perf_counter() - start, proc.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    python = launch.vllm_python()
    if python is None:
        raise SystemExit(launch.missing_reason())
    work = Path(tempfile.mkdtemp(prefix="vllm-gen-bench-"))
    target, stops = build(work)
    prompt_file = work / "prompts.jsonl"
    ids = write_prompts(prompt_file, target, args.prompts)

    engine_cfg = {
        "model": str(target),
        "max_tokens": args.max_tokens,
        "stops": stops,
        "prompts": ids,
        **SAMPLING,
    }
    (work / "engine.py").write_text(ENGINE)
    # a file, not argv: 512 prompts of ids pass the kernel's limit on one argument
    (work / "engine.json").write_text(json.dumps(engine_cfg))
    _, out = timed([str(python), str(work / "engine.py"), str(work / "engine.json")])
    # vLLM logs to stdout too: the figure is the one line that starts with it
    engine = json.loads(
        next(line for line in reversed(out.splitlines()) if line.startswith('{"seconds"'))
    )
    engine_rps = args.prompts / engine["seconds"]

    server = launch.VllmServer(target, [], name="bench", log_dir=work).start()
    runs: dict[str, list[float]] = {"sdk": [], "gen": []}
    try:
        for r in range(args.repeats):
            sdk_cfg = {
                "url": server.url,
                "tokenizer": str(target),
                "prompts": str(prompt_file),
                "out": str(work / f"sdk-{r}.jsonl"),
                "concurrency": args.concurrency,
                "max_tokens": args.max_tokens,
                "model": str(target),
                "stop_token_ids": stops,
            }
            seconds, _ = timed(
                [
                    str(python),
                    str(REPO / "benchmarks" / "gen_bench.py"),
                    "_sdk",
                    json.dumps(sdk_cfg),
                ]
            )
            runs["sdk"].append(args.prompts / seconds)
            seconds, _ = timed(
                [
                    str(python),
                    "-m",
                    "eagle3kit",
                    "gen",
                    str(prompt_file),
                    str(work / f"gen-{r}"),
                    "--server",
                    server.url,
                    "--api",
                    "vllm",
                    "--tokenizer",
                    str(target),
                    "--concurrency",
                    str(args.concurrency),
                    "--max-tokens",
                    str(args.max_tokens),
                    "-q",
                    "--no-progress",
                ]
            )
            runs["gen"].append(args.prompts / seconds)
    finally:
        server.stop()
    sdk, gen = statistics.median(runs["sdk"]), statistics.median(runs["gen"])
    figures = {
        "prompts": args.prompts,
        "max_tokens": args.max_tokens,
        "concurrency": args.concurrency,
        "engine_req_per_s": engine_rps,
        "engine_tokens": engine["tokens"],
        "sdk_req_per_s": sdk,
        "gen_req_per_s": gen,
        "gen_over_sdk": gen / sdk,
        "gen_share_of_engine": gen / engine_rps,
        "sdk_share_of_engine": sdk / engine_rps,
        "runs": runs,
        "server_start_s": server.seconds_to_start,
    }
    if args.json:
        print(json.dumps(figures, indent=2))
    print(
        f"vLLM CPU, {args.prompts} prompts x {args.max_tokens} tokens, concurrency "
        f"{args.concurrency}\n"
        f"  engine alone (LLM.generate)   {engine_rps:8.1f} req/s\n"
        f"  OpenAI SDK client             {sdk:8.1f} req/s  ({sdk / engine_rps:.0%} of the "
        f"engine)\n"
        f"  eagle3kit gen                 {gen:8.1f} req/s  ({gen / engine_rps:.0%} of the "
        f"engine)\n"
        f"  gen / SDK                     {gen / sdk:8.2f}x",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How long a stage takes to refuse a mistyped path, against importing torch and transformers.

    python benchmarks/refusal_bench.py            # each command 3 times, best kept
    python benchmarks/refusal_bench.py --repeat 5

Each stage's command runs as a whole process with paths that do not exist, the way a typo
reaches it; the baseline, measured in the same run, is `python -c "import torch,
transformers.modeling_utils"`, what a stage that checked its paths after loading would pay
first. The ratio (refusal / baseline) should stay well below 1: the stages check their
paths in their configs, before anything heavy loads (tests/test_cli.py checks that torch is
not imported; this script gives the figure).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

from _common import REPO

STAGES = {
    "train": ["train", "{x}/no-data", "{x}/run", "--target", "{x}/no-target"],
    "export": ["export", "{x}/no-run", "{x}/out"],
    "bench accept": ["bench", "accept", "{x}/no.jsonl", "--target", "{x}", "--drafter", "{x}"],
    "bench server": [
        "bench",
        "server",
        "{x}/no.jsonl",
        "--server",
        "http://127.0.0.1:9",
        "--tokenizer",
        "{x}",
    ],
    "extract": ["extract", "{x}/no-tokens", "{x}/out", "--target", "{x}/no-target"],
    "validate": ["validate", "{x}/nothing"],
    "gen": [
        "gen",
        "{x}/no.jsonl",
        "{x}/out",
        "--server",
        "http://127.0.0.1:9",
        "--tokenizer",
        "{x}",
    ],
}


def best_of(argv: list[str], repeat: int, status: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, env=env)
        times.append(time.perf_counter() - began)
        assert proc.returncode == status, (argv, proc.returncode, proc.stderr)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as x:
        baseline = best_of(
            [sys.executable, "-c", "import torch, transformers.modeling_utils"], args.repeat, 0
        )
        print(f"{'command':<14} {'seconds':>8} {'/ baseline':>10}")
        print(f"{'import torch':<14} {baseline:8.2f} {1:10.2f}")
        for name, argv in STAGES.items():
            seconds = best_of(
                [sys.executable, "-m", "eagle3kit", *(a.format(x=x) for a in argv)], args.repeat, 2
            )
            print(f"{name:<14} {seconds:8.2f} {seconds / baseline:10.2f}")


if __name__ == "__main__":
    main()

"""Benchmark a no-op rerun of `eagle3kit convert` against the first import, in the same run.

What it measures
----------------
A JSONL source of N samples (default 50,000, 50-400 token ids each: the records of
tests/test_crash.py) is imported with `eagle3kit convert SRC DS -q` (a whole process:
imports, lock, parsing, commits and fsyncs). Then the same command runs again over the
finished dataset, which has nothing to add, and once more after K lines (default 1%) are
appended to the source. Figures, each as a ratio against the first import of this run:

1. no-op rerun: wall time / first import's (the rerun used to parse every committed line
   again: 12 s for 50,000, as long as the import's parsing; target <= 0.2);
2. rerun after an append: wall time / first import's (parses only the new lines).

Both reruns must leave the dataset holding every sample exactly once (checked, not timed).
Each figure is the best of `--repeat` runs (default 3); the machine is shared.

    python benchmarks/convert_rerun_bench.py                # 50,000 lines
    python benchmarks/convert_rerun_bench.py --samples 5000 # a quick smoke run
    python benchmarks/convert_rerun_bench.py --json         # figures on stdout
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import REPO, with_testkit

with_testkit()

from random_samples import write_source  # noqa: E402

from eagle3kit.format import Dataset  # noqa: E402


def timed(*args: str | Path) -> float:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "eagle3kit", "convert", *map(str, args), "-q"], check=True, cwd=REPO
    )
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=50_000)
    parser.add_argument("--append", type=float, default=0.01, help="share of lines appended")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="parent of the work directory")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="convert-rerun-", dir=args.dir))
    try:
        src, more = work / "src.jsonl", work / "more.jsonl"
        expected = write_source(src, args.samples, seed=11)
        appended = write_source(more, max(1, int(args.samples * args.append)), seed=12)
        first, noop, grown = [], [], []
        for k in range(args.repeat):
            ds = work / f"ds{k}"
            shutil.copy(work / "src.jsonl", work / "run.jsonl")
            first.append(timed(work / "run.jsonl", ds))
            noop.append(timed(work / "run.jsonl", ds))
            with open(work / "run.jsonl", "ab") as f:
                f.write(more.read_bytes())
            grown.append(timed(work / "run.jsonl", ds))
            ids = list(Dataset(ds).sample_ids())
            assert len(ids) == len(set(ids)) and set(ids) == {*expected, *appended}
            shutil.rmtree(ds)
        figures = {
            "samples": args.samples,
            "appended": len(appended),
            "first_import_s": round(min(first), 3),
            "noop_rerun_s": round(min(noop), 3),
            "append_rerun_s": round(min(grown), 3),
            "noop_ratio": round(min(noop) / min(first), 4),
            "append_ratio": round(min(grown) / min(first), 4),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"first import of {args.samples:,} lines   {figures['first_import_s']:.2f} s\n"
        f"no-op rerun                     {figures['noop_rerun_s']:.2f} s  "
        f"= {figures['noop_ratio']:.3f} x the import (target <= 0.2)\n"
        f"rerun after {len(appended):,} appended lines  {figures['append_rerun_s']:.2f} s  "
        f"= {figures['append_ratio']:.3f} x the import",
        file=sys.stderr,
    )
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()

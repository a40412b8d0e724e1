"""The int32 packer that ships (`struct.pack_into`) against its alternatives, in the same run.

Every sample's token ids reach a shard through `eagle3kit.format.pack_int32_into`.
eagle3kit once shipped an optional C extension for it (`eagle3kit/_fastints.c`, ~2 ns/int
against ~10 for struct); it was removed because users' figures did not move (issue 17).
This script keeps that decision checkable. Legs:

* pure: the shipped `struct.pack_into` path;
* numpy: `np.asarray(ids, dtype="<i4")` copied into the shard buffer, the obvious
  dependency-free alternative (always measured: the baseline every run has);
* c: `_fastints.c` as it was at `--c-rev` (default: the last commit that had it), compiled
  into a temporary folder. Needs a C compiler and this checkout's history; when either is
  missing the leg is left out and the script says so.

Two figures per leg:

* micro: ns per id packing `--micro-ids` ids in rows of 1,000 in this process (best of 5);
* convert: `eagle3kit convert SRC.jsonl DS -q` over `--convert-samples` records (default
  30,000) of 500-1,500 ids (~10% prompt), a whole process, `--repeat` times per leg
  (default 3), legs alternating. The figure is the child's CPU seconds (`os.wait4`: user +
  system), steadier than wall time on a shared machine; wall seconds are shown too. The
  child swaps the packer in every module of `eagle3kit.format` that holds it before running
  the command line: the rest of the process is byte for byte the same.

Ratios are pure over each baseline: below 1 the shipped path is faster.

    python benchmarks/int_pack_bench.py                       # the figures in README.md
    python benchmarks/int_pack_bench.py --convert-samples 3000 --repeat 1   # a quick look
    python benchmarks/int_pack_bench.py --no-c --json         # no compiler; figures on stdout
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gen_bench  # noqa: E402  (its child runner)

from eagle3kit.format import Int32RangeError, pack_int32_into  # noqa: E402

REPO = HERE.parent
C_REV = "052d834"
"""A commit with eagle3kit/_fastints.c (the merge before its removal)."""

# The child: swap the packer for the leg's wherever format/ holds it (by name, so a module
# moved inside format/ is still swapped; the swap is checked), then run the command line.
# A string run by `python -c`: the one place a benchmark reaches inside a room, on purpose.
CHILD = """
import sys
bench_dir, leg = sys.argv.pop(1), sys.argv.pop(1)
if leg != "pure":
    import eagle3kit.format
    sys.path.insert(0, bench_dir)
    from int_pack_bench import packer
    fast, shipped = packer(leg), eagle3kit.format.pack_int32_into
    homes = [m for name, m in list(sys.modules.items()) if name.startswith("eagle3kit.format")
             and getattr(m, "pack_int32_into", None) is shipped]
    assert len(homes) >= 2, homes  # where it is defined, and the writer that calls it
    for module in homes:
        module.pack_int32_into = fast
from eagle3kit.cli import main
sys.argv = ["eagle3kit", *sys.argv[1:]]
main()
"""


def packer(leg: str) -> Callable[..., int]:
    """The leg's pack_int32_into: "numpy", or "c:BUILD_DIR" (BUILD_DIR holds _fastints)."""
    if leg == "numpy":

        def pack_numpy(
            items: Any, out: np.ndarray, offset: int = 0, floor: int | None = None
        ) -> int:
            try:
                arr = np.asarray(items, dtype="<i4")
            except OverflowError as exc:
                raise Int32RangeError(*exc.args) from None
            n = len(arr)
            out[offset : offset + n] = arr
            if floor is not None and n and int(arr.min()) < floor:
                raise ValueError(f"value {int(arr.min())} is below {floor}")
            return n

        return pack_numpy

    sys.path.insert(0, leg.partition(":")[2])
    import _fastints

    def pack_c(items: Any, out: np.ndarray, offset: int = 0, floor: int | None = None) -> int:
        try:
            if floor is not None:
                return _fastints.pack_int32(items, out, offset, floor)
            return _fastints.pack_int32(items, out, offset)
        except OverflowError as exc:
            raise Int32RangeError(*exc.args) from None

    return pack_c


def build_c(rev: str, work: Path) -> Path | str:
    """`_fastints` as it was at `rev`, compiled into work/c-build; or why it could not be."""
    src = work / "c-src"
    src.mkdir()
    show = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{rev}:eagle3kit/_fastints.c"], capture_output=True
    )
    if show.returncode != 0:
        return f"no eagle3kit/_fastints.c at {rev} ({show.stderr.decode().strip()})"
    (src / "_fastints.c").write_bytes(show.stdout)
    (src / "setup.py").write_text(
        "from setuptools import Extension, setup\n"
        "setup(name='fastints', ext_modules=[Extension('_fastints', ['_fastints.c'])])\n"
    )
    out = work / "c-build"
    built = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(out)],
        cwd=src,
        capture_output=True,
    )
    if built.returncode != 0:
        return f"compiling _fastints.c failed: {built.stderr.decode().strip()[-300:]}"
    return out


def micro(pack: Callable[..., int], n_ids: int) -> float:
    """ns per id, best of 5, rows of 1,000 ids (a typical sample) into one buffer."""
    rows = np.random.default_rng(1).integers(0, 152_000, (n_ids // 1000, 1000)).tolist()
    out = np.empty(n_ids, dtype="<i4")
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        at = 0
        for row in rows:
            at += pack(row, out, at, 0)
        best = min(best, time.perf_counter() - t0)
    if out[:1000].tolist() != rows[0]:
        raise SystemExit("a packer wrote the wrong ids")
    return best / n_ids * 1e9


def write_jsonl(path: Path, n: int, seed: int = 0) -> int:
    """n convert records of 500-1,500 ids (~10% prompt); the number of ids written."""
    rng = np.random.default_rng(seed)
    total = 0
    with open(path, "wb") as f:
        for i in range(n):
            length = int(rng.integers(500, 1501))
            ids = rng.integers(0, 152_000, length).tolist()
            split = max(1, length // 10)
            f.write(
                orjson.dumps(
                    {
                        "sample_id": f"s{i}",
                        "prompt_ids": ids[:split],
                        "completion_ids": ids[split:],
                        "finish_reason": "length",
                    }
                )
                + b"\n"
            )
            total += length
    return total


def bench_convert(work: Path, legs: dict[str, str], n: int, repeat: int) -> dict[str, Any]:
    src = work / "convert.jsonl"
    tokens = write_jsonl(src, n)
    runs: dict[str, list[gen_bench.Run]] = {name: [] for name in legs}
    for k in range(repeat):
        for name, leg in legs.items():
            out = work / f"convert-{name}-{k}"
            print(f"convert ({name}, {k + 1}/{repeat}): {n:,} samples...", file=sys.stderr)
            run = gen_bench.run_child(
                [sys.executable, "-c", CHILD, str(HERE), leg, "convert", str(src), str(out), "-q"],
                work,
                f"convert-{name}",
            )
            gen_bench.check_rc(run, f"convert ({name})")
            runs[name].append(run)
            shutil.rmtree(out)
    fig: dict[str, Any] = {"samples": n, "tokens": tokens}
    for name, rs in runs.items():
        fig[name] = {
            "cpu_s": [round(r.cpu_s, 3) for r in rs],
            "wall_s": [round(r.wall_s, 3) for r in rs],
            "cpu_s_median": round(statistics.median(r.cpu_s for r in rs), 3),
            "wall_s_median": round(statistics.median(r.wall_s for r in rs), 3),
        }
    return fig


def ratios(fig: dict[str, Any]) -> dict[str, float]:
    """pure over each other leg: micro ns/id, convert CPU and wall medians."""
    out: dict[str, float] = {}
    for base in fig["micro_ns_per_id"]:
        if base == "pure":
            continue
        out[f"micro_pure_over_{base}"] = round(
            fig["micro_ns_per_id"]["pure"] / fig["micro_ns_per_id"][base], 3
        )
        if "convert" in fig:
            for what in ("cpu", "wall"):
                key = f"{what}_s_median"
                out[f"convert_{what}_pure_over_{base}"] = round(
                    fig["convert"]["pure"][key] / fig["convert"][base][key], 3
                )
    return out


def render(fig: dict[str, Any]) -> str:
    legs = list(fig["micro_ns_per_id"])
    rows = [f"{'':22}" + "".join(f"{leg:>10}" for leg in legs)]
    rows.append(
        f"{'micro ns/id':22}" + "".join(f"{fig['micro_ns_per_id'][leg]:10.2f}" for leg in legs)
    )
    if "convert" in fig:
        c = fig["convert"]
        rows.append(
            f"{'convert cpu s (median)':22}"
            + "".join(f"{c[leg]['cpu_s_median']:10.2f}" for leg in legs)
        )
        rows.append(
            f"{'convert wall s (median)':22}"
            + "".join(f"{c[leg]['wall_s_median']:10.2f}" for leg in legs)
        )
        rows.append(f"({c['samples']:,} samples, {c['tokens']:,} ids)")
    rows += [f"{k}: {v}" for k, v in fig["ratios"].items()]
    if fig.get("c_missing"):
        rows.append(f"c leg left out: {fig['c_missing']}")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--convert-samples", type=int, default=30_000)
    parser.add_argument("--micro-ids", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--c-rev", default=C_REV)
    parser.add_argument("--no-c", action="store_true", help="leave the C leg out")
    parser.add_argument("--no-convert", action="store_true", help="the micro figure only")
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="int-pack-", dir=args.dir))
    try:
        legs = {"pure": "pure", "numpy": "numpy"}
        fig: dict[str, Any] = {
            "cpus": len(os.sched_getaffinity(0)),
            "loadavg_before": os.getloadavg()[0],
        }
        if args.no_c:
            fig["c_missing"] = "--no-c"
        else:
            build = build_c(args.c_rev, work)
            if isinstance(build, Path):
                legs["c"] = f"c:{build}"
                fig["c_rev"] = args.c_rev
            else:
                fig["c_missing"] = build
        packers = {
            "pure": pack_int32_into,
            **{name: packer(leg) for name, leg in legs.items() if name != "pure"},
        }
        fig["micro_ns_per_id"] = {
            name: round(micro(p, args.micro_ids), 3) for name, p in packers.items()
        }
        if not args.no_convert:
            fig["convert"] = bench_convert(work, legs, args.convert_samples, args.repeat)
        fig["ratios"] = ratios(fig)
        fig["loadavg_after"] = os.getloadavg()[0]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(render(fig), file=sys.stderr)
    if args.json:
        print(json.dumps(fig, indent=2))


if __name__ == "__main__":
    main()

"""Ranks of one torchrun job write one dataset; a rerun with another world size resumes it.

Real `torchrun` (torch.distributed.run) with 2 gloo processes on CPU, as DESIGN.md's "Scale"
decision asks: each rank writes its own shards, commits interleave through the commit lock,
and work assigned by sample id lets a 1-process rerun write only what is missing.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from itertools import pairwise
from pathlib import Path
from types import ModuleType

import orjson

from eagle3kit.format import Dataset

SCRIPT = Path(__file__).resolve().parent / "scripts" / "write_ranks.py"
N = 48  # 2 ranks x ~24 samples, committed 3 at a time: ~8 commits each
M = 16
TIMEOUT_S = 180.0


def load_script() -> ModuleType:
    """The script as a module, for its `make_sample` and `owner` (it loads torch only in main)."""
    spec = importlib.util.spec_from_file_location("write_ranks", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def torchrun(nproc: int, out: Path, n: int, report: Path) -> list[dict]:
    """Run the script under torchrun; return each rank's report, by rank."""
    env = dict(os.environ)
    env.pop("EAGLE3KIT_RUN_ID", None)  # the run id must come from rank 0's broadcast
    env["OMP_NUM_THREADS"] = "1"  # torchrun warns and the ranks oversubscribe 2 cores otherwise
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(nproc),
            str(SCRIPT),
            str(out),
            str(n),
            "--report",
            str(report),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return [
        orjson.loads(report.with_name(f"{report.name}.rank{r}.json").read_bytes())
        for r in range(nproc)
    ]


def rank_switches(ranks: list[int]) -> int:
    return sum(a != b for a, b in pairwise(ranks))


def test_two_ranks_write_one_dataset_then_one_rank_resumes(tmp_path: Path) -> None:
    script = load_script()
    ds = tmp_path / "ds"

    reports = torchrun(2, ds, N, tmp_path / "first")
    # Rank 0's broadcast put both ranks in one run, and the id split the work between them.
    assert reports[0]["run_id"] == reports[1]["run_id"]
    for rank, report in enumerate(reports):
        assert report["added"] == sum(
            script.owner(script.sample_id(i), 2) == rank for i in range(N)
        )
        assert report["skipped"] == 0

    dataset = Dataset(ds)
    assert dataset.verify() == []
    shard_ranks = [s["rank"] for s in dataset.shards]
    assert set(shard_ranks) == {0, 1}
    # Each rank writes under its own name...
    assert all(s["name"].startswith(f"r{s['rank']}-") for s in dataset.shards)
    # ...and the commits interleave rather than land as one block per rank.
    assert rank_switches(shard_ranks) >= 3, shard_ranks
    ids = list(dataset.sample_ids())
    assert len(ids) == len(set(ids)) == N
    # Samples come in commit order, shard by shard: the rank that wrote each one, in order.
    writers = [s["rank"] for s in dataset.shards for _ in range(s["samples"])]
    for writer, sample in zip(writers, dataset, strict=True):
        # Each sample was written by the rank its id assigns it to, and holds what it should.
        assert writer == script.owner(sample.sample_id, 2)
        expected = script.make_sample(int(sample.sample_id.split("-")[1]))
        assert list(sample.prompt_ids) == expected.prompt_ids
        assert list(sample.completion_ids) == expected.completion_ids
        assert sample.metadata == expected.metadata
    # One run: the second rank joined it instead of registering a run of its own.
    assert [r["run_id"] for r in dataset.manifest["runs"]] == [reports[0]["run_id"]]
    first_shards = list(dataset.shards)

    # Resume with one process over a superset of the ids: only the M new ones are written.
    (resumed,) = torchrun(1, ds, N + M, tmp_path / "second")
    assert resumed["run_id"] != reports[0]["run_id"]
    assert (resumed["added"], resumed["skipped"]) == (M, N)

    dataset = Dataset(ds)
    assert dataset.verify() == []
    # The first run's shards are untouched (same names and checksums, in place) and the new
    # shards hold exactly the M new samples.
    assert dataset.shards[: len(first_shards)] == first_shards
    new_shards = dataset.shards[len(first_shards) :]
    assert sum(s["samples"] for s in new_shards) == M
    assert {s["rank"] for s in new_shards} == {0}
    ids = list(dataset.sample_ids())
    assert len(ids) == len(set(ids)) == N + M
    assert set(ids) == {script.sample_id(i) for i in range(N + M)}
    assert len(dataset.manifest["runs"]) == 2

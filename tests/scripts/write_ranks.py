"""Write N token samples into one dataset from every rank of a torchrun job (gloo, CPU).

    torchrun --standalone --nproc-per-node 2 tests/scripts/write_ranks.py OUT N [--report P]

The way a multi-rank stage (extract, train) writes: rank 0 makes the run id and broadcasts
it, so every rank joins the one run that owns OUT; work is assigned by sample id, so a rerun
with another number of ranks skips exactly what is committed; each rank writes its own shards
and commits every few samples. Ranks move in lockstep rounds (a barrier after each commit) so
their commits interleave in the manifest instead of landing as two blocks.

`--report P` writes P.rank<R>.json per rank: what it added, skipped and under which run id.
"""

from __future__ import annotations

import argparse
import math
import uuid
from pathlib import Path

import numpy as np
import orjson
import xxhash

from eagle3kit.format import DatasetWriter, TokenSample


def sample_id(i: int) -> str:
    return f"sample-{i:05d}"


def make_sample(i: int) -> TokenSample:
    """Sample `i`, the same in every run and on every rank, so content can be checked."""
    rng = np.random.default_rng(i)
    prompt = rng.integers(0, 50_000, int(rng.integers(3, 30))).tolist()
    completion = rng.integers(0, 50_000, int(rng.integers(1, 30))).tolist()
    return TokenSample(
        sample_id(i), prompt, completion, partition=("a", "b")[i % 2], metadata={"i": i}
    )


def owner(sid: str, world: int) -> int:
    """The rank that writes `sid`: a hash of the id, never a position in a list."""
    return xxhash.xxh3_64_intdigest(sid.encode()) % world


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("n", type=int)
    parser.add_argument("--commit-every", type=int, default=3)
    parser.add_argument("--report", type=Path)
    args = parser.parse_args()

    # Imported here so that the test can import make_sample without loading torch.
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    shared: list[str | None] = [uuid.uuid4().hex if rank == 0 else None]
    dist.broadcast_object_list(shared, src=0)
    run_id = shared[0]
    assert run_id is not None

    ids = [sample_id(i) for i in range(args.n)]
    mine = [i for i, sid in enumerate(ids) if owner(sid, world) == rank]
    # Every rank must call barrier equally often, so the rounds follow the busiest rank.
    busiest = max(sum(owner(sid, world) == r for sid in ids) for r in range(world))
    rounds = math.ceil(busiest / args.commit_every)

    writer = DatasetWriter(
        args.out,
        run_id=run_id,
        rank=rank,
        config={"stage": "write_ranks"},
        commit_every=args.commit_every,
        commit_interval=3600.0,
    )
    # All ranks open before any writes: the later ones join the run the first one set up.
    dist.barrier()
    added = skipped = 0
    with writer:
        for r in range(rounds):
            for i in mine[r * args.commit_every : (r + 1) * args.commit_every]:
                if writer.add(make_sample(i)):
                    added += 1
                else:
                    skipped += 1
            writer.commit()
            dist.barrier()
    if args.report is not None:
        report = {
            "rank": rank,
            "world": world,
            "run_id": run_id,
            "added": added,
            "skipped": skipped,
        }
        path = args.report.with_name(f"{args.report.name}.rank{rank}.json")
        path.write_bytes(orjson.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

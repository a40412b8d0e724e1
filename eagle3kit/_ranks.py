"""This process's place in a torchrun job: rank, world, its device, and the job's run id.

One class for every stage that runs the target under torchrun (extract, train). Without
torchrun (no WORLD_SIZE) it is rank 0 of 1 and no process group is made; torch is imported
only when there is a job, or a device to resolve.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from eagle3kit.target.device import resolve_device

Config = TypeVar("Config")
"""A stage's config: a dataclass with `output` (OutputOptions)."""


@dataclass
class Ranks:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: Any = None
    """The torch.device of this rank, when `start` was given one."""
    run_id: str | None = None
    """The id every rank's writer shares (rank 0 draws it); None for a single process."""
    owns_group: bool = False

    @classmethod
    def start(cls, device: str | None = None) -> Ranks:
        """Join the torchrun job (the process group made here unless one exists) and settle
        this rank's device; `device` None leaves devices to the caller."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if device is None and world == 1:
            return cls()
        import torch

        dev = None
        if device is not None:
            dev = resolve_device(device, local)
            if dev.type == "cuda":
                torch.cuda.set_device(dev)
        if world == 1:
            return cls(device=dev)
        import torch.distributed as dist

        from eagle3kit.format import new_run_id

        owns = not dist.is_initialized()
        if owns:
            gpu = dev.type == "cuda" if dev is not None else torch.cuda.is_available()
            dist.init_process_group("nccl" if gpu else "gloo")
        rank = dist.get_rank()
        # Every rank must join one run: rank 0 draws its id and the others take it.
        shared: list[str | None] = [new_run_id() if rank == 0 else None]
        dist.broadcast_object_list(shared, src=0)
        return cls(rank, world, local, dev, shared[0], owns)

    @classmethod
    @contextmanager
    def joined(cls, device: str | None = None) -> Iterator[Ranks]:
        """This process's place in the job (`start`) for the length of a stage's work, and
        the job left after it (`close`): together with the other ranks when the work
        finished, at once when it raised."""
        ranks = cls.start(device)
        finished = False
        try:
            yield ranks
            finished = True
        finally:
            ranks.close(finished)

    def voiced(self, cfg: Config) -> Config:
        """`cfg` as this rank reports it: one voice, the other ranks only warn and fail
        (their output quiet, without --json)."""
        if not self.rank:
            return cfg
        raw: Any = cfg
        return replace(raw, output=replace(raw.output, quiet=True, json=False))

    def sum(self, t: Any) -> Any:
        """All-reduce `t` in place over the ranks (a sum); `t` itself for one process."""
        if self.world > 1:
            import torch.distributed as dist

            dist.all_reduce(t)
        return t

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def close(self, finished: bool = True) -> None:
        """Leave the job. `finished` (every rank came to the end of its work together) waits for
        the others first: a rank that tore its group down and exited while a peer still
        finished its last collective died now and then in gloo's teardown (SIGABRT,
        "terminate called without an active exception"). A rank that failed does not wait:
        its peers may be in a collective it will never join."""
        if self.owns_group:
            import gc

            import torch.distributed as dist

            if finished:
                dist.barrier()
            # Modules and work objects of the job (FSDP's, the optimizer's) can sit in
            # reference cycles that would hold the group's tensors until interpreter exit.
            gc.collect()
            dist.destroy_process_group()

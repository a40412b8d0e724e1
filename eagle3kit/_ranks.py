"""This process's place in a torchrun job: rank, world, its device, and the job's run id.

One class for every stage that runs the target under torchrun (extract, train). Without
torchrun (no WORLD_SIZE) it is rank 0 of 1 and no process group is made; torch is imported
only when there is a job, or a device to resolve.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from eagle3kit.errors import UserError


def device_problem(device: str) -> str | None:
    """What is wrong with a --device value as written, or None: the configs ask before
    torch loads."""
    if device in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", device or ""):
        return None
    return f"--device must be auto, cpu, cuda or cuda:N (got {device})"


def resolve_device(device: str, local_rank: int = 0) -> str:
    """auto: this rank's GPU when there is one, else cpu; cuda: this rank's GPU. A GPU this
    machine does not have is refused by the flag, before a model is loaded onto it."""
    import torch

    if device == "auto":
        return f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    resolved = f"cuda:{local_rank}" if device == "cuda" else device
    if resolved.startswith("cuda:"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if int(resolved.split(":", 1)[1]) >= count:
            rank = f" (cuda:{local_rank} for local rank {local_rank})" if device == "cuda" else ""
            have = (f"this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
                    if count else "no CUDA device here")
            raise UserError(f"--device {device}{rank}: {have}")
    return resolved


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
            dev = torch.device(resolve_device(device, local))
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

    def close(self) -> None:
        if self.owns_group:
            import torch.distributed as dist

            dist.destroy_process_group()

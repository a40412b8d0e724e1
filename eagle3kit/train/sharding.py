"""How the drafter is spread over the ranks: DDP (a whole copy per rank, the default) or
FSDP2 (`--fsdp`: parameters, gradients and optimizer state sharded over the ranks).

Under FSDP the whole training-time-test loss module is one FSDP unit: its parameters are
gathered when the step's forward pass begins and freed once its backward pass has
reduce-scattered the gradients, so between steps a rank holds 1/world of the weights, the
gradients and the AdamW moments. (The drafter's submodules are not called as modules, and
the decoder layer runs once per training-time-test step, so finer units would gather the
same weights seven times a step.)

Checkpoints are the same files either way: the full weights and the full optimizer state,
gathered onto rank 0 and written as a single-process run writes them (optimizer state keyed
by parameter index, as `Optimizer.state_dict()` has it). So a run checkpointed under FSDP
resumes under DDP, on another number of ranks, or in one process, and the other way round.
Resuming, every rank reads the files and keeps its shard.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, cast

import torch
from torch import nn

PREFIX = "drafter."
"""The drafter's parameters inside the loss module."""


def wrap(loss: nn.Module, world: int, device: torch.device, fsdp: bool) -> nn.Module:
    """The module the steps call: `loss` itself (one process), under DDP, or sharded in
    place with fully_shard (then `loss` is that module)."""
    if world == 1:
        return loss
    if fsdp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        fully_shard(loss, mesh=init_device_mesh(device.type, (world,)))
        return loss
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(
        loss, broadcast_buffers=False, device_ids=[device] if device.type == "cuda" else None
    )


def sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def parallel(model: nn.Module, world: int) -> str:
    """none (one process), ddp or fsdp: how the drafter is spread over the ranks."""
    if world == 1:
        return "none"
    return "fsdp" if sharded(model) else "ddp"


def gradient_sync(model: nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """Micro-batches before the last of a step accumulate locally, without a reduce."""
    if sharded(model):
        model.set_requires_gradient_sync(sync)  # type: ignore[operator]
        return contextlib.nullcontext()
    if sync or not hasattr(model, "no_sync"):
        return contextlib.nullcontext()
    return model.no_sync()  # type: ignore[operator]


@contextlib.contextmanager
def gathered(model: nn.Module) -> Iterator[None]:
    """The whole weights on every rank for the duration (the held-out evaluation calls the
    drafter outside the module's forward). A collective under FSDP."""
    if not sharded(model):
        yield
        return
    model.unshard()  # type: ignore[operator]
    try:
        yield
    finally:
        model.reshard()  # type: ignore[operator]


def local(value: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (clip_grad_norm_ over sharded gradients returns one)."""
    full = getattr(value, "full_tensor", None)
    return full() if full is not None else value


def _full_options() -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_weights(model: nn.Module, drafter: nn.Module) -> dict[str, torch.Tensor] | None:
    """The drafter's state dict, whole, on rank 0 (None on the others under FSDP)."""
    if not sharded(model):
        return drafter.state_dict()
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    # (cast: DCP's value type also covers sharded and nested states; a full one is tensors)
    state = cast(dict[str, torch.Tensor], get_model_state_dict(model, options=_full_options()))
    if not state:
        return None
    return {k.removeprefix(PREFIX): v for k, v in state.items() if k.startswith(PREFIX)}


def full_optimizer_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, names: list[str]
) -> dict | None:
    """The optimizer state as `optimizer.state_dict()` of one process has it, on rank 0."""
    if not sharded(model):
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    # (cast: DCP's type also covers sharded states; a full one is optimizer.state_dict()'s)
    state = cast(
        dict[str, Any], get_optimizer_state_dict(model, optimizer, options=_full_options())
    )
    if not state:
        return None
    index = {name: i for i, name in enumerate(names)}
    return {
        "state": {index[k]: v for k, v in state["state"].items()},
        "param_groups": [
            {**g, "params": [index[n] for n in g["params"]]} for g in state["param_groups"]
        ],
    }


def load_weights(
    model: nn.Module, drafter: nn.Module, weights: dict[str, torch.Tensor]
) -> tuple[list[str], list[str]]:
    """(missing, unexpected) keys, as load_state_dict(strict=False) reports them."""
    if not sharded(model):
        result = drafter.load_state_dict(weights, strict=False)
        return list(result.missing_keys), list(result.unexpected_keys)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    expected = set(drafter.state_dict())
    missing = sorted(expected - set(weights))
    unexpected = sorted(set(weights) - expected)
    if unexpected:
        return missing, unexpected
    set_model_state_dict(
        model,
        {PREFIX + k: v for k, v in weights.items()},
        options=StateDictOptions(full_state_dict=True, strict=False),
    )
    return missing, unexpected


def load_optimizer_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, state: dict, names: list[str]
) -> None:
    """Load a one-process optimizer state dict (keyed by parameter index)."""
    if not sharded(model):
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_optimizer_state_dict,
    )

    by_name: dict[str, Any] = {
        "state": {names[i]: v for i, v in state["state"].items()},
        "param_groups": [
            {**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]
        ],
    }
    set_optimizer_state_dict(
        model, optimizer, by_name, options=StateDictOptions(full_state_dict=True)
    )

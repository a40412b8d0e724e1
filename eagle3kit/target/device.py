"""Where and in which floating-point type the target runs: one device rule, one dtype
vocabulary, one meaning of "auto".

The dtype vocabulary is the one transformers and vLLM spell: auto, bfloat16, float16,
float32. The short spellings eagle3kit took before (bf16, fp16, fp32) are still accepted,
with a note naming the new one. torch is imported only when a device or dtype is resolved:
configs import this module to check their options.
"""

from __future__ import annotations

import re
from typing import Any

from eagle3kit.errors import UserError

DTYPES = ("auto", "bfloat16", "float16", "float32")
"""Every dtype an option may name; each option allows its own subset."""
OLD_SPELLINGS = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
"""The short spellings some commands took before, and the name each now has."""


def parse_dtype(
    value: str,
    flag: str = "--dtype",
    allowed: tuple[str, ...] = DTYPES,
    given_as: str | None = None,
) -> tuple[str, str | None]:
    """(the dtype's name in the one vocabulary, a note for the user or None).

    `value` may be an old spelling, and `given_as` the option's old name (--precision): both
    still work, and the note says what to write now."""
    name = OLD_SPELLINGS.get(value, value)
    if name not in allowed:
        raise UserError(f"{given_as or flag} {value}: expected one of {', '.join(allowed)}")
    if given_as is None and name == value:
        return name, None
    return name, (f"{given_as or flag} {value}: write {flag} {name} (the old spelling still works)")


def resolve_device(name: str, local_rank: int | None = None) -> Any:
    """The torch.device `--device NAME` means. auto: a GPU when there is one, else the CPU;
    under torchrun (`local_rank` given) auto and cuda mean this rank's GPU. A name torch
    does not know, or CUDA where there is none, is refused naming --device."""
    import torch

    cuda = "cuda" if local_rank is None else f"cuda:{local_rank}"
    if name == "auto":
        return torch.device(cuda if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(cuda if name == "cuda" else name)
    except RuntimeError:
        raise UserError(f"--device {name}: not a device (cpu, cuda, cuda:1, ...)") from None
    if device.type == "cuda":
        _check_gpu_index(name, device.index or 0, local_rank, torch)
    return device


def _check_gpu_index(name: str, index: int, local_rank: int | None, torch: Any) -> None:
    """A GPU this machine does not have is refused by the flag, before a model loads onto it."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if index < count:
        return
    rank = (
        f" (cuda:{local_rank} for local rank {local_rank})"
        if count and name == "cuda" and local_rank is not None
        else ""
    )
    have = (
        f"this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
        if count
        else "no CUDA device here"
    )
    raise UserError(f"--device {name}{rank}: {have}")


def device_problem(device: str) -> str | None:
    """What is wrong with a --device value as written, or None: the configs ask before
    torch loads."""
    if device in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", device or ""):
        return None
    return f"--device must be auto, cpu, cuda or cuda:N (got {device})"


def dtype_name(name: str, device: Any, spread: bool = False) -> str:
    """The dtype "auto" means on `device`: float32 on the CPU, bfloat16 on an accelerator or
    for a model spread over GPUs (`spread`, device_map); a named dtype stays itself."""
    if name != "auto":
        return name
    return "float32" if device.type == "cpu" and not spread else "bfloat16"


def resolve_dtype(name: str, device: Any, spread: bool = False) -> Any:
    """The torch dtype of `dtype_name`."""
    import torch

    return getattr(torch, dtype_name(name, device, spread))


def wants_pinned_memory(device: Any) -> bool:
    """Whether host tensors bound for `device` go through pinned (page-locked) memory: on
    CUDA a pinned source lets the copy run without the host waiting for it (non_blocking);
    anywhere else pinning is a wasted copy, and it needs a CUDA driver to exist at all."""
    return str(getattr(device, "type", device)).split(":")[0] == "cuda"


def to_device(tensor: Any, device: Any) -> Any:
    """A host tensor on `device`: pinned and copied without blocking on CUDA (torch's pinned
    allocator keeps the pinned buffer until the copy is done), a plain `.to` elsewhere."""
    if wants_pinned_memory(device):
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)

"""What a train checkpoint holds besides the drafter, read back safely: each process's random
states (a safetensors file: loading it runs nothing) and the optimizer's and scheduler's
torch files (weights_only). Importing it loads no torch.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from eagle3kit.errors import UserError


def save_rng_state(path: Path) -> None:
    """This process's torch, CUDA, numpy and Python random states, as a safetensors file:
    tensors and strings only, so loading it back runs nothing (a pickle would run whatever a
    planted file asks for)."""
    import numpy as np
    import torch
    from safetensors.torch import save_file

    _, keys, pos, has_gauss, cached = np.random.get_state()
    version, mt, gauss_next = random.getstate()
    tensors = {
        "torch": torch.get_rng_state(),
        "numpy_keys": torch.from_numpy(np.asarray(keys, np.int64)),
        "python_mt": torch.tensor(mt, dtype=torch.int64),
    }
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
    tensors.update({f"cuda_{i}": t for i, t in enumerate(cuda)})
    save_file(
        tensors,
        str(path),
        metadata={
            "numpy_pos": str(pos),
            "numpy_has_gauss": str(has_gauss),
            "numpy_cached_gaussian": float(cached).hex(),
            "python_version": str(version),
            "python_gauss_next": "none" if gauss_next is None else float(gauss_next).hex(),
            "cuda_devices": str(len(cuda)),
        },
    )


def load_rng_state(path: Path) -> None:
    """Set this process's random states from `save_rng_state`'s file."""
    import numpy as np
    import torch
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (not a dict)
        gauss = meta["python_gauss_next"]
        numpy_state = (
            "MT19937",
            tensors["numpy_keys"].numpy().astype(np.uint32),
            int(meta["numpy_pos"]),
            int(meta["numpy_has_gauss"]),
            float.fromhex(meta["numpy_cached_gaussian"]),
        )
        python_state = (
            int(meta["python_version"]),
            tuple(int(v) for v in tensors["python_mt"].tolist()),
            None if gauss == "none" else float.fromhex(gauss),
        )
        cuda = [tensors[f"cuda_{i}"] for i in range(int(meta["cuda_devices"]))]
        torch.set_rng_state(tensors["torch"])
        np.random.set_state(numpy_state)
        random.setstate(python_state)
    except Exception as exc:  # safetensors, a missing key, a bad number: the file is damaged
        first = str(exc).strip().splitlines()
        raise UserError(
            f"{path}: not a readable random-state file "
            f"({first[0] if first else type(exc).__name__}); delete the "
            f"checkpoint folder {path.parent.name} to resume from the one before"
        ) from None
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)


def load_tensors(path: Path) -> Any:
    """A checkpoint's torch file (optimizer, scheduler state), read with
    torch.load(weights_only=True): a file that asks to run anything is refused, unrun."""
    from eagle3kit.checkpoints.tensors import BadFile, load_tensor_file

    try:
        return load_tensor_file(path)
    except BadFile as exc:
        raise UserError(
            f"{exc}. Delete the checkpoint folder {path.parent.name} to resume "
            "from the one before, or start afresh with --overwrite"
        ) from None

"""The safe torch-file loader: `torch.load(weights_only=True)`, so a file that asks to run
anything is refused before it runs. It reads SpecForge's hidden-state files (convert) and a
training checkpoint's optimizer and scheduler state (the run directory). Importing it loads
no torch.
"""

from __future__ import annotations

import gzip
import io
import pickle
import re
from pathlib import Path
from typing import Any


class BadFile(ValueError):
    """A file that cannot be used; the message names it."""


def load_tensor_file(path: Path) -> Any:
    """torch.load with weights_only=True (gzip for .gz): tensors and plain containers only.
    Anything else, a crafted payload included, is refused before it can run."""
    import torch

    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                data: Any = io.BytesIO(f.read())
        else:
            data = str(path)
        return torch.load(data, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        # A crafted file names a callable to run ("Unsupported global: GLOBAL io.open ...");
        # the weights-only unpickler stops there, before calling anything.
        found = re.search(r"[Uu]nsupported (?:global: )?GLOBAL ([\w.]+)", str(exc))
        if found:
            raise BadFile(
                f"{path}: refused: it asks to run {found.group(1)}, which "
                "torch.load(weights_only=True) does not allow; eagle3kit never "
                "unpickles more than tensors and plain containers"
            ) from None
        stop = re.search(r"Unsupported operand \d+", str(exc))
        raise BadFile(
            f"{path}: not a readable torch file (weights_only loading stopped: "
            f"{stop.group(0) if stop else 'not a tensor pickle'})"
        ) from None
    except (OSError, EOFError, RuntimeError, ValueError, gzip.BadGzipFile) as exc:
        first = str(exc).strip().splitlines()
        raise BadFile(f"{path}: not a readable torch file ({first[0] if first else exc})") from None

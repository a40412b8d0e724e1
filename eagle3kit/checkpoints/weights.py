"""A checkpoint's weight files, read lazily: names, shapes and dtypes from the file headers,
a tensor's data only when asked for (`Weights`), and a target's input embedding found the same
way (`target_embedding`). `pytorch_model.bin` files are read only with
`torch.load(weights_only=True)`. Importing it loads no torch.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

from eagle3kit.errors import UserError

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


class Weights:
    """A checkpoint's tensors: names, shapes and dtypes from the file headers, data on demand.

    `pytorch_model.bin` files are read only with `torch.load(weights_only=True)`: a pickle
    that holds anything but tensors is refused, never executed.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.files = _weight_files(directory)
        self._where: dict[str, Path] = {}
        self.meta: dict[str, tuple[tuple[int, ...], str]] = {}
        self._bins: dict[Path, dict] = {}
        for f in self.files:
            for name, meta in self._headers(f).items():
                self._where[name] = f
                self.meta[name] = meta

    @property
    def names(self) -> list[str]:
        return list(self.meta)

    def shape(self, name: str) -> tuple[int, ...] | None:
        return self.meta[name][0] if name in self.meta else None

    def _headers(self, f: Path) -> dict[str, tuple[tuple[int, ...], str]]:
        if f.suffix == ".safetensors":
            from safetensors import safe_open

            try:
                with safe_open(str(f), framework="pt") as handle:
                    return {
                        n: (
                            tuple(handle.get_slice(n).get_shape()),
                            _dtype_name(handle.get_slice(n).get_dtype()),
                        )
                        for n in handle.keys()  # noqa: SIM118 (not a dict)
                    }
            except Exception as exc:  # safetensors raises its own error types
                raise UserError(f"{f}: not a readable safetensors file ({exc})") from None
        return {n: (tuple(t.shape), _dtype_name(t.dtype)) for n, t in self._bin(f).items()}

    def _bin(self, f: Path) -> dict:
        if f not in self._bins:
            import torch

            try:
                try:
                    data = torch.load(f, map_location="cpu", weights_only=True, mmap=True)
                except RuntimeError:  # the legacy (non-zip) format cannot be memory-mapped
                    data = torch.load(f, map_location="cpu", weights_only=True)
            except pickle.UnpicklingError as exc:
                raise UserError(
                    f"{f}: holds more than tensors; eagle3kit reads .bin weights "
                    f"only with torch.load(weights_only=True) "
                    f"({str(exc).splitlines()[0]})"
                ) from None
            except (OSError, EOFError, RuntimeError) as exc:
                raise UserError(f"{f}: not a readable PyTorch weights file ({exc})") from None
            if not isinstance(data, dict) or not all(
                isinstance(v, torch.Tensor) for v in data.values()
            ):
                raise UserError(f"{f}: expected a dict of tensors")
            self._bins[f] = data
        return self._bins[f]

    def get(self, name: str):
        f = self._where[name]
        if f.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(f), framework="pt") as handle:
                return handle.get_tensor(name)
        return self._bin(f)[name]

    def all(self) -> dict:
        return {name: self.get(name) for name in self.meta}


def _dtype_name(dtype: Any) -> str:
    """'bfloat16', 'int64', 'bool'... for both torch dtypes and safetensors' 'BF16' codes."""
    text = str(dtype).removeprefix("torch.")
    return {
        "BF16": "bfloat16",
        "F16": "float16",
        "F32": "float32",
        "F64": "float64",
        "I64": "int64",
        "I32": "int32",
        "I16": "int16",
        "I8": "int8",
        "U8": "uint8",
        "BOOL": "bool",
    }.get(text, text)


def _weight_files(directory: Path) -> list[Path]:
    for name in WEIGHT_FILES:
        path = directory / name
        if not path.is_file():
            continue
        if not name.endswith(".index.json"):
            return [path]
        try:
            weight_map = json.loads(path.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as exc:
            raise UserError(f"{path}: not a weights index ({exc})") from None
        files = [directory / f for f in sorted(set(weight_map.values()))]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise UserError(f"{path}: names files that are missing: {', '.join(missing)}")
        return files
    loose = sorted(directory.glob("*.safetensors"))
    if len(loose) == 1:
        return loose
    raise UserError(f"{directory}: no weights found (expected one of {', '.join(WEIGHT_FILES)})")


def target_embedding(target_dir: Path):
    """The target's input embedding as stored (its dtype), or None when it cannot be found."""
    try:
        weights = Weights(target_dir)
    except UserError:
        return None
    for name in (
        "model.embed_tokens.weight",
        "model.language_model.embed_tokens.weight",
        "embed_tokens.weight",
        "transformer.wte.weight",
    ):
        if name in weights.meta:
            return weights.get(name)
    return None

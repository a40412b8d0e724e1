"""Package attributes that load their module on first use (PEP 562).

`eagle3kit.model` and `eagle3kit.train` export torch-backed names, but their light parts
(a config, the acceptance arithmetic) are imported by commands that must answer before torch
loads; a package's `__getattr__` made here imports a name's home module only when asked.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def attribute_loader(package: str, homes: dict[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package`: name -> its submodule in `homes`, kept once read."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(f"{package}.{home}")
        # Every name of that home at once: importing a submodule binds it on the package, so
        # a home named like one of its names (validate's run.py and its `run`) would leave
        # the package's `run` the module once another of its names was read.
        for other, where in homes.items():
            if where == home:
                setattr(sys.modules[package], other, getattr(module, other))
        return getattr(module, name)

    return __getattr__

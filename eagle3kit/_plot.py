"""Figures (the `plot` extra): the one check that --plot can be honoured, and pyplot set up
to draw into files only (Agg: no display, no window). bench and info draw through it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eagle3kit.errors import UserError

PLOT_EXTRA = "pip install 'eagle3kit[plot]'"


def check_plotting(path: Path) -> None:
    """Fail before any work when --plot cannot be honoured."""
    if path.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise UserError(f"--plot {path}: give a .png, .svg or .pdf file name")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UserError(f"--plot needs matplotlib, which is not installed: {PLOT_EXTRA}") from None
    if not path.parent.exists():
        raise UserError(f"--plot {path}: the folder {path.parent} does not exist")


def pyplot() -> Any:
    """matplotlib.pyplot on the file-only backend (a terminal session has no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt

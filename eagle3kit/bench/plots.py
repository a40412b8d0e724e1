"""The figure `bench accept --plot` and `bench server --plot` draw: acceptance per position
(and conditional on the one before), per category and per context depth, on one page.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eagle3kit._plot import pyplot


def acceptance_figure(
    title: str,
    positions: list[float | None],
    conditional: list[float | None],
    categories: dict[str, float | None],
    path: Path,
    depths: dict[str, dict[str, Any]] | None = None,
) -> None:
    """Per position and per category; with `depths`, a third panel: acceptance length
    against context depth, one point a bucket."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3 if depths else 2, figsize=(16 if depths else 11, 4))
    left, right = axes[0], axes[1]
    xs = list(range(1, len(positions) + 1))
    left.bar([x - 0.2 for x in xs], [p or 0 for p in positions], 0.4, label="accepted")
    left.bar(
        [x + 0.2 for x in xs],
        [c or 0 for c in conditional],
        0.4,
        label="given all earlier accepted",
    )
    left.set(
        xlabel="draft position",
        ylabel="acceptance rate",
        ylim=(0, 1),
        xticks=xs,
        title="per position",
    )
    left.legend(fontsize="small")
    names = list(categories)
    right.barh(names, [categories[n] or 0 for n in names])
    right.set(xlabel="acceptance length (tokens per round)", title="per category")
    if depths:
        _depth_panel(axes[2], depths)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _depth_panel(ax: Any, depths: dict[str, dict[str, Any]]) -> None:
    names = list(depths)
    xs = list(range(len(names)))
    ax.plot(xs, [depths[n]["acceptance_length"] for n in names], marker="o")
    for x, name in zip(xs, names, strict=True):
        ax.annotate(
            f"{depths[name]['rounds']} rounds",
            (x, depths[name]["acceptance_length"]),
            textcoords="offset points",
            xytext=(0, 6),
            ha="center",
            fontsize="small",
        )
    ax.set(
        xlabel="context depth (tokens)",
        ylabel="acceptance length (tokens per round)",
        xticks=xs,
        xticklabels=names,
        title="against context depth",
    )
    ax.margins(x=0.1, y=0.15)  # room for the round counts above the points

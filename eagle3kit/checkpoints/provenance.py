"""What `eagle3kit export` writes beside an exported checkpoint (its provenance file: source
run, target, coverage), the training prediction a drafter carries, and whether a directory is
an export.
"""

from __future__ import annotations

import json
from pathlib import Path

from eagle3kit.checkpoints.rundir import read_json_object

PROVENANCE = "eagle3kit-export.json"
"""What `eagle3kit export` writes beside an export's config: source run, target, coverage."""


def read_provenance(checkpoint: Path) -> dict | None:
    """The provenance an export wrote beside a checkpoint; None where there is none."""
    return read_json_object(Path(checkpoint) / PROVENANCE)


def training_prediction(checkpoint: Path) -> dict | None:
    """The `eval` block train wrote into the drafter's config.json, or an earlier export's."""
    try:
        config = json.loads((checkpoint / "config.json").read_text())
    except (OSError, ValueError):
        config = None
    block = config.get("eagle3kit") if isinstance(config, dict) else None
    for data in (block, read_provenance(checkpoint)):
        evaluation = data.get("eval") if isinstance(data, dict) else None
        if isinstance(evaluation, dict):
            return evaluation
    return None


def _exported_here(directory: Path) -> bool:
    provenance = read_provenance(directory) or {}
    return str(provenance.get("written_by", "")).startswith("eagle3kit ")


def is_export(directory: Path) -> bool:
    """Whether `directory` is what `eagle3kit export` wrote: a checkpoint with its provenance
    file, or folders that each are one (--format both), and nothing else."""
    directory = Path(directory)
    if _exported_here(directory):
        return True
    entries = list(directory.iterdir())
    return bool(entries) and all(
        p.is_dir() and not p.is_symlink() and _exported_here(p) for p in entries
    )

"""`validate --write-clean`: a new dataset without the samples any check flagged."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from eagle3kit import _ui
from eagle3kit.format import Dataset, DatasetWriter
from eagle3kit.validate.config import ValidateConfig
from eagle3kit.validate.report import ValidateReport


def _not_copied(entry: Path, folder: bool = False) -> str | None:
    """Why a stored tokenizer entry is left out of the copy; None for a regular file (or,
    with `folder`, a real folder).

    Judged by lstat, never following a link: a dataset from elsewhere may hold a link to a
    file of this machine (a key, a password file), and the copy is meant to be shared on."""
    try:
        mode = os.lstat(entry).st_mode
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    if stat.S_ISLNK(mode):
        return f"a symbolic link (to {os.readlink(entry)})"
    if folder:
        return None if stat.S_ISDIR(mode) else "not a folder"
    return None if stat.S_ISREG(mode) else "not a regular file"


def tokenizer_files(stored: Path) -> list[Path]:
    """The regular files of a dataset's stored tokenizer; each other entry, and the folder
    itself when it is a link, is left out with a warning naming it."""
    why = _not_copied(stored, folder=True) if os.path.lexists(stored) else "absent"
    if why is not None:
        if why != "absent":
            _ui.warn(f"{stored}: {why}; the clean copy has no stored tokenizer")
        return []
    files = []
    for entry in sorted(stored.iterdir()):
        why = _not_copied(entry)
        if why is None:
            files.append(entry)
        else:
            _ui.warn(f"{entry}: {why}; not copied into the clean copy")
    return files


def write_clean(cfg: ValidateConfig, report: ValidateReport) -> dict:
    """Copy every sample no check flagged into cfg.write_clean; the input is not touched."""
    assert cfg.write_clean is not None
    flagged: set[int] = set()
    for c in report.checks:
        flagged.update(c.flagged.tolist())
    ds = Dataset(cfg.path, verify_shards=False)
    _ui.warn_all(ds.warnings)
    kept = 0
    config = dict(ds.manifest.get("config", {}))
    provenance = {
        **ds.manifest.get("provenance", {}),
        "cleaned_from": str(cfg.path),
        "removed_samples": len(flagged),
    }
    with DatasetWriter(cfg.write_clean, config=config, provenance=provenance) as writer:
        _ui.warn_all(writer.warnings)
        files = tokenizer_files(ds.tokenizer_dir)
        if files:
            writer.store_tokenizer(files)
        for i, sample in enumerate(ds.iter_samples()):
            if i not in flagged:
                kept += writer.add(sample)
    return {"path": str(cfg.write_clean), "kept": kept, "removed": len(flagged)}

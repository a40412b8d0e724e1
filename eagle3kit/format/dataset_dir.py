"""The directory of a dataset: its marker, its manifest, and the checks on opening it."""

from __future__ import annotations

import time
from pathlib import Path

from eagle3kit import __version__
from eagle3kit.format._io import read_json, write_json_atomic
from eagle3kit.format.errors import DatasetError
from eagle3kit.format.layout import (
    ATTACHED_DIRS,
    FIRST_READER,
    FORMAT_NAME,
    FORMAT_VERSION,
    KINDS,
    MANIFEST,
    MARKER,
    OWN_FILES,
    RUN_LOCK,
    SHARD_DIR,
    SHARD_SUFFIX,
    TMP_SUFFIX,
)


def is_dataset(path: Path) -> bool:
    return (path / MARKER).is_file()


def read_marker(path: Path, kind: str | None = None) -> dict:
    """The marker, once its format, version and kind are known to be readable here."""
    if not path.exists():
        raise DatasetError(f"{path}: no such directory")
    if not is_dataset(path):
        if (path / RUN_LOCK).exists() and not foreign_files(path):
            raise DatasetError(f"{path}: the dataset's creation was interrupted before anything "
                               "was committed; rerun the command that writes it")
        raise DatasetError(f"{path}: not an eagle3kit dataset (no {MARKER})")
    marker = read_json(path / MARKER)
    if marker.get("format") != FORMAT_NAME:
        raise DatasetError(f"{path / MARKER}: format is {marker.get('format')!r}, "
                           f"expected {FORMAT_NAME!r}")
    version = marker.get("version")
    if not isinstance(version, int):
        raise DatasetError(f"{path / MARKER}: format version {version!r} is not an integer")
    if version > FORMAT_VERSION:
        written_by = marker.get("written_by")
        # Without a release to name, still give a pip command that works (no '>=a newer ...').
        hint = (f"It was written by eagle3kit {written_by}; read it with that release or newer: "
                f"pip install -U 'eagle3kit>={written_by}'" if isinstance(written_by, str)
                and written_by else "Upgrade to read it: pip install -U eagle3kit")
        raise DatasetError(
            f"{path}: dataset format version {version} is newer than this eagle3kit "
            f"({__version__}) reads (up to version {FORMAT_VERSION}). {hint}"
        )
    if version not in FIRST_READER:
        raise DatasetError(f"{path / MARKER}: unknown format version {version}")
    if kind is not None and marker.get("kind") != kind:
        raise DatasetError(f"{path}: a {marker.get('kind')} dataset, expected a {kind} dataset")
    return marker


def create(path: Path, kind: str, config: dict, provenance: dict,
           fixed: dict | None = None) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown dataset kind {kind!r}")
    (path / SHARD_DIR).mkdir(parents=True, exist_ok=True)
    now = time.time()
    write_json_atomic(path / MANIFEST, {
        "format": FORMAT_NAME, "version": FORMAT_VERSION, "kind": kind,
        "created": now, "updated": now, "written_by": __version__,
        "config": config, "config_history": [], "provenance": provenance,
        "runs": [], "shards": [], **(fixed or {}),
    })
    # The marker comes last: a directory with a marker always has a manifest.
    write_json_atomic(path / MARKER, {
        "format": FORMAT_NAME, "version": FORMAT_VERSION, "kind": kind, "written_by": __version__,
    })


def wipe(path: Path) -> None:
    """Remove a dataset's own files (for --overwrite), leaving anything else alone."""
    for name in (MARKER, MANIFEST):
        (path / name).unlink(missing_ok=True)
    for sub in (SHARD_DIR, *ATTACHED_DIRS):
        if (path / sub).is_dir():
            for child in (path / sub).iterdir():
                child.unlink()
            (path / sub).rmdir()


def stray_files(path: Path, manifest: dict) -> tuple[list[Path], list[Path]]:
    """(temp files, sealed shards that no commit names): what a crash can leave behind."""
    committed = {s["name"] for s in manifest.get("shards", [])}
    # Temp files anywhere below (shards/, tokenizer/, ...); no dataset nests deeper than that.
    temps = [*path.glob(f"*{TMP_SUFFIX}"), *path.glob(f"*/*{TMP_SUFFIX}")]
    orphans = []
    shard_dir = path / SHARD_DIR
    if shard_dir.is_dir():
        orphans = [p for p in shard_dir.iterdir()
                   if p.name.endswith(SHARD_SUFFIX) and p.name not in committed]
    return sorted(temps), sorted(orphans)


def foreign_files(path: Path) -> list[str]:
    """Entries in `path` that are not part of a dataset: refuse to write over them."""
    if not path.is_dir():
        return []
    own = {*OWN_FILES, SHARD_DIR, *ATTACHED_DIRS}
    return sorted(p.name for p in path.iterdir()
                  if p.name not in own and not p.name.endswith(TMP_SUFFIX))


def config_changes(old: dict, new: dict) -> list[str]:
    """Settings that differ between the run that started the dataset and this one."""
    return [f"{key}: {old.get(key)!r} -> {new.get(key)!r}"
            for key in sorted(set(old) | set(new)) if old.get(key) != new.get(key)]

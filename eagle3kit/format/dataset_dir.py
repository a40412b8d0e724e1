"""The directory of a dataset: its marker, its manifest, and the checks on opening it.

Everything that removes a file from a dataset lives here, and removes only what a writer
makes: files named by the writers' own patterns (layout.SHARD_NAME, the temp names), that
are regular files, inside the dataset's own folders. A folder of the dataset that is a
symbolic link is refused rather than followed.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

import orjson

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
    PID_TMP_SUFFIX,
    RUN_LOCK,
    SHARD_DIR,
    SHARD_NAME,
    SHARD_TMP_NAME,
    TMP_SUFFIX,
)

MARKER_FIELDS = ("format", "version", "kind", "written_by")


def has_marker(path: Path) -> bool:
    return (path / MARKER).is_file()


def is_dataset(path: Path) -> bool:
    """A directory readers open as a dataset: it has a marker, or lost it (`lost_marker`)."""
    return has_marker(path) or lost_marker(path) is not None


def has_dataset_files(path: Path) -> bool:
    """A marker or a manifest (ours or another tool's) is there: the directory is a dataset's,
    not something else's, even when it cannot be opened as one."""
    return has_marker(path) or (path / MANIFEST).is_file()


def is_regular(path: Path) -> bool:
    """A regular file itself, not a link to one, nor a FIFO, socket or device."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def check_folder(path: Path, sub: str) -> None:
    """Refuse a dataset folder that is a symbolic link or not a folder at all."""
    where = path / sub
    if where.is_symlink():
        raise DatasetError(
            f"{where}: a symbolic link (to {os.readlink(where)}); eagle3kit reads and writes a "
            f"dataset only inside its own directory, so {sub}/ must be a real folder there. "
            f"To keep the data on another disk, move the whole dataset directory there and "
            f"link to it instead (mv {path} /disk/{path.name} && ln -s /disk/{path.name} {path})"
        )
    if where.exists() and not where.is_dir():
        raise DatasetError(
            f"{where}: not a folder; a dataset keeps its {sub} in a folder of that name"
        )


def own_manifest(path: Path) -> dict | None:
    """The manifest at `path` when it is an eagle3kit one (parsed), else None."""
    try:
        manifest = orjson.loads((path / MANIFEST).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return (
        manifest if isinstance(manifest, dict) and manifest.get("format") == FORMAT_NAME else None
    )


def lost_marker(path: Path) -> dict | None:
    """The manifest of a directory whose marker is gone while its manifest lists committed
    shards (a marker deleted, or not copied): the dataset is intact and is read by its
    manifest. None for anything else, a creation interrupted before its marker included."""
    if has_marker(path):
        return None
    manifest = own_manifest(path)
    if manifest is None or not manifest.get("shards"):
        return None
    return manifest


def marker_from(manifest: dict) -> dict:
    """The marker a manifest implies: the marker repeats the manifest's own fields."""
    return {k: manifest.get(k) for k in MARKER_FIELDS}


def restore_marker(path: Path, manifest: dict) -> None:
    write_json_atomic(path / MARKER, marker_from(manifest))


def _too_new(path: Path, version: int, written_by: object) -> DatasetError:
    # Without a release to name, still give a pip command that works (no '>=a newer ...').
    hint = (
        f"It was written by eagle3kit {written_by}; read it with that release or newer: "
        f"pip install -U 'eagle3kit>={written_by}'"
        if isinstance(written_by, str) and written_by
        else "Upgrade to read it: pip install -U eagle3kit"
    )
    return DatasetError(
        f"{path}: dataset format version {version} is newer than this eagle3kit "
        f"({__version__}) reads (up to version {FORMAT_VERSION}). {hint}"
    )


def read_marker(path: Path, kind: str | None = None) -> dict:
    """The marker, once its format, version and kind are known to be readable here."""
    if not path.exists():
        raise DatasetError(f"{path}: no such directory")
    if not path.is_dir():
        raise DatasetError(f"{path}: not a directory")
    check_folder(path, SHARD_DIR)
    where = path / MARKER
    if has_marker(path):
        marker = read_json(where)
    else:
        manifest = lost_marker(path)
        if manifest is None:
            if (path / RUN_LOCK).exists() and not foreign_files(path):
                raise DatasetError(
                    f"{path}: the dataset's creation was interrupted before "
                    "anything was committed; rerun the command that writes it"
                )
            raise DatasetError(f"{path}: not an eagle3kit dataset (no {MARKER})")
        marker, where = marker_from(manifest), path / MANIFEST
    if marker.get("format") != FORMAT_NAME:
        raise DatasetError(f"{where}: format is {marker.get('format')!r}, expected {FORMAT_NAME!r}")
    version = marker.get("version")
    if type(version) is not int:
        raise DatasetError(f"{where}: format version {version!r} is not an integer")
    if version > FORMAT_VERSION:
        raise _too_new(path, version, marker.get("written_by"))
    if version not in FIRST_READER:
        raise DatasetError(f"{where}: unknown format version {version}")
    if marker.get("kind") not in KINDS:
        raise DatasetError(f"{where}: unknown dataset kind {marker.get('kind')!r}")
    if kind is not None and marker.get("kind") != kind:
        raise DatasetError(f"{path}: a {marker.get('kind')} dataset, expected a {kind} dataset")
    return marker


# The manifest's own consistency ------------------------------------------------------------
def _is_count(value: object) -> bool:
    return type(value) is int and value >= 0


def _is_number(value: object) -> bool:
    return type(value) in (int, float)


COUNTS = ("samples", "tokens", "loss_tokens", "completion_tokens")


def _check_partitions(parts: object, at: str) -> str | None:
    if not isinstance(parts, dict):
        return f"{at}.partitions is not an object"
    for name, p in parts.items():
        if not isinstance(p, dict):
            return f"{at}.partitions[{name!r}] is not an object"
        for key in COUNTS:
            if not _is_count(p.get(key)):
                return f"{at}.partitions[{name!r}].{key} is {p.get(key)!r}, not a count"
        finish = p.get("finish")
        if not isinstance(finish, dict) or not all(_is_count(v) for v in finish.values()):
            return f"{at}.partitions[{name!r}].finish is not an object of counts"
        if sum(finish.values()) not in (0, p["samples"]):
            return (
                f"{at}.partitions[{name!r}]: {sum(finish.values())} finish reasons for "
                f"{p['samples']} samples"
            )
    return None


def _check_entry(entry: object, at: str) -> str | None:
    if not isinstance(entry, dict):
        return f"{at} is not an object"
    name = entry.get("name")
    if not isinstance(name, str):
        return f"{at}.name is {name!r}, not a file name"
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        return (
            f"{at}.name is {name!r}: a shard name must be a plain file name inside "
            f"{SHARD_DIR}/, not a path"
        )
    for key in ("bytes", "samples", "tokens", "loss_tokens"):
        if not _is_count(entry.get(key)):
            return f"{at}.{key} is {entry.get(key)!r}, not a count"
    if not isinstance(entry.get("xxh3"), str):
        return f"{at}.xxh3 is {entry.get('xxh3')!r}, not a checksum"
    # Every sample costs a shard at least its 8-byte offset, every token its 4-byte id: counts
    # past that are no shard's, and would size what readers allocate.
    for key, least in (("samples", 8), ("tokens", 4)):
        if entry[key] * least > entry["bytes"]:
            return f"{at}.{key} is {entry[key]}, more than its {entry['bytes']} bytes can hold"
    for key, ok in (("rank", _is_count), ("committed", _is_number)):
        if key in entry and not ok(entry[key]):
            return f"{at}.{key} is {entry[key]!r}"
    why = _check_partitions(entry.get("partitions"), at)
    if why:
        return why
    parts = entry["partitions"].values()
    for key in ("samples", "tokens", "loss_tokens"):
        total = sum(p[key] for p in parts)
        if total != entry[key]:
            return f"{at}.{key} is {entry[key]}, its partitions add up to {total}"
    return None


def _manifest_problem(manifest: dict, marker: dict) -> str | None:
    for key in ("format", "version", "kind"):
        if manifest.get(key) != marker.get(key):
            return f"{key} is {manifest.get(key)!r}, {MARKER} says {marker.get(key)!r}"
    for key, kind, what in (
        ("config", dict, "an object"),
        ("provenance", dict, "an object"),
        ("config_history", list, "a list"),
        ("runs", list, "a list"),
        ("shards", list, "a list"),
    ):
        if not isinstance(manifest.get(key), kind):
            return f"{key} is {type(manifest.get(key)).__name__}, expected {what}"
    for key in ("created", "updated"):
        if key in manifest and not _is_number(manifest[key]):
            return f"{key} is {manifest[key]!r}, not a time"
    for key in ("measured", "skipped", "progress"):
        if key in manifest and not isinstance(manifest[key], dict):
            return f"{key} is not an object"
    if not all(isinstance(r, dict) for r in manifest["runs"]):
        return "an entry of runs is not an object"
    seen: dict[str, int] = {}
    for k, entry in enumerate(manifest["shards"]):
        why = _check_entry(entry, f"shards[{k}]")
        if why:
            return why
        if entry["name"] in seen:
            return (
                f"shard {entry['name']} is listed twice (shards[{seen[entry['name']]}] "
                f"and shards[{k}]): its samples would be read twice"
            )
        seen[entry["name"]] = k
    return None


def check_manifest(path: Path, manifest: dict, marker: dict) -> dict:
    """`manifest`, once it agrees with itself and with `marker`; else a DatasetError naming
    what is wrong. Nothing here reads a shard: the shards' own counts are checked when a
    shard is read with its checksums (`info`, `Dataset.verify`)."""
    where = path / MANIFEST
    version = manifest.get("version")
    if type(version) is int and version > FORMAT_VERSION:
        raise _too_new(path, version, manifest.get("written_by"))
    why = _manifest_problem(manifest, marker)
    if why:
        raise DatasetError(
            f"{where}: manifest damaged ({why}). Restore it from a copy of the "
            "dataset, or rewrite the dataset with --overwrite"
        )
    return manifest


def read_manifest(path: Path, marker: dict) -> dict:
    return check_manifest(path, read_json(path / MANIFEST), marker)


# Writing and cleaning up -------------------------------------------------------------------
def check_writable(path: Path) -> None:
    """Refuse, before anything is written, a dataset whose folders a writer would follow
    out of the directory."""
    for sub in (SHARD_DIR, *ATTACHED_DIRS):
        check_folder(path, sub)


def create(
    path: Path, kind: str, config: dict, provenance: dict, fixed: dict | None = None
) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown dataset kind {kind!r}")
    (path / SHARD_DIR).mkdir(parents=True, exist_ok=True)
    now = time.time()
    write_json_atomic(
        path / MANIFEST,
        {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "kind": kind,
            "created": now,
            "updated": now,
            "written_by": __version__,
            "config": config,
            "config_history": [],
            "provenance": provenance,
            "runs": [],
            "shards": [],
            **(fixed or {}),
        },
    )
    # The marker comes last: a directory with a marker always has a manifest.
    write_json_atomic(
        path / MARKER,
        {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "kind": kind,
            "written_by": __version__,
        },
    )


def wipe(path: Path, manifest: dict | None) -> None:
    """Remove a dataset's own files (for --overwrite), leaving anything else alone.

    Own files are the shards of the writers' name pattern (committed or not), the attached
    files the manifest records (DatasetWriter.store_files), temp files, the marker and the
    manifest; a folder left empty goes too. `manifest` is None when it cannot be read: the
    shards still go by their names, the attached files stay (the new run replaces them)."""
    check_writable(path)
    temps, orphans = stray_files(path, {})  # every shard of the pattern counts as orphan
    doomed = [*temps, *orphans]
    for sub, names in ((manifest or {}).get("attached") or {}).items():
        if sub in ATTACHED_DIRS and isinstance(names, list):
            doomed += [
                path / sub / n for n in names if isinstance(n, str) and n and Path(n).name == n
            ]
    for p in [*doomed, path / MARKER, path / MANIFEST]:
        if is_regular(p):
            p.unlink()
    for sub in (SHARD_DIR, *ATTACHED_DIRS):
        if (path / sub).is_dir() and not any((path / sub).iterdir()):
            (path / sub).rmdir()


def _matching(folder: Path, matches: Callable[[str], object]) -> list[Path]:
    """The regular files in `folder` whose names `matches`; none in a linked folder."""
    if not folder.is_dir() or folder.is_symlink():
        return []
    return [p for p in folder.iterdir() if matches(p.name) and is_regular(p)]


def _pid_temp(name: str, of: tuple[str, ...] | None = None) -> bool:
    """Whether `name` is `<file>.<pid>.tmp`, for one of the files `of` when given."""
    m = PID_TMP_SUFFIX.search(name)
    if m is None or m.end() != len(name) or m.start() == 0:
        return False
    return of is None or name[: m.start()] in of


def stray_files(path: Path, manifest: dict) -> tuple[list[Path], list[Path]]:
    """(temp files, sealed shards that no commit names): what a crash can leave behind.

    Only names a writer gives, regular files, in the dataset's own (unlinked) folders:
    the temp files of its JSON files, of its shards and of its attached files, and sealed
    shards of the writers' name pattern that the manifest does not list."""
    committed = {s.get("name") for s in manifest.get("shards", []) if isinstance(s, dict)}
    shard_dir = path / SHARD_DIR
    temps = [
        *_matching(path, lambda n: _pid_temp(n, OWN_FILES)),
        *_matching(shard_dir, SHARD_TMP_NAME.fullmatch),
    ]
    for sub in ATTACHED_DIRS:
        temps += _matching(path / sub, _pid_temp)
    orphans = [p for p in _matching(shard_dir, SHARD_NAME.fullmatch) if p.name not in committed]
    return sorted(temps), sorted(orphans)


def foreign_files(path: Path) -> list[str]:
    """Entries in `path` that are not part of a dataset: refuse to write over them."""
    if not path.is_dir():
        return []
    own = {*OWN_FILES, SHARD_DIR, *ATTACHED_DIRS}
    found = sorted(
        p.name for p in path.iterdir() if p.name not in own and not p.name.endswith(TMP_SUFFIX)
    )
    if (path / MANIFEST).exists() and not has_marker(path) and own_manifest(path) is None:
        found.insert(0, MANIFEST)  # another tool's manifest.json: not ours to replace
    return found


def config_changes(old: dict, new: dict) -> list[str]:
    """Settings that differ between the run that started the dataset and this one."""
    return [
        f"{key}: {old.get(key)!r} -> {new.get(key)!r}"
        for key in sorted(set(old) | set(new))
        if old.get(key) != new.get(key)
    ]

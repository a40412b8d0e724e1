"""Opening a dataset for writing: the directory checked or created, and, while no other
writer is alive, crash leftovers cleared, --overwrite's wipe, the settings checked against
the manifest's, and this run recorded in it."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import eagle3kit.format.dataset_dir as dataset_dir
from eagle3kit import __version__
from eagle3kit._argv import command_line
from eagle3kit.format._io import write_json_atomic
from eagle3kit.format.errors import DatasetError
from eagle3kit.format.layout import MANIFEST, MARKER


class Opening:
    """A writer's opening checks, run by `DatasetWriter.__init__` (and `_setup` under the
    run lock) over the settings it was given: path, kind, mode, config, force, fixed."""

    path: Path
    kind: str
    run_id: str
    restored_marker: bool
    removed_on_open: list[Path]
    warnings: list[str]
    _mode: str
    _config: dict
    _provenance: dict
    _fixed: dict
    _force: bool

    def _unwritable(self, exc: OSError) -> DatasetError:
        where = exc.filename or self.path
        return DatasetError(
            f"{self.path}: cannot write to the dataset ({where}: {exc.strerror or exc}). "
            "Readers (info, validate, train) need no write access; to add to it, make the "
            "directory writable, or copy it somewhere writable and continue there"
        )

    def _check_target(self) -> None:
        if dataset_dir.is_dataset(self.path):
            return
        if self._mode == "resume":
            raise DatasetError(
                f"{self.path}: nothing to resume (no dataset there); "
                "run without --resume to start one"
            )
        foreign = dataset_dir.foreign_files(self.path)
        if foreign:
            raise DatasetError(
                f"{self.path}: exists and is not an eagle3kit dataset "
                f"(holds {', '.join(foreign[:3])}); choose a new or empty directory"
            )
        if self.path.exists() and not self.path.is_dir():
            raise DatasetError(f"{self.path}: exists and is not a directory")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DatasetError(
                f"{self.path}: cannot create the dataset directory ({exc.strerror or exc})"
            ) from None

    def _setup(self, same_run_before: bool) -> None:
        """Runs while no other writer is alive: clear crash leftovers, wipe, or create."""
        dataset_dir.check_writable(self.path)
        lost = dataset_dir.lost_marker(self.path)
        if lost is not None:
            # The manifest lists committed shards: the data is there, only the marker is
            # gone (deleted, or not copied). Checked like any marker, then written again.
            dataset_dir.read_marker(self.path, self.kind)
            dataset_dir.restore_marker(self.path, lost)
            self.restored_marker = True
            self.warnings.append(
                f"{self.path}: {MARKER} was missing; restored it from "
                f"{MANIFEST}, which lists {len(lost['shards'])} committed "
                "shards"
            )
        if self._mode == "overwrite" and not same_run_before and dataset_dir.has_marker(self.path):
            try:
                old = dataset_dir.read_manifest(self.path, dataset_dir.read_marker(self.path))
            except DatasetError:
                old = None  # a damaged manifest: --overwrite is the way out of it
            dataset_dir.wipe(self.path, old)
        if not dataset_dir.has_marker(self.path):
            dataset_dir.create(self.path, self.kind, self._config, self._provenance, self._fixed)
        marker = dataset_dir.read_marker(self.path, self.kind)
        manifest = dataset_dir.read_manifest(self.path, marker)
        # Refuse other settings before the manifest is touched: a refused run must leave no
        # trace (no entry in "runs"); __init__ checks again for processes that join later.
        self._check_config(manifest)
        temps, orphans = dataset_dir.stray_files(self.path, manifest)
        for p in [*temps, *orphans]:
            p.unlink(missing_ok=True)
        self.removed_on_open = [*temps, *orphans]
        changes = dataset_dir.config_changes(manifest.get("config", {}), self._config)
        if changes and self._force:
            manifest["config_history"].append(manifest.get("config"))
            manifest["config"] = self._config
        if not same_run_before:  # a rank arriving after its run's others left is that run
            manifest["runs"].append(
                {
                    "run_id": self.run_id,
                    "started": time.time(),
                    "host": socket.gethostname(),
                    "pid": os.getpid(),
                    "eagle3kit": __version__,
                    "command": command_line(),
                }
            )
        write_json_atomic(self.path / MANIFEST, manifest)

    def _check_config(self, manifest: dict) -> None:
        fixed = dataset_dir.config_changes({k: manifest.get(k) for k in self._fixed}, self._fixed)
        if fixed:
            raise DatasetError(
                f"{self.path} holds data that cannot be mixed with this run's "
                f"({'; '.join(fixed)}). Write to a new directory, or --overwrite to start afresh."
            )
        changes = dataset_dir.config_changes(manifest.get("config", {}), self._config)
        if changes and not self._force:
            raise DatasetError(
                f"{self.path} was started with other settings ({'; '.join(changes)}). Rerun "
                "with the original settings, add --force to continue with these, or "
                "--overwrite to start afresh."
            )

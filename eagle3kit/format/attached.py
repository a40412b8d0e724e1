"""The folders a dataset keeps beside its shards (the tokenizer and chat template gen used),
copied in durably and recorded in the manifest."""

from __future__ import annotations

from pathlib import Path

import eagle3kit.format.dataset_dir as dataset_dir
from eagle3kit._durable import fsync_dir
from eagle3kit._lock import file_lock
from eagle3kit.format._io import read_json, write_bytes_atomic, write_json_atomic
from eagle3kit.format.layout import ATTACHED_DIRS, COMMIT_LOCK, MANIFEST, TOKENIZER_DIR


class AttachedFiles:
    """A writer's attached folders, under its dataset directory `path`."""

    path: Path

    def store_tokenizer(self, files: list[Path]) -> Path:
        """Store the tokenizer and chat template that made the data (Dataset.tokenizer_dir)."""
        return self.store_files(TOKENIZER_DIR, files)

    def store_files(self, subdir: str, files: list[Path]) -> Path:
        """Copy `files` into DIR/subdir (e.g. the tokenizer and template gen used), durably.

        Later stages read them from there, so they need neither --tokenizer nor the
        original machine. A file already there with the same bytes is left alone.
        """
        if subdir not in ATTACHED_DIRS:
            raise ValueError(f"{subdir!r} is not one of the attached folders {ATTACHED_DIRS}")
        target = self.path / subdir
        dataset_dir.check_folder(self.path, subdir)
        target.mkdir(exist_ok=True)
        names = []
        for src in files:
            data = Path(src).read_bytes()
            dst = target / Path(src).name
            names.append(dst.name)
            if dataset_dir.is_regular(dst) and dst.read_bytes() == data:
                continue
            write_bytes_atomic(dst, data)
        fsync_dir(target)
        # Recorded, so that --overwrite removes these files and no others.
        with file_lock(self.path / COMMIT_LOCK):
            manifest = read_json(self.path / MANIFEST)
            attached = manifest.setdefault("attached", {})
            attached[subdir] = sorted({*attached.get(subdir, []), *names})
            write_json_atomic(self.path / MANIFEST, manifest)
        return target

"""Taking committed samples out of a dataset: the shards holding them rewritten without
them and swapped in by one manifest commit (gen retrying samples it recorded as failed)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3kit._lock import file_lock
from eagle3kit.format._io import read_json, write_json_atomic
from eagle3kit.format.layout import COMMIT_LOCK, MANIFEST, SHARD_DIR


class Dropping:
    """A writer's `drop`, over its commit machinery: `commit`, `_new_buffer`, `_seal` and
    the committed ids `done_ids`."""

    path: Path
    kind: str
    done_ids: set[str]
    committed_samples: int
    _seq: int

    if TYPE_CHECKING:  # the writer's own

        def commit(self, wait: bool = True) -> None: ...
        def _new_buffer(self) -> Any: ...
        def _seal(self, buffer: Any, seq: int) -> dict: ...

    def drop(self, sample_ids: set[str]) -> int:
        """Take these committed samples out of the dataset; returns how many were in it.

        For gen retrying samples it recorded as failed: a sample id is stored once, so its
        old record must go before a new one can be added. Each shard holding one of the ids
        is rewritten without them, and one manifest commit swaps the rewritten shards in;
        the replaced files are removed after it. A crash before that commit leaves the
        dataset as it was, one after it the new state (a leftover file is an orphan that the
        next writer removes): no sample is lost or stored twice either way.
        """
        from eagle3kit.format.reader import Dataset  # reader builds on this module's helpers

        if self.kind != "tokens":
            raise ValueError("drop() applies to token datasets only")
        self.commit()  # what is queued is committed first, so only whole shards are rewritten
        wanted = set(sample_ids) & self.done_ids
        if not wanted:
            return 0
        ds = Dataset(self.path, warn_stray=False)
        replaced: dict[str, dict | None] = {}
        dropped = 0
        for k, entry in enumerate(ds.shards):
            shard = ds._shard(k)
            rows = {i for i, sample_id in enumerate(shard.ids) if sample_id in wanted}
            if not rows:
                continue
            buffer = self._new_buffer()
            for i in range(entry["samples"]):
                if i not in rows:
                    buffer.add(shard.sample(i))
            seq, self._seq = self._seq, self._seq + 1  # first: a name is never given twice
            replaced[entry["name"]] = self._seal(buffer, seq) if len(buffer) else None
            dropped += len(rows)
        with file_lock(self.path / COMMIT_LOCK):
            manifest = read_json(self.path / MANIFEST)
            kept = []
            for entry in manifest["shards"]:
                new = replaced.get(entry["name"], entry)
                if new is not None:
                    kept.append(new)
            manifest["shards"] = kept
            manifest["updated"] = time.time()
            write_json_atomic(self.path / MANIFEST, manifest)
        for name in replaced:  # named by the manifest until now, inside shards/: ours to remove
            (self.path / SHARD_DIR / name).unlink(missing_ok=True)
        self.done_ids -= wanted
        self.committed_samples -= dropped
        return dropped

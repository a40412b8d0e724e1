"""Appending samples to a dataset with checkpointed commits.

Samples collect in memory; a shard is sealed after `commit_every` samples or
`commit_interval` seconds and becomes part of the dataset only when the manifest that names
it has been replaced atomically. A crash therefore loses at most the samples not yet
committed, never damages committed ones, and never duplicates a sample on resume: the
writer knows every committed `sample_id` and `add` skips them.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Literal

import orjson
import xxhash

import eagle3kit.format.dataset_dir as dataset_dir
from eagle3kit._durable import fsync_dir
from eagle3kit._lock import file_lock
from eagle3kit.format._io import read_json, write_json_atomic
from eagle3kit.format.attached import AttachedFiles
from eagle3kit.format.buffer import _Buffer, _TokenBuffer
from eagle3kit.format.drop import Dropping
from eagle3kit.format.errors import DatasetError
from eagle3kit.format.layout import (
    COMMIT_LOCK,
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST,
    SHARD_DIR,
    SHARD_SUFFIX,
)
from eagle3kit.format.lock import RunLock, acquire, new_run_id
from eagle3kit.format.opening import Opening
from eagle3kit.format.reader import read_committed_ids
from eagle3kit.format.sample import TokenSample, check_sample_id
from eagle3kit.format.shard import write_shard

OpenMode = Literal["auto", "resume", "overwrite"]


class DatasetWriter(Opening, AttachedFiles, Dropping):
    """Appends token samples to the dataset at `path`, which it creates or continues.

    `mode`: "auto" continues an existing dataset or starts one, "resume" requires one to
    exist, "overwrite" starts afresh. `config` is the resolved setting of the producing
    stage; continuing with different settings needs `force`. `fixed` holds manifest fields
    set when the dataset is created that no later run may change, `force` or not (what a
    hidden-state dataset's states mean). Processes of one torchrun job share a `run_id` and
    pass their `rank`; each writes its own shards. Besides `commit_every` and
    `commit_interval`, a commit is due once the queued samples hold `commit_bytes`, which
    bounds the memory of writers with big samples (hidden states).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        kind: str = "tokens",
        mode: OpenMode = "auto",
        config: dict | None = None,
        force: bool = False,
        provenance: dict | None = None,
        commit_every: int = 1000,
        commit_interval: float = 60.0,
        commit_bytes: int = 1 << 30,
        fixed: dict | None = None,
        run_id: str | None = None,
        rank: int = 0,
        clock=time.monotonic,
    ) -> None:
        self.path = Path(path)
        self.kind = kind
        self.commit_every = commit_every
        self.commit_interval = commit_interval
        self.commit_bytes = commit_bytes
        self.rank = rank
        self._clock = clock
        self._config = config or {}
        self._force = force
        self._provenance = provenance or {}
        self._fixed = fixed or {}
        self._mode = mode
        self._buffer = self._new_buffer()
        self._token = f"r{rank}-{secrets.token_hex(4)}"
        self._seq = 0
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future | None = None
        self._failed: BaseException | None = None
        """The error of a commit that failed: after it no later sample may be committed."""
        self.removed_on_open: list[Path] = []
        self.restored_marker = False
        """The marker was missing and was written again from the manifest on opening."""
        self.warnings: list[str] = []
        """What the stage should tell its user about opening (format/ prints nothing)."""
        self._progress: dict | None = None
        self._check_target()
        self.run_id = run_id or new_run_id()
        try:
            self._lock: RunLock | None = acquire(self.path, self.run_id, self._setup)
        except OSError as exc:
            raise self._unwritable(exc) from None
        try:
            marker = dataset_dir.read_marker(self.path, kind)
            manifest = dataset_dir.read_manifest(self.path, marker)
            self._check_config(manifest)
            self.done_ids: set[str] = read_committed_ids(self.path, manifest)
        except BaseException:
            self._release()
            raise
        self.progress_at_open: dict | None = manifest.get("progress")
        """What the stage noted with its last commit (`note_progress`), None before any."""
        self._progress_written = self.progress_at_open
        self.committed_samples = len(self.done_ids)
        self._last_commit = clock()

    def _new_buffer(self) -> _Buffer:
        return _TokenBuffer()

    def add(self, sample: TokenSample) -> bool:
        """Queue `sample`; False when its id is already in the dataset or queued."""
        check_sample_id(sample.sample_id)
        self._refuse_after_failure()
        if sample.sample_id in self.done_ids:
            return False
        self._buffer.add(sample)
        self.done_ids.add(sample.sample_id)
        self.maybe_commit()
        return True

    def note_progress(self, progress: dict) -> None:
        """Where the stage stands after the samples added so far (convert: how far into its
        source file), stored in the manifest with the commit that holds those samples and
        read back by the next run as `progress_at_open`. One process per dataset uses it."""
        self._progress = progress

    def maybe_commit(self) -> bool:
        """Commit when `commit_every` samples or `commit_interval` seconds have gathered.

        Call it periodically when samples arrive slowly, so the interval holds.
        """
        due = (
            len(self._buffer) >= self.commit_every
            or (self._buffer.nbytes >= self.commit_bytes)
            or (len(self._buffer) and self._clock() - self._last_commit >= self.commit_interval)
        )
        if due:
            self.commit(wait=False)
        return bool(due)

    @property
    def pending(self) -> int:
        return len(self._buffer)

    def commit(self, wait: bool = True) -> None:
        """Seal the queued samples into a shard and add it to the manifest atomically.

        With `wait=False` (what `maybe_commit` does) the writing and fsyncing run on a
        worker thread while samples keep arriving: disk flushes then overlap the work
        instead of stalling it. At most one commit is in flight, so shards commit in order;
        an error in it is raised by the next commit, add or close, and by every one after:
        samples added after the lost ones (a conversation's later turn, a later stretch of
        a converted file) must not be committed without them.
        """
        self._last_commit = self._clock()
        self._finish_pending()
        self._refuse_after_failure()
        buffer = self._buffer
        if len(buffer):
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="eagle3kit-commit")
            # In this order because a stop signal can land between any two lines: a shard
            # name is never given twice, and queued samples are never committed twice (at
            # worst, cut between the swap and the submit, they are not committed by this
            # run and the next one adds them).
            seq, self._seq = self._seq, self._seq + 1
            self._buffer = self._new_buffer()
            self._pending = self._pool.submit(self._commit_buffer, buffer, seq, self._progress)
        if wait:
            self._finish_pending()

    def _finish_pending(self) -> None:
        pending = self._pending
        if pending is None:
            return
        try:
            pending.result()
        except KeyboardInterrupt:
            # Ctrl-C or a stop signal cut the wait short, not the commit: it stays pending
            # for close() to wait for, and the samples after it may still be committed.
            raise
        except BaseException as exc:
            self._pending, self._failed = None, exc
            raise
        self._pending = None

    def _refuse_after_failure(self) -> None:
        if self._failed is not None:
            raise DatasetError(
                f"{self.path}: nothing more is committed by this run: an "
                f"earlier commit failed ({self._failed})"
            )

    def _commit_buffer(self, buffer: _Buffer, seq: int, progress: dict | None) -> None:
        entry = self._seal(buffer, seq)
        with file_lock(self.path / COMMIT_LOCK):
            manifest = read_json(self.path / MANIFEST)
            manifest["shards"].append(entry)
            manifest["updated"] = entry["committed"]
            if progress is not None:
                manifest["progress"] = progress
            self._amend_manifest(manifest, entry)
            write_json_atomic(self.path / MANIFEST, manifest)
        self._progress_written = progress
        self.committed_samples += len(buffer)

    def _seal(self, buffer: _Buffer, seq: int) -> dict:
        """Write `buffer` as a shard, durably, and return its manifest entry."""
        arrays, partitions = buffer.arrays()
        name = f"{self._token}-{seq:06d}{SHARD_SUFFIX}"
        shard_dir = self.path / SHARD_DIR
        written = write_shard(
            shard_dir / name,
            arrays,
            {
                "format": FORMAT_NAME,
                "version": str(FORMAT_VERSION),
                "kind": self.kind,
                "samples": str(len(buffer)),
                "partitions": orjson.dumps(partitions).decode(),
                # Resuming reads only the ids; their own checksum keeps a damaged id from
                # letting a sample in twice, without reading the whole shard.
                "sample_ids_xxh3": xxhash.xxh3_128_hexdigest(arrays["sample_ids"]),  # type: ignore[arg-type]  # numpy's stubs give ndarray the buffer protocol for Python >= 3.12 only
                **buffer.shard_metadata(),
            },
            buffer.dtypes,
        )
        fsync_dir(shard_dir)
        counts = buffer.entry()
        return {
            "name": name,
            "bytes": written.bytes,
            "xxh3": written.xxh3,
            "samples": len(buffer),
            "tokens": counts.pop("tokens"),
            "loss_tokens": counts.pop("loss_tokens"),
            "rank": self.rank,
            "committed": time.time(),
            "partitions": counts.pop("partitions"),
            **counts,
        }

    def _write_progress(self) -> None:
        """Store a progress note that no commit of samples carried (a run that added none)."""
        if self._progress is None or self._progress == self._progress_written:
            return
        with file_lock(self.path / COMMIT_LOCK):
            manifest = read_json(self.path / MANIFEST)
            manifest["progress"] = self._progress
            write_json_atomic(self.path / MANIFEST, manifest)
        self._progress_written = self._progress

    def _amend_manifest(self, manifest: dict, entry: dict) -> None:
        """Summaries a kind of dataset keeps beside the shard list, updated by each commit."""

    def close(self) -> None:
        """Commit what is queued and give up the dataset."""
        try:
            self.commit()
            self._write_progress()
        finally:
            self._release()

    def _release(self) -> None:
        # The lock outlives any commit still writing: no other run may start under it.
        with contextlib.suppress(DatasetError, OSError):
            self._finish_pending()
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # Whole samples already queued are worth keeping even when the run is interrupted,
        # unless committing is what failed.
        if exc_type is None or not isinstance(exc, DatasetError | OSError):
            self.close()
        else:
            self._release()

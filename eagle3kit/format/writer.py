"""Appending samples to a dataset with checkpointed commits.

Samples collect in memory; a shard is sealed after `commit_every` samples or
`commit_interval` seconds and becomes part of the dataset only when the manifest that names
it has been replaced atomically. A crash therefore loses at most the samples not yet
committed, never damages committed ones, and never duplicates a sample on resume: the
writer knows every committed `sample_id` and `add` skips them.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import orjson
import xxhash
import zstandard

from eagle3kit import __version__
from eagle3kit._argv import command_line
from eagle3kit._durable import fsync_dir
from eagle3kit.format import dataset_dir
from eagle3kit.format._ints import pack_int32_into, to_int32
from eagle3kit.format._io import (
    file_lock,
    read_json,
    write_bytes_atomic,
    write_json_atomic,
)
from eagle3kit.format.errors import DatasetError
from eagle3kit.format.layout import (
    ATTACHED_DIRS,
    COMMIT_LOCK,
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST,
    MARKER,
    SHARD_DIR,
    SHARD_SUFFIX,
    TOKENIZER_DIR,
)
from eagle3kit.format.lock import RunLock, acquire, new_run_id
from eagle3kit.format.reader import read_committed_ids
from eagle3kit.format.sample import IntSeq, TokenSample, check_sample_id
from eagle3kit.format.shard import write_shard

OpenMode = Literal["auto", "resume", "overwrite"]


def loss_spans(sample: TokenSample, n_tokens: int) -> list[list[int]]:
    """The [start, end) runs of loss-carrying positions."""
    if sample.loss_mask is None:  # the common case stays in plain Python: no array per sample
        start = len(sample.prompt_ids)
        return [[start, n_tokens]] if n_tokens > start else []
    mask = np.asarray(sample.loss_mask)
    if mask.shape != (n_tokens,):
        raise ValueError(f"sample {sample.sample_id}: loss_mask has {mask.size} entries for "
                         f"{n_tokens} tokens")
    if mask.size and not np.isin(mask, (0, 1)).all():
        raise ValueError(f"sample {sample.sample_id}: loss_mask must hold only 0 and 1")
    edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    return np.stack([np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)], 1).tolist()


class _TokenBuffer:
    """Samples waiting for the next commit, packed as they arrive."""

    dtypes: dict[str, str] = {}  # noqa: RUF012  (read-only: every array has its natural dtype)

    def __init__(self) -> None:
        self.tokens = np.empty(1 << 16, np.int32)
        self.n_tokens = 0
        self.offsets = [0]
        self.prompt_lens: list[int] = []
        self.spans: list[list[list[int]]] = []
        self.loss: list[int] = []
        self.partitions: list[str] = []
        self.ids: list[str] = []
        self.meta: list[bytes] = []  # each sample's meta as JSON, encoded when it is added
        self.finish: list[str] = []

    def __len__(self) -> int:
        return len(self.ids)

    def _pack(self, ids: IntSeq) -> None:
        n = len(ids)
        if self.n_tokens + n > self.tokens.size:
            grown = np.empty(max(2 * self.tokens.size, self.n_tokens + n), np.int32)
            grown[: self.n_tokens] = self.tokens[: self.n_tokens]
            self.tokens = grown
        if isinstance(ids, np.ndarray):
            # to_int32 range-checks: numpy's own assignment casts unsafely, so int64 ids past
            # int32 would wrap and float arrays would truncate without a word.
            self.tokens[self.n_tokens : self.n_tokens + n] = to_int32(ids)
            if n and self.tokens[self.n_tokens : self.n_tokens + n].min() < 0:
                raise ValueError("token ids must not be negative")
        else:
            pack_int32_into(ids, self.tokens, self.n_tokens, floor=0)
        self.n_tokens += n

    def add(self, sample: TokenSample) -> None:
        # Everything the shard stores is checked and encoded before anything is packed: a
        # value JSON cannot hold (an int past 64 bits, a set, an object) used to pass add()
        # and fail the next commit instead, again on every later commit, taking every queued
        # sample with it. Encoding now also snapshots the caller's dicts.
        if not isinstance(sample.partition, str) or not isinstance(sample.finish_reason, str):
            raise TypeError(f"sample {sample.sample_id}: partition and finish_reason must be "
                            "strings")
        meta: dict = {"finish_reason": sample.finish_reason}
        for key in ("source", "server", "latency", "counts"):
            value = getattr(sample, key)
            if value is not None:
                meta[key] = value
        if sample.metadata:
            meta["metadata"] = sample.metadata
        try:
            meta_json = orjson.dumps(meta)
        except orjson.JSONEncodeError as exc:
            raise ValueError(f"sample {sample.sample_id}: metadata cannot be stored as JSON "
                             f"({exc})") from None
        start = self.n_tokens
        try:
            self._pack(sample.prompt_ids)
            self._pack(sample.completion_ids)
            spans = loss_spans(sample, self.n_tokens - start)
        except BaseException:
            self.n_tokens = start  # a rejected sample leaves no partial tokens behind
            raise
        self.offsets.append(self.n_tokens)
        self.prompt_lens.append(len(sample.prompt_ids))
        self.spans.append(spans)
        self.loss.append(sum(end - start for start, end in spans))
        self.partitions.append(sample.partition)
        self.ids.append(sample.sample_id)
        self.meta.append(meta_json)
        self.finish.append(sample.finish_reason)

    def arrays(self) -> tuple[dict[str, np.ndarray], list[str]]:
        names = sorted(set(self.partitions))
        index = {p: i for i, p in enumerate(names)}
        spans = np.array([pair for sample in self.spans for pair in sample], np.int32)
        arrays: dict[str, np.ndarray] = {
            "tokens": self.tokens[: self.n_tokens],
            "offsets": np.asarray(self.offsets, np.int64),
            "prompt_lens": np.asarray(self.prompt_lens, np.int32),
            "loss_spans": spans.reshape(-1, 2),
            "loss_span_offsets": np.cumsum([0] + [len(s) for s in self.spans], dtype=np.int64),
            "partition_index": np.asarray([index[p] for p in self.partitions], np.int32),
            "sample_ids": np.frombuffer("\n".join(self.ids).encode(), np.uint8),
            "meta_zst": np.frombuffer(
                zstandard.ZstdCompressor(level=3).compress(b"[" + b",".join(self.meta) + b"]"),
                np.uint8),
        }
        return arrays, names

    @property
    def nbytes(self) -> int:
        return self.n_tokens * 4

    def shard_metadata(self) -> dict[str, str]:
        return {}

    def entry(self) -> dict:
        """This buffer's counts for its manifest entry, so `info` never opens a shard."""
        lengths = np.diff(self.offsets).tolist()
        stats = partition_stats(self.partitions, lengths, self.loss, self.prompt_lens,
                                self.finish)
        return {"tokens": self.n_tokens,
                "loss_tokens": sum(p["loss_tokens"] for p in stats.values()),
                "partitions": stats}


def partition_stats(partitions: list[str], lengths: list[int], loss: list[int],
                    prompt_lens: list[int], finish: list[str] | None) -> dict:
    """Per-partition samples, tokens, loss, completion tokens and finish reasons."""
    out: dict[str, dict] = {}
    for i, part in enumerate(partitions):
        p = out.setdefault(part, {"samples": 0, "tokens": 0, "loss_tokens": 0,
                                  "completion_tokens": 0, "finish": Counter()})
        p["samples"] += 1
        p["tokens"] += lengths[i]
        p["loss_tokens"] += loss[i]
        p["completion_tokens"] += lengths[i] - prompt_lens[i]
        if finish is not None:
            p["finish"][finish[i]] += 1
    for p in out.values():
        p["finish"] = dict(p["finish"])
    return out


class _Buffer(Protocol):
    """What a writer needs of the samples it queues: packed arrays and their counts."""

    dtypes: dict[str, str]

    def __len__(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    def add(self, sample: Any) -> None: ...
    def arrays(self) -> tuple[dict[str, np.ndarray], list[str]]: ...
    def shard_metadata(self) -> dict[str, str]: ...
    def entry(self) -> dict: ...


class DatasetWriter:
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

    def _unwritable(self, exc: OSError) -> DatasetError:
        where = exc.filename or self.path
        return DatasetError(
            f"{self.path}: cannot write to the dataset ({where}: {exc.strerror or exc}). "
            "Readers (info, validate, train) need no write access; to add to it, make the "
            "directory writable, or copy it somewhere writable and continue there")

    def _check_target(self) -> None:
        if dataset_dir.is_dataset(self.path):
            return
        if self._mode == "resume":
            raise DatasetError(f"{self.path}: nothing to resume (no dataset there); "
                               "run without --resume to start one")
        foreign = dataset_dir.foreign_files(self.path)
        if foreign:
            raise DatasetError(f"{self.path}: exists and is not an eagle3kit dataset "
                               f"(holds {', '.join(foreign[:3])}); choose a new or empty directory")
        if self.path.exists() and not self.path.is_dir():
            raise DatasetError(f"{self.path}: exists and is not a directory")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DatasetError(f"{self.path}: cannot create the dataset directory "
                               f"({exc.strerror or exc})") from None

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
            self.warnings.append(f"{self.path}: {MARKER} was missing; restored it from "
                                 f"{MANIFEST}, which lists {len(lost['shards'])} committed "
                                 "shards")
        if self._mode == "overwrite" and not same_run_before and dataset_dir.has_marker(self.path):
            try:
                old = dataset_dir.read_manifest(self.path, dataset_dir.read_marker(self.path))
            except DatasetError:
                old = None  # a damaged manifest: --overwrite is the way out of it
            dataset_dir.wipe(self.path, old)
        if not dataset_dir.has_marker(self.path):
            dataset_dir.create(self.path, self.kind, self._config, self._provenance,
                               self._fixed)
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
            manifest["runs"].append({"run_id": self.run_id, "started": time.time(),
                                     "host": socket.gethostname(), "pid": os.getpid(),
                                     "eagle3kit": __version__, "command": command_line()})
        write_json_atomic(self.path / MANIFEST, manifest)

    def _check_config(self, manifest: dict) -> None:
        fixed = dataset_dir.config_changes({k: manifest.get(k) for k in self._fixed},
                                           self._fixed)
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
        due = len(self._buffer) >= self.commit_every or (
            self._buffer.nbytes >= self.commit_bytes) or (
            len(self._buffer) and self._clock() - self._last_commit >= self.commit_interval)
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
            self._buffer = self._new_buffer()
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="eagle3kit-commit")
            self._pending = self._pool.submit(self._commit_buffer, buffer, self._seq,
                                              self._progress)
            self._seq += 1
        if wait:
            self._finish_pending()

    def _finish_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            try:
                pending.result()
            except BaseException as exc:
                self._failed = exc
                raise

    def _refuse_after_failure(self) -> None:
        if self._failed is not None:
            raise DatasetError(f"{self.path}: nothing more is committed by this run: an "
                               f"earlier commit failed ({self._failed})")

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
        written = write_shard(shard_dir / name, arrays, {
            "format": FORMAT_NAME, "version": str(FORMAT_VERSION), "kind": self.kind,
            "samples": str(len(buffer)), "partitions": orjson.dumps(partitions).decode(),
            # Resuming reads only the ids; their own checksum keeps a damaged id from
            # letting a sample in twice, without reading the whole shard.
            "sample_ids_xxh3": xxhash.xxh3_128_hexdigest(
                arrays["sample_ids"]),  # type: ignore[arg-type]  # numpy's stubs give ndarray the buffer protocol for Python >= 3.12 only
            **buffer.shard_metadata(),
        }, buffer.dtypes)
        fsync_dir(shard_dir)
        counts = buffer.entry()
        return {
            "name": name, "bytes": written.bytes, "xxh3": written.xxh3,
            "samples": len(buffer), "tokens": counts.pop("tokens"),
            "loss_tokens": counts.pop("loss_tokens"),
            "rank": self.rank, "committed": time.time(), "partitions": counts.pop("partitions"),
            **counts,
        }

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
            replaced[entry["name"]] = self._seal(buffer, self._seq) if len(buffer) else None
            self._seq += 1
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



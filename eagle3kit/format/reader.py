"""Reading a dataset: counts from the manifest, samples from memory-mapped shards."""

from __future__ import annotations

import bisect
import os
import stat
import sys
from collections import OrderedDict
from collections.abc import Callable, Iterator
from functools import cached_property
from itertools import accumulate
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import xxhash

import eagle3kit.format.dataset_dir as dataset_dir
from eagle3kit.format.columns import ShardColumns, TokenView
from eagle3kit.format.errors import DatasetError
from eagle3kit.format.layout import MANIFEST, MARKER, SHARD_DIR, TOKENIZER_DIR
from eagle3kit.format.recorded import Origin, Recorded
from eagle3kit.format.sample import TokenSample
from eagle3kit.format.shard import FrameError, ShardFile, meta_bound, unzstd
from eagle3kit.format.shard_checks import (
    check_counts,
    check_samples,
    check_spans,
    check_unique,
    meta_problem,
    own_counts,
    read_ids,
    read_partition_names,
    shard_damaged,
)

# Random access over a big dataset touches every shard; reopening one costs a checksum pass,
# so keep many mapped (well under Linux's 65,530 mappings per process).
_OPEN_SHARDS = 1024
SHARD_OPENERS: dict[str, Callable[[Path, dict, bool, Any], Any]] = {}
"""The shard of a dataset kind other than tokens, by kind, opened from (path, manifest entry,
verify, the Dataset): hidden.py adds its own, since it builds on this module and this module
may not import it back."""


class TokenShard:
    """One token shard's arrays, as zero-copy views of the mapped file.

    Opening one checks that its arrays agree with each other and with its manifest entry
    (cheap passes over the per-sample arrays); with `verify`, also its checksums, its ids,
    its metadata and its counts. A shard from elsewhere can hold anything its checksums
    were recomputed over: every disagreement is a DatasetError naming the shard."""

    def __init__(self, path: Path, entry: dict, verify: bool) -> None:
        self.file = ShardFile(path)
        if verify:
            self.file.verify(entry["xxh3"])
        f = self.file
        self.tokens = f.array("tokens", "I32", 1)
        self.offsets = f.array("offsets", "I64", 1)
        self.prompt_lens = f.array("prompt_lens", "I32", 1)
        self.loss_spans = f.array("loss_spans", "I32", 2)
        self.loss_span_offsets = f.array("loss_span_offsets", "I64", 1)
        self.partition_index = f.array("partition_index", "I32", 1)
        self.partition_names = read_partition_names(f)
        check_samples(
            f,
            entry,
            self.offsets,
            self.prompt_lens,
            self.partition_index,
            self.partition_names,
            len(self.tokens),
        )
        check_spans(f, self.offsets, self.loss_spans, self.loss_span_offsets)
        # Per-sample lookups read Python ints: indexing numpy arrays one element at a time
        # makes a numpy scalar each time, several times slower.
        self.starts: list[int] = self.offsets.tolist()
        self.plens: list[int] = self.prompt_lens.tolist()
        self.span_starts: list[int] = self.loss_span_offsets.tolist()
        if verify:
            if len(self.tokens) and int(self.tokens.min()) < 0:
                raise shard_damaged(path, "negative token ids")
            check_unique(path, self.ids)
            spans = np.asarray(self.loss_spans, np.int64).reshape(-1, 2)
            owner = np.repeat(np.arange(entry["samples"]), np.diff(self.loss_span_offsets))
            loss = np.bincount(owner, weights=spans[:, 1] - spans[:, 0], minlength=entry["samples"])
            check_counts(
                path,
                entry,
                own_counts(
                    self.offsets,
                    self.prompt_lens,
                    loss,
                    self.partition_index,
                    self.partition_names,
                    [m["finish_reason"] for m in self.meta],
                ),
            )

    @cached_property
    def ids(self) -> list[str]:
        return read_ids(self.file, len(self.plens))

    @cached_property
    def meta(self) -> list[dict]:
        n = len(self.plens)
        blob = self.file.array("meta_zst", "U8", 1).tobytes()
        bound = meta_bound(n, len(self.tokens))
        try:
            meta = orjson.loads(unzstd(blob, bound))
        except FrameError as exc:
            raise shard_damaged(self.file.path, f"metadata frame {exc}") from None
        except orjson.JSONDecodeError:
            raise shard_damaged(self.file.path, "metadata is not JSON") from None
        if not isinstance(meta, list) or len(meta) != n:
            raise shard_damaged(self.file.path, f"metadata is not a list of {n} objects")
        for i, m in enumerate(meta):
            why = meta_problem(m)
            if why:
                raise shard_damaged(self.file.path, f"sample {i}'s metadata {why}")
        return meta

    def spans(self, i: int) -> list[list[int]]:
        return self.loss_spans[self.span_starts[i] : self.span_starts[i + 1]].tolist()

    def loss_mask(self, i: int) -> np.ndarray:
        mask = np.zeros(self.starts[i + 1] - self.starts[i], np.uint8)
        for start, end in self.spans(i):
            mask[start:end] = 1
        return mask

    def sample(self, i: int) -> TokenSample:
        start, end = self.starts[i], self.starts[i + 1]
        split = start + self.plens[i]
        meta = self.meta[i]
        spans = self.spans(i)
        # The default mask is one span over the whole completion (none when it is empty).
        default = spans == ([[split - start, end - start]] if end > split else [])
        return TokenSample(
            sample_id=self.ids[i],
            prompt_ids=self.tokens[start:split],
            completion_ids=self.tokens[split:end],
            finish_reason=meta["finish_reason"],
            partition=self.partition_names[self.partition_index[i]],
            loss_mask=None if default else self.loss_mask(i),
            source=meta.get("source"),
            server=meta.get("server"),
            latency=meta.get("latency"),
            counts=meta.get("counts"),
            metadata=meta.get("metadata", {}),
        )


def read_committed_ids(path: Path, manifest: dict) -> set[str]:
    """Every committed sample id, reading only the id array of each shard."""
    ids: set[str] = set()
    for entry in manifest["shards"]:
        shard_path = path / SHARD_DIR / entry["name"]
        shard = ShardFile(shard_path)
        raw = shard.array("sample_ids").tobytes()
        if xxhash.xxh3_128_hexdigest(raw) != shard.metadata.get("sample_ids_xxh3"):
            raise DatasetError(
                f"{shard_path}: shard damaged (sample ids differ from their checksum)"
            )
        # No checksum is read here (that costs a full read per resume), so damaged id bytes
        # must still end in a DatasetError naming the shard, not a UnicodeDecodeError, and a
        # count that disagrees with the manifest must stop the writer before it duplicates.
        try:
            found = raw.decode().split("\n") if raw else []
        except UnicodeDecodeError:
            raise DatasetError(f"{shard_path}: shard damaged (sample ids are not UTF-8)") from None
        if len(found) != entry["samples"]:
            raise DatasetError(
                f"{shard_path}: shard damaged (holds {len(found)} sample ids, "
                f"the manifest says {entry['samples']})"
            )
        ids.update(found)
    return ids


def _id_hash(sample_id: str) -> int:
    return xxhash.xxh3_64_intdigest(sample_id.encode())


class Dataset:
    """A committed dataset, opened read-only.

    Counts come from the manifest alone. Shards are memory-mapped when first touched and each
    is checked against its checksums then (`verify_shards=False` skips that), so a damaged
    file stops the reader with its name instead of feeding it bad tokens.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        kind: str | None = "tokens",
        verify_shards: bool = True,
        warn_stray: bool = True,
    ) -> None:
        self.path = Path(path)
        self.marker = dataset_dir.read_marker(self.path, kind)
        self.kind: str = self.marker["kind"]
        self.version: int = self.marker["version"]
        self.manifest = dataset_dir.read_manifest(self.path, self.marker)
        self.shards: list[dict] = self.manifest["shards"]
        self.marker_missing = not dataset_dir.has_marker(self.path)
        """Read by its manifest alone: the marker is gone (the next writer restores it)."""
        # Python ints: a manifest from elsewhere may claim counts whose sum overflows int64.
        self._starts: list[int] = list(accumulate((s["samples"] for s in self.shards), initial=0))
        if self._starts[-1] > sys.maxsize:
            raise DatasetError(
                f"{self.path / MANIFEST}: manifest damaged (its shards claim "
                f"{self._starts[-1]:,} samples)"
            )
        self._verified: set[int] = set()
        self._verify = verify_shards
        self._open: OrderedDict[int, TokenShard] = OrderedDict()
        self.warnings: list[str] = []
        """What a reader should tell its user (format/ prints nothing; the stage shows them)."""
        if warn_stray and self.marker_missing:
            self.warnings.append(self.marker_warning())
        if warn_stray:
            temps, orphans = self.stray_files()
            if temps or orphans:
                self.warnings.append(
                    f"{self.path}: ignoring {len(temps) + len(orphans)} files "
                    "left by an interrupted run (the next writer removes them)"
                )

    # Counts -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._starts[-1]

    @property
    def num_tokens(self) -> int:
        return sum(s["tokens"] for s in self.shards)

    @property
    def num_loss_tokens(self) -> int:
        """Loss tokens as the manifest counts them (validate checks them against the data)."""
        return sum(s["loss_tokens"] for s in self.shards)

    @property
    def shard_bytes(self) -> int:
        """Bytes of the committed shards, as the manifest records them."""
        return sum(int(s["bytes"]) for s in self.shards)

    def partition_stats(self) -> dict[str, dict]:
        """Samples, tokens, loss tokens and finish reasons per partition, from the manifest."""
        out: dict[str, dict] = {}
        for shard in self.shards:
            for name, stats in shard["partitions"].items():
                total = out.setdefault(
                    name,
                    {
                        "samples": 0,
                        "tokens": 0,
                        "loss_tokens": 0,
                        "completion_tokens": 0,
                        "finish": {},
                    },
                )
                for key in ("samples", "tokens", "loss_tokens", "completion_tokens"):
                    total[key] += stats[key]
                for reason, n in stats["finish"].items():
                    total["finish"][reason] = total["finish"].get(reason, 0) + n
        return dict(sorted(out.items()))

    @property
    def tokenizer_dir(self) -> Path:
        """Where the tokenizer and chat template that made the data are stored (it may not
        exist: a dataset made by convert has none)."""
        return self.path / TOKENIZER_DIR

    def header(self) -> dict:
        """The manifest's description of the data (format, kind, counts, config, provenance),
        without its bookkeeping: the shard list, the runs that wrote them, hidden codecs'
        measurements."""
        return {k: v for k, v in self.manifest.items() if k not in ("shards", "runs", "measured")}

    def recorded(self) -> Recorded:
        """What gen recorded for the stages after it (rendering, template file, API family),
        typed: later stages read these through here, never by manifest key."""
        return Recorded.of(self.manifest)

    def origin(self) -> Origin:
        """Where the samples came from: prompts, servers and sampling, or the token dataset
        a hidden-state one was extracted from."""
        return Origin.of(self.manifest)

    @property
    def manifest_xxh3(self) -> str:
        """A hash of the manifest file's bytes: it changes with every commit."""
        return xxhash.xxh3_128_hexdigest((self.path / MANIFEST).read_bytes())

    @property
    def partitions(self) -> list[str]:
        return list(self.partition_stats())

    def marker_warning(self) -> str:
        return (
            f"{self.path / MARKER}: missing; read the dataset by its {MANIFEST}, which "
            f"lists {len(self.shards):,} committed shards (the next run that writes to it "
            "restores the marker)"
        )

    def stray_files(self) -> tuple[list[Path], list[Path]]:
        """Temp files and uncommitted shards a crash left; readers ignore them."""
        return dataset_dir.stray_files(self.path, self.manifest)

    # Samples ------------------------------------------------------------------------------
    def _load_shard(self, entry: dict, verify: bool) -> Any:
        """A token shard, or a hidden-state one for a dataset of that kind (e.g. for `info`)."""
        path = self.path / SHARD_DIR / entry["name"]
        opener = SHARD_OPENERS.get(self.kind)
        if opener is not None:
            return opener(path, entry, verify, self)
        return TokenShard(path, entry, verify)

    def _shard(self, k: int) -> Any:
        shard = self._open.get(k)
        if shard is None:
            entry = self.shards[k]
            # Checked once per Dataset: a shard evicted and reopened is not hashed again.
            verify = self._verify and k not in self._verified
            shard = self._load_shard(entry, verify)
            self._verified.add(k)
            self._open[k] = shard
            if len(self._open) > _OPEN_SHARDS:
                self._open.popitem(last=False)
        else:
            self._open.move_to_end(k)
        return shard

    def _locate(self, index: int) -> tuple[int, int]:
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"sample index {index} out of range for {n} samples")
        index %= n
        k = bisect.bisect_right(self._starts, index) - 1
        return k, index - self._starts[k]

    def __getitem__(self, index: int) -> Any:
        k, i = self._locate(index)
        return self._shard(k).sample(i)

    def token_view(self, index: int) -> TokenView:
        """Sample `index`'s ids, prompt length and loss mask as views of the mapped shard:
        nothing else is read (a hidden-state dataset's states stay on disk)."""
        k, i = self._locate(index)
        shard = self._shard(k)
        start, end = shard.starts[i], shard.starts[i + 1]
        return TokenView(shard.tokens[start:end], shard.plens[i], shard.loss_mask(i))

    def __iter__(self) -> Iterator[Any]:
        return self.iter_samples()

    def iter_samples(self, partition: str | None = None) -> Iterator[Any]:
        """Every sample in commit order, one shard mapped at a time (flat memory)."""
        for k, entry in enumerate(self.shards):
            if partition is not None and partition not in entry["partitions"]:
                continue
            shard = self._load_shard(entry, self._verify)
            wanted = None
            if partition is not None:
                wanted = shard.partition_names.index(partition)
            for i in range(entry["samples"]):
                if wanted is None or shard.partition_index[i] == wanted:
                    yield shard.sample(i)
            del shard
            self._open.pop(k, None)

    def columns(self) -> Iterator[ShardColumns]:
        """Each shard's columns in commit order, for passes that scan whole arrays at once."""
        for k in range(len(self.shards)):
            yield ShardColumns(self._shard(k))

    def indices(self, partition: str | None = None) -> np.ndarray:
        """Global indices of the samples in `partition` (all when None)."""
        if partition is None:
            return np.arange(len(self), dtype=np.int64)
        found = []
        for k, entry in enumerate(self.shards):
            if partition in entry["partitions"]:
                shard = self._shard(k)
                wanted = shard.partition_names.index(partition)
                found.append(np.flatnonzero(shard.partition_index == wanted) + self._starts[k])
        return np.concatenate(found) if found else np.zeros(0, np.int64)

    def sample_ids(self) -> Iterator[str]:
        for k in range(len(self.shards)):
            yield from self._shard(k).ids

    def ids_with_finish(self, finish_reason: str) -> set[str]:
        """The ids of the samples with this finish reason. Only the shards whose manifest
        counts show one are opened, so on a clean dataset this reads nothing."""
        found: set[str] = set()
        for k, entry in enumerate(self.shards):
            if not any(p["finish"].get(finish_reason) for p in entry["partitions"].values()):
                continue
            shard = self._shard(k)
            found.update(
                sample_id
                for sample_id, meta in zip(shard.ids, shard.meta, strict=True)
                if meta["finish_reason"] == finish_reason
            )
        return found

    # Checks -------------------------------------------------------------------------------
    def check_files(self) -> list[str]:
        """Shards missing or of the wrong size: what a check without reading the data finds."""
        problems = []
        for entry in self.shards:
            path = self.path / SHARD_DIR / entry["name"]
            try:
                info = os.lstat(path)
            except FileNotFoundError:
                problems.append(f"{path}: shard missing (deleted or moved)")
                continue
            if not stat.S_ISREG(info.st_mode):
                try:
                    ShardFile(path)  # says what it is instead
                except DatasetError as exc:
                    problems.append(str(exc))
                continue
            size = info.st_size
            if size != entry["bytes"]:
                problems.append(
                    f"{path}: shard damaged ({size} bytes on disk, the manifest "
                    f"says {entry['bytes']}: truncated or replaced)"
                )
        return problems

    def verify(self) -> list[str]:
        """Every problem found by checking each shard against both its checksums."""
        problems = []
        for entry in self.shards:
            try:
                self._load_shard(entry, verify=True)
            except DatasetError as exc:
                problems.append(str(exc))
        return problems

    def _ids_of(self, k: int) -> list[str] | None:
        try:
            return self._load_shard(self.shards[k], verify=False).ids
        except DatasetError:
            return None  # a damaged shard: verify() names it

    def duplicate_ids(self, shown: int = 3) -> list[str]:
        """Sample ids committed in more than one shard, each named with both shards (a
        shard's own duplicates are verify()'s). Ids are compared by 64-bit hashes, 8 bytes a
        sample, and each match is confirmed on the ids themselves."""
        hashes, owners = [], []
        for k in range(len(self.shards)):
            ids = self._ids_of(k) or []
            hashes.append(np.fromiter(map(_id_hash, ids), np.uint64, len(ids)))
            owners.append(np.full(len(ids), k, np.int64))
        if not hashes:
            return []
        h, o = np.concatenate(hashes), np.concatenate(owners)
        order = np.argsort(h, kind="stable")
        h, o = h[order], o[order]
        problems: list[str] = []
        found = 0
        for j in np.flatnonzero((h[1:] == h[:-1]) & (o[1:] != o[:-1])).tolist():
            a, b = int(o[j]), int(o[j + 1])
            same = {i for i in self._ids_of(a) or [] if _id_hash(i) == h[j]}
            same &= {i for i in self._ids_of(b) or [] if _id_hash(i) == h[j]}
            if not same:
                continue  # two ids with one hash: not a duplicate
            found += 1
            if found <= shown:
                problems.append(
                    f"{self.path / SHARD_DIR / self.shards[b]['name']}: sample id "
                    f"{min(same)!r} is also in {self.shards[a]['name']} (its sample "
                    "would be read twice)"
                )
        if found > shown:
            problems.append(
                f"{self.path}: {found - shown:,} more sample ids are committed in two shards"
            )
        return problems

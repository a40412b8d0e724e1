"""Reading a dataset: counts from the manifest, samples from memory-mapped shards."""

from __future__ import annotations

import bisect
import os
import stat
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import xxhash
import zstandard

from eagle3kit.format import dataset_dir
from eagle3kit.format.errors import DatasetError
from eagle3kit.format.layout import MANIFEST, MARKER, SHARD_DIR, TOKENIZER_DIR
from eagle3kit.format.sample import TokenSample
from eagle3kit.format.shard import ShardFile

# Random access over a big dataset touches every shard; reopening one costs a checksum pass,
# so keep many mapped (well under Linux's 65,530 mappings per process).
_OPEN_SHARDS = 1024


class TokenShard:
    """One token shard's arrays, as zero-copy views of the mapped file."""

    def __init__(self, path: Path, entry: dict, verify: bool) -> None:
        self.file = ShardFile(path)
        if verify:
            self.file.verify(entry["xxh3"])
        try:
            self.tokens = self.file.array("tokens")
            self.offsets = self.file.array("offsets")
            self.prompt_lens = self.file.array("prompt_lens")
            self.loss_spans = self.file.array("loss_spans")
            self.loss_span_offsets = self.file.array("loss_span_offsets")
            self.partition_index = self.file.array("partition_index")
            self.partition_names: list[str] = orjson.loads(self.file.metadata["partitions"])
        except (KeyError, orjson.JSONDecodeError):
            raise DatasetError(f"{path}: shard damaged (token arrays or metadata missing)"
                               ) from None
        if len(self.prompt_lens) != entry["samples"] or len(self.offsets) != entry["samples"] + 1:
            raise DatasetError(f"{path}: shard holds {len(self.prompt_lens)} samples, "
                               f"the manifest says {entry['samples']}")
        check_token_count(path, entry, self.offsets, len(self.tokens))
        # Per-sample lookups read Python ints: indexing numpy arrays one element at a time
        # makes a numpy scalar each time, several times slower.
        self.starts: list[int] = self.offsets.tolist()
        self.plens: list[int] = self.prompt_lens.tolist()
        self.span_starts: list[int] = self.loss_span_offsets.tolist()
        if verify:
            spans = np.asarray(self.loss_spans, np.int64).reshape(-1, 2)
            owner = np.repeat(np.arange(entry["samples"]), np.diff(self.loss_span_offsets))
            loss = np.bincount(owner, weights=spans[:, 1] - spans[:, 0],
                               minlength=entry["samples"])
            check_counts(path, entry, own_counts(
                self.offsets, self.prompt_lens, loss, self.partition_index,
                self.partition_names, [m.get("finish_reason") for m in self.meta]))

    @cached_property
    def ids(self) -> list[str]:
        raw = self.file.array("sample_ids").tobytes().decode()
        return raw.split("\n") if raw else []

    @cached_property
    def meta(self) -> list[dict]:
        blob = self.file.array("meta_zst").tobytes()
        return orjson.loads(zstandard.ZstdDecompressor().decompress(blob))

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


def check_token_count(path: Path, entry: dict, offsets: np.ndarray, n_tokens: int) -> None:
    """The shard's offsets end at its token count, which is the manifest's."""
    if len(offsets) and (int(offsets[0]) != 0 or int(offsets[-1]) != n_tokens
                         or (np.diff(offsets) < 0).any()):
        raise DatasetError(f"{path}: shard damaged (its offsets do not cover its "
                           f"{n_tokens} tokens)")
    if n_tokens != entry["tokens"]:
        raise DatasetError(f"{path}: the manifest's counts differ from the shard's own (tokens: "
                           f"the manifest says {entry['tokens']}, the shard holds {n_tokens}); "
                           "the manifest was edited or damaged")


def own_counts(offsets: np.ndarray, prompt_lens: np.ndarray, loss: np.ndarray,
               partition_index: np.ndarray, names: list[str],
               finish: Sequence[str | None] | None) -> dict:
    """A shard's loss tokens and per-partition counts, from its own arrays."""
    lengths = np.diff(np.asarray(offsets, np.int64))
    part = np.asarray(partition_index, np.int64)
    loss = np.asarray(loss, np.int64)
    comp = lengths - np.asarray(prompt_lens, np.int64)
    partitions = {}
    for j, name in enumerate(names):
        m = part == j
        if not m.any():
            continue
        reasons: dict[str | None, int] = {}
        for reason in ([finish[i] for i in np.flatnonzero(m).tolist()]
                       if finish is not None else []):
            reasons[reason] = reasons.get(reason, 0) + 1
        partitions[name] = {"samples": int(m.sum()), "tokens": int(lengths[m].sum()),
                            "loss_tokens": int(loss[m].sum()),
                            "completion_tokens": int(comp[m].sum()), "finish": reasons}
    return {"loss_tokens": int(loss.sum()), "partitions": partitions}


def check_counts(path: Path, entry: dict, own: dict) -> None:
    """The manifest's loss tokens and per-partition counts for a shard are the shard's own."""
    differ = []
    if own["loss_tokens"] != entry["loss_tokens"]:
        differ.append(f"loss_tokens: the manifest says {entry['loss_tokens']}, the shard "
                      f"holds {own['loss_tokens']}")
    stated = entry["partitions"]
    for name in sorted(set(stated) | set(own["partitions"])):
        said, held = stated.get(name), own["partitions"].get(name)
        if said is None or held is None:
            differ.append(f"partition {name!r}: " + ("not in the shard" if held is None
                                                     else "not in the manifest"))
            continue
        for key in ("samples", "tokens", "loss_tokens", "completion_tokens", "finish"):
            if said.get(key) != held[key]:
                differ.append(f"partition {name!r} {key}: the manifest says "
                              f"{said.get(key)}, the shard holds {held[key]}")
    if differ:
        raise DatasetError(f"{path}: the manifest's counts differ from the shard's own "
                           f"({'; '.join(differ[:3])}); the manifest was edited or damaged")


@dataclass
class TokenView:
    """A sample's arrays without its metadata, for training loops: no copies, no JSON."""

    input_ids: np.ndarray
    prompt_len: int
    loss_mask: np.ndarray


class ShardColumns:
    """One shard's columns: read-only views of the mapped file, one entry per sample (the
    token columns one per token). The public face of a token or hidden-state shard for
    stages that scan whole arrays; a shard's file layout stays inside format/."""

    def __init__(self, shard: Any) -> None:
        self._shard = shard

    @property
    def ids(self) -> list[str]:
        return self._shard.ids

    @property
    def tokens(self) -> np.ndarray:
        """Every sample's token ids, concatenated (sample i is `tokens[starts[i]:starts[i+1]]`)."""
        return self._shard.tokens

    @property
    def starts(self) -> list[int]:
        """Where each sample starts in `tokens`, and one past the last one's end."""
        return self._shard.starts

    @cached_property
    def offsets(self) -> np.ndarray:
        """`starts` as an int64 array."""
        return np.asarray(self._shard.offsets, np.int64)

    @cached_property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @cached_property
    def prompt_lens(self) -> np.ndarray:
        return np.asarray(self._shard.prompt_lens, np.int64)

    @property
    def partition_index(self) -> np.ndarray:
        """Each sample's index into `partition_names`."""
        return self._shard.partition_index

    @property
    def partition_names(self) -> list[str]:
        return self._shard.partition_names

    @property
    def meta(self) -> list[dict]:
        """Each sample's finish reason, source, server, latency, counts and metadata."""
        return self._shard.meta

    @cached_property
    def loss_spans(self) -> np.ndarray:
        """The [start, end) loss spans of every sample (token shards), as rows of an int64
        array; sample i's are `loss_spans[loss_span_offsets[i]:loss_span_offsets[i+1]]`."""
        return np.asarray(self._shard.loss_spans, np.int64).reshape(-1, 2)

    @cached_property
    def loss_span_offsets(self) -> np.ndarray:
        return np.asarray(self._shard.loss_span_offsets, np.int64)


def read_committed_ids(path: Path, manifest: dict) -> set[str]:
    """Every committed sample id, reading only the id array of each shard."""
    ids: set[str] = set()
    for entry in manifest["shards"]:
        shard_path = path / SHARD_DIR / entry["name"]
        shard = ShardFile(shard_path)
        raw = shard.array("sample_ids").tobytes()
        if xxhash.xxh3_128_hexdigest(raw) != shard.metadata.get("sample_ids_xxh3"):
            raise DatasetError(f"{shard_path}: shard damaged (sample ids differ from their "
                               "checksum)")
        # No checksum is read here (that costs a full read per resume), so damaged id bytes
        # must still end in a DatasetError naming the shard, not a UnicodeDecodeError, and a
        # count that disagrees with the manifest must stop the writer before it duplicates.
        try:
            found = raw.decode().split("\n") if raw else []
        except UnicodeDecodeError:
            raise DatasetError(f"{shard_path}: shard damaged (sample ids are not UTF-8)"
                               ) from None
        if len(found) != entry["samples"]:
            raise DatasetError(f"{shard_path}: shard damaged (holds {len(found)} sample ids, "
                               f"the manifest says {entry['samples']})")
        ids.update(found)
    return ids


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
        counts = [s["samples"] for s in self.shards]
        self._starts: list[int] = np.concatenate([[0], np.cumsum(counts)]).astype(int).tolist()
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
                self.warnings.append(f"{self.path}: ignoring {len(temps) + len(orphans)} files "
                                     "left by an interrupted run (the next writer removes them)")

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
                total = out.setdefault(name, {"samples": 0, "tokens": 0, "loss_tokens": 0,
                                              "completion_tokens": 0, "finish": {}})
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
        return {k: v for k, v in self.manifest.items()
                if k not in ("shards", "runs", "measured")}

    @property
    def manifest_xxh3(self) -> str:
        """A hash of the manifest file's bytes: it changes with every commit."""
        return xxhash.xxh3_128_hexdigest((self.path / MANIFEST).read_bytes())

    @property
    def partitions(self) -> list[str]:
        return list(self.partition_stats())

    def marker_warning(self) -> str:
        return (f"{self.path / MARKER}: missing; read the dataset by its {MANIFEST}, which "
                f"lists {len(self.shards):,} committed shards (the next run that writes to it "
                "restores the marker)")

    def stray_files(self) -> tuple[list[Path], list[Path]]:
        """Temp files and uncommitted shards a crash left; readers ignore them."""
        return dataset_dir.stray_files(self.path, self.manifest)

    # Samples ------------------------------------------------------------------------------
    def _load_shard(self, entry: dict, verify: bool) -> Any:
        """A token shard, or a hidden-state one for a dataset of that kind (e.g. for `info`)."""
        path = self.path / SHARD_DIR / entry["name"]
        if self.kind == "hidden":
            from eagle3kit.format.hidden import HiddenShard  # hidden.py builds on this module

            return HiddenShard(path, entry, verify)
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
            found.update(sample_id for sample_id, meta in zip(shard.ids, shard.meta, strict=True)
                         if meta["finish_reason"] == finish_reason)
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
                problems.append(f"{path}: shard damaged ({size} bytes on disk, the manifest "
                                f"says {entry['bytes']}: truncated or replaced)")
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

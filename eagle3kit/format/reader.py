"""Reading a dataset: counts from the manifest, samples from memory-mapped shards."""

from __future__ import annotations

import bisect
import os
import stat
import sys
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import xxhash

import eagle3kit.format.dataset_dir as dataset_dir
from eagle3kit.format.errors import DatasetError
from eagle3kit.format.layout import MANIFEST, MARKER, SHARD_DIR, TOKENIZER_DIR
from eagle3kit.format.recorded import Origin, Recorded
from eagle3kit.format.sample import TokenSample
from eagle3kit.format.shard import FrameError, ShardFile, meta_bound, unzstd

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
        check_samples(f, entry, self.offsets, self.prompt_lens, self.partition_index,
                      self.partition_names, len(self.tokens))
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
            loss = np.bincount(owner, weights=spans[:, 1] - spans[:, 0],
                               minlength=entry["samples"])
            check_counts(path, entry, own_counts(
                self.offsets, self.prompt_lens, loss, self.partition_index,
                self.partition_names, [m["finish_reason"] for m in self.meta]))

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


def shard_damaged(path: Path, why: str) -> DatasetError:
    return DatasetError(f"{path}: shard damaged ({why})")


_META_TYPES: dict[str, tuple[type, ...]] = {
    "source": (dict,), "server": (dict,), "counts": (dict,), "metadata": (dict,),
    "latency": (int, float)}


def meta_problem(meta: object) -> str | None:
    """What is wrong with one sample's metadata object, as readers use it; None if nothing."""
    if not isinstance(meta, dict):
        return "is not an object"
    if not isinstance(meta.get("finish_reason"), str):
        return "has no finish_reason string"
    for key, kinds in _META_TYPES.items():
        value = meta.get(key)
        if value is not None and (not isinstance(value, kinds) or isinstance(value, bool)):
            return f"has a {key} that is {type(value).__name__}"
    return None


def read_partition_names(f: ShardFile) -> list[str]:
    try:
        names = orjson.loads(f.metadata["partitions"])
    except KeyError:
        raise shard_damaged(f.path, "partitions missing from the header") from None
    except orjson.JSONDecodeError:
        raise shard_damaged(f.path, "partitions in the header are not JSON") from None
    if not (isinstance(names, list) and all(isinstance(p, str) for p in names)
            and len(set(names)) == len(names)):
        raise shard_damaged(f.path, "partitions in the header are not a list of names")
    return names


def read_ids(f: ShardFile, n: int) -> list[str]:
    """The shard's `n` sample ids, once they are known to be `n` non-empty UTF-8 strings."""
    try:
        raw = f.array("sample_ids", "U8", 1).tobytes().decode()
    except UnicodeDecodeError:
        raise shard_damaged(f.path, "sample ids are not UTF-8") from None
    ids = raw.split("\n") if raw else []
    if len(ids) != n:
        raise shard_damaged(f.path, f"holds {len(ids)} sample ids for {n} samples")
    if not all(ids):
        raise shard_damaged(f.path, "an empty sample id")
    return ids


def check_unique(path: Path, ids: list[str]) -> None:
    seen: set[str] = set()
    for sample_id in ids:
        if sample_id in seen:
            raise shard_damaged(path, f"sample id {sample_id!r} appears twice")
        seen.add(sample_id)


def ascending_from_zero(a: np.ndarray, end: int) -> bool:
    return bool(len(a) and a[0] == 0 and a[-1] == end and not (np.diff(a) < 0).any())


def check_samples(f: ShardFile, entry: dict, offsets: np.ndarray, prompt_lens: np.ndarray,
                  partition_index: np.ndarray, names: list[str], n_tokens: int) -> None:
    """The per-sample arrays every shard has agree with each other and with the manifest's
    sample count: what every later index into them relies on."""
    n = entry["samples"]
    if len(prompt_lens) != n or len(offsets) != n + 1:
        raise DatasetError(f"{f.path}: shard holds {len(prompt_lens)} samples, "
                           f"the manifest says {n}")
    if len(partition_index) != n:
        raise shard_damaged(f.path, f"{len(partition_index)} partition indices for {n} samples")
    check_token_count(f.path, entry, offsets, n_tokens)
    if n and ((prompt_lens < 0).any() or (prompt_lens > np.diff(offsets)).any()):
        raise shard_damaged(f.path, "a prompt length is negative or longer than its sample")
    if n and ((partition_index < 0).any() or (partition_index >= len(names)).any()):
        raise shard_damaged(f.path, "a partition index points past the header's partitions")


def check_spans(f: ShardFile, offsets: np.ndarray, spans: np.ndarray,
                span_offsets: np.ndarray) -> None:
    """Each sample's loss spans lie inside it: [start, end) with 0 <= start < end <= length."""
    n = len(offsets) - 1
    if spans.shape[1:] != (2,):
        raise shard_damaged(f.path, f"loss spans have shape {list(spans.shape)}, not [k, 2]")
    if len(span_offsets) != n + 1 or not ascending_from_zero(span_offsets, len(spans)):
        raise shard_damaged(f.path, f"loss span offsets do not cover its {len(spans)} spans")
    if not len(spans):
        return
    owner = np.repeat(np.arange(n), np.diff(span_offsets))
    length = np.diff(offsets)[owner]
    start, end = spans[:, 0], spans[:, 1]
    if (start < 0).any() or (end <= start).any() or (end > length).any():
        raise shard_damaged(f.path, "a loss span lies outside its sample")


def check_token_count(path: Path, entry: dict, offsets: np.ndarray, n_tokens: int) -> None:
    """The shard's offsets end at its token count, which is the manifest's."""
    if not ascending_from_zero(offsets, n_tokens):
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
        self._starts: list[int] = list(accumulate((s["samples"] for s in self.shards),
                                                  initial=0))
        if self._starts[-1] > sys.maxsize:
            raise DatasetError(f"{self.path / MANIFEST}: manifest damaged (its shards claim "
                               f"{self._starts[-1]:,} samples)")
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
                problems.append(f"{self.path / SHARD_DIR / self.shards[b]['name']}: sample id "
                                f"{min(same)!r} is also in {self.shards[a]['name']} (its sample "
                                "would be read twice)")
        if found > shown:
            problems.append(f"{self.path}: {found - shown:,} more sample ids are committed in "
                            "two shards")
        return problems

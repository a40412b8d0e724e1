"""Hidden-state datasets (kind "hidden"): what extract writes and offline training reads.

Per token a hidden shard holds the target's auxiliary states (`aux`, [T, n_aux*H], the
boundary-convention layer ids in order) and its last decoder layer's output (`last`, [T, H]):
before the final norm as extract writes it, after it (`last_state: post_norm`) where convert
imported SpecForge's states; beside them the token ids and the loss mask, flat: no padding is
stored.
The directory, the run lock and the commit protocol are the token datasets' (writer.py);
only the queued samples' packing and the shard's arrays differ. See docs/format.md.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

from eagle3kit._lock import file_lock
from eagle3kit.format._ints import to_int32
from eagle3kit.format._io import read_json, write_json_atomic
from eagle3kit.format.buffer import partition_stats
from eagle3kit.format.dataset_dir import is_dataset
from eagle3kit.format.errors import DatasetError
from eagle3kit.format.layout import COMMIT_LOCK, MANIFEST
from eagle3kit.format.reader import SHARD_OPENERS, Dataset, read_committed_ids
from eagle3kit.format.sample import check_sample_id
from eagle3kit.format.shard import ShardFile, unzstd
from eagle3kit.format.shard_checks import (
    ascending_from_zero,
    check_counts,
    check_samples,
    check_unique,
    own_counts,
    read_ids,
    read_partition_names,
    shard_damaged,
)
from eagle3kit.format.state_codecs import (
    from_bf16,
    from_fp8,
    from_planes,
    round_trip_errors,
    to_bf16,
    to_fp8,
    to_planes,
)
from eagle3kit.format.writer import DatasetWriter, OpenMode

CODECS = ("raw", "fp8", "zstd")
LAST_STATES = ("pre_norm", "post_norm")
TOKEN_OVERHEAD = 5
"""Stored bytes per token besides its states: the token id (int32) and its loss-mask byte."""
_STATE_DTYPES: dict[str, dict[str, str]] = {
    "raw": {"aux": "BF16", "last": "BF16"},
    "fp8": {"aux": "F8_E4M3", "last": "F8_E4M3", "aux_scale": "F32", "last_scale": "F32"},
    "zstd": {"states_zst": "U8", "states_zst_offsets": "I64"},
}
"""Each codec's state arrays and their safetensors dtypes."""
MAX_HIDDEN_SIZE = 1 << 16
MAX_AUX = 64
"""Far past any model's: a manifest from elsewhere beyond them is damaged, since a sample's
states (and the buffer a compressed frame decodes into) are sized by them."""
ZSTD_LEVEL = 3
ZSTD_TYPICAL_RATIO = 0.75
"""zstd's stored size over raw bf16 states, for forecasts: benchmarks/extract_bench.py
measures 0.69 on a random tiny target (the high byte plane, sign and exponent, compresses;
the mantissa plane barely does). Real targets' states vary, so forecasts round up."""


@dataclass
class HiddenSample:
    """One sample's token ids, loss mask and target states (float32 when read back)."""

    sample_id: str
    input_ids: np.ndarray
    """int32 [T]: prompt and completion ids."""
    loss_mask: np.ndarray
    """uint8 [T]: 1 where the loss applies."""
    aux: np.ndarray
    """[T, n_aux*H]: the auxiliary states at the dataset's layer ids, concatenated in order."""
    last: np.ndarray
    """[T, H]: the last decoder layer's output, before the final norm."""
    partition: str = "default"
    prompt_len: int = 0
    """How many of the first tokens are the prompt (0 when unknown)."""

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)


def hidden_bytes_per_token(hidden_size: int, n_aux: int = 3, codec: str = "raw") -> float:
    """Expected stored bytes per token, per-token overhead included, for disk forecasts.

    raw: bf16 states; fp8: one byte per value plus an fp32 scale per state; zstd: raw times
    ZSTD_TYPICAL_RATIO. Per-sample and per-shard overhead (ids, offsets, headers) is not
    counted: it is a few dozen bytes per sample.
    """
    if codec not in CODECS:
        raise ValueError(f"unknown codec {codec!r} (one of {', '.join(CODECS)})")
    states = (n_aux + 1) * hidden_size
    if codec == "fp8":
        return states + 4 * (n_aux + 1) + TOKEN_OVERHEAD
    raw = 2.0 * states
    return (raw * ZSTD_TYPICAL_RATIO if codec == "zstd" else raw) + TOKEN_OVERHEAD


# Writing ------------------------------------------------------------------------------------
class _HiddenBuffer:
    """Hidden samples waiting for the next commit, encoded as they arrive.

    raw and fp8 encode in `add`; zstd stores bf16 there and compresses in `arrays`, which
    runs on the writer's commit thread, beside the next forward passes.
    """

    def __init__(self, codec: str, hidden_size: int, n_aux: int) -> None:
        self.codec, self.hidden_size, self.n_aux = codec, hidden_size, n_aux
        self.dtypes = (
            {"aux": "BF16", "last": "BF16"}
            if codec == "raw"
            else ({"aux": "F8_E4M3", "last": "F8_E4M3"} if codec == "fp8" else {})
        )
        self.ids: list[str] = []
        self.partitions: list[str] = []
        self.lengths: list[int] = []
        self.prompt_lens: list[int] = []
        self.loss: list[int] = []
        self.chunks: dict[str, list[np.ndarray]] = {}
        self.n_tokens = 0
        self.nbytes = 0
        self.max_abs = self.max_rel = 0.0

    def __len__(self) -> int:
        return len(self.ids)

    def _check(self, s: HiddenSample) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        n, h = len(s.input_ids), self.hidden_size
        ids = to_int32(np.asarray(s.input_ids))
        mask = np.asarray(s.loss_mask)
        aux, last = np.asarray(s.aux, np.float32), np.asarray(s.last, np.float32)
        where = f"sample {s.sample_id}"
        if ids.ndim != 1 or mask.shape != (n,):
            raise ValueError(f"{where}: input_ids and loss_mask must be 1-D of one length")
        if aux.shape != (n, self.n_aux * h) or last.shape != (n, h):
            raise ValueError(
                f"{where}: states must be aux [{n}, {self.n_aux * h}] and last "
                f"[{n}, {h}], got {list(aux.shape)} and {list(last.shape)}"
            )
        if n and (ids.min() < 0 or not np.isin(mask, (0, 1)).all()):
            raise ValueError(f"{where}: negative token ids or a loss mask not of 0 and 1")
        if not (np.isfinite(aux).all() and np.isfinite(last).all()):
            raise ValueError(f"{where}: states hold NaN or Inf")
        if not isinstance(s.partition, str):
            raise TypeError(f"{where}: partition must be a string")
        return ids, mask.astype(np.uint8), aux, last

    def _encode(self, name: str, x: np.ndarray) -> None:
        h = self.hidden_size
        if self.codec == "fp8":
            codes, scale = to_fp8(x.reshape(-1, h))
            back = from_fp8(codes, scale).reshape(x.shape)
            self._put(name, codes.reshape(x.shape))
            self._put(f"{name}_scale", scale.reshape(len(x), -1) if name == "aux" else scale)
        else:
            bits = to_bf16(x)
            back = from_bf16(bits)
            self._put(name, bits)
        err, rel = round_trip_errors(x, back, h)
        self.max_abs, self.max_rel = max(self.max_abs, err), max(self.max_rel, rel)

    def _put(self, name: str, array: np.ndarray) -> None:
        self.chunks.setdefault(name, []).append(array)
        self.nbytes += array.nbytes

    def add(self, sample: HiddenSample) -> None:
        ids, mask, aux, last = self._check(sample)
        held = (
            len(self.ids),
            self.n_tokens,
            self.nbytes,
            self.max_abs,
            self.max_rel,
            {name: len(chunks) for name, chunks in self.chunks.items()},
        )
        try:
            self._encode("aux", aux)
            self._encode("last", last)
            self._put("tokens", ids)
            self._put("loss_mask", mask)
            self.partitions.append(sample.partition)
            self.lengths.append(len(ids))
            self.prompt_lens.append(int(sample.prompt_len))
            self.loss.append(int(mask.sum()))
            self.n_tokens += len(ids)
            self.ids.append(sample.sample_id)
        except BaseException:
            # A stop signal can land between any two lines: the sample leaves no part of
            # itself behind for close() to commit (see _TokenBuffer.add).
            self._truncate(*held)
            raise

    def _truncate(
        self,
        samples: int,
        tokens: int,
        nbytes: int,
        max_abs: float,
        max_rel: float,
        chunks: dict[str, int],
    ) -> None:
        """Back to the state `add` noted before its sample."""
        self.n_tokens, self.nbytes, self.max_abs, self.max_rel = tokens, nbytes, max_abs, max_rel
        for column in (self.partitions, self.lengths, self.prompt_lens, self.loss, self.ids):
            del column[samples:]
        for name in list(self.chunks):
            del self.chunks[name][chunks.get(name, 0) :]

    def _joined(self, name: str, width: int | None = None) -> np.ndarray:
        parts = self.chunks.get(name, [])
        if parts:
            return np.concatenate(parts)
        return np.zeros((0, width) if width else 0, np.uint8)

    def _states(self) -> dict[str, np.ndarray]:
        h = self.hidden_size
        if self.codec != "zstd":
            states = {"aux": self._joined("aux", self.n_aux * h), "last": self._joined("last", h)}
            if self.codec == "fp8":
                states["aux_scale"] = self._joined("aux_scale", self.n_aux).astype(np.float32)
                states["last_scale"] = self._joined("last_scale").astype(np.float32)
            return states
        # One frame per sample, so a reader decompresses only the sample it is asked for.
        zstd = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
        frames = [
            zstd.compress(to_planes(np.concatenate([a, b], axis=1)))
            for a, b in zip(self.chunks.get("aux", []), self.chunks.get("last", []), strict=True)
        ]
        sizes = np.cumsum([0] + [len(f) for f in frames], dtype=np.int64)
        return {
            "states_zst": np.frombuffer(b"".join(frames), np.uint8),
            "states_zst_offsets": sizes,
        }

    def arrays(self) -> tuple[dict[str, np.ndarray], list[str]]:
        names = sorted(set(self.partitions))
        index = {p: i for i, p in enumerate(names)}
        arrays = {
            "tokens": self._joined("tokens").astype(np.int32),
            "loss_mask": self._joined("loss_mask"),
            "offsets": np.cumsum([0, *self.lengths], dtype=np.int64),
            "prompt_lens": np.asarray(self.prompt_lens, np.int32),
            "partition_index": np.asarray([index[p] for p in self.partitions], np.int32),
            "sample_ids": np.frombuffer("\n".join(self.ids).encode(), np.uint8),
            **self._states(),
        }
        return arrays, names

    def shard_metadata(self) -> dict[str, str]:
        return {"codec": self.codec, "hidden_size": str(self.hidden_size), "n_aux": str(self.n_aux)}

    def entry(self) -> dict:
        stats = partition_stats(self.partitions, self.lengths, self.loss, self.prompt_lens, None)
        return {
            "tokens": self.n_tokens,
            "loss_tokens": sum(self.loss),
            "partitions": stats,
            "codec": self.codec,
            "max_abs_error": self.max_abs,
            "max_rel_error": self.max_rel,
        }


class HiddenWriter(DatasetWriter):
    """Appends hidden samples to a hidden-state dataset; see DatasetWriter for the rest.

    `layout` (layer ids, hidden size, n_aux, last_state, target and tokenizer identity, the
    input token dataset) is fixed when the dataset is created: a run whose states would mean
    something else is refused, even with `force`. `codec` may differ between runs with
    `force`; each shard records its own.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        layout: dict,
        codec: str = "raw",
        mode: OpenMode = "auto",
        **options: Any,
    ) -> None:
        if codec not in CODECS:
            raise ValueError(f"unknown codec {codec!r} (one of {', '.join(CODECS)})")
        check_layout(layout, Path(path))
        self.codec = codec
        self.hidden_size, self.n_aux = layout["hidden_size"], len(layout["layer_ids"])
        self._skipped: dict[str, str] = {}
        self._notes_lock = threading.Lock()  # notes arrive here, the commit thread takes them
        super().__init__(path, kind="hidden", mode=mode, fixed={"hidden": layout}, **options)

    def _new_buffer(self) -> _HiddenBuffer:
        return _HiddenBuffer(self.codec, self.hidden_size, self.n_aux)

    def add(self, sample: HiddenSample) -> bool:  # type: ignore[override]
        return super().add(sample)  # type: ignore[arg-type]

    def note_skipped(self, sample_id: str, reason: str) -> None:
        """Record why a sample was left out (NaN states, too long...); the manifest keeps it
        under `skipped` from the next commit on. A later run tries the sample again."""
        with self._notes_lock:
            self._skipped[check_sample_id(sample_id)] = reason

    def _take_notes(self, manifest: dict) -> None:
        with self._notes_lock:
            notes, self._skipped = self._skipped, {}
        if notes:
            manifest.setdefault("skipped", {}).update(notes)

    def commit(self, wait: bool = True) -> None:
        super().commit(wait)
        if wait and self._skipped:  # notes with no sample to commit beside them
            with file_lock(self.path / COMMIT_LOCK):
                manifest = read_json(self.path / MANIFEST)
                self._take_notes(manifest)
                write_json_atomic(self.path / MANIFEST, manifest)

    def _amend_manifest(self, manifest: dict, entry: dict) -> None:
        self._take_notes(manifest)
        # What each codec measured over everything committed: the size and error figures
        # `info` and plan read without opening a shard.
        summary = manifest.setdefault("measured", {}).setdefault(
            entry["codec"], {"tokens": 0, "bytes": 0, "max_abs_error": 0.0, "max_rel_error": 0.0}
        )
        summary["tokens"] += entry["tokens"]
        summary["bytes"] += entry["bytes"]
        summary["bytes_per_token"] = round(summary["bytes"] / max(summary["tokens"], 1), 3)
        for key in ("max_abs_error", "max_rel_error"):
            summary[key] = max(summary[key], entry[key])


# Reading ------------------------------------------------------------------------------------
def check_layout(layout: object, where: Path) -> dict:
    """The manifest's `hidden` section, once it is known to describe states a reader can use."""

    def bad(why: str) -> DatasetError:
        return DatasetError(f"{where}: manifest's hidden-state layout is damaged ({why})")

    if not isinstance(layout, dict):
        raise bad("missing")
    ids, h = layout.get("layer_ids"), layout.get("hidden_size")
    if not (
        isinstance(ids, list)
        and 0 < len(ids) <= MAX_AUX
        and all(type(i) is int and i >= 0 for i in ids)
    ):
        raise bad(f"layer_ids {ids!r}")
    if not (type(h) is int and 0 < h <= MAX_HIDDEN_SIZE):
        raise bad(f"hidden_size {h!r}")
    if layout.get("last_state") not in LAST_STATES:
        raise bad(f"last_state {layout.get('last_state')!r}")
    if not isinstance(layout.get("target", {}), dict):
        raise bad("target is not an object")
    return layout


class HiddenShard:
    """One hidden shard's arrays, as zero-copy views of the mapped file.

    `layout` is the manifest's checked `hidden` section: the shard's hidden size and number
    of auxiliary states must be its, so a frame's exact size never comes from the shard
    alone."""

    def __init__(self, path: Path, entry: dict, verify: bool, layout: dict) -> None:
        self.file = ShardFile(path)
        if verify:
            self.file.verify(entry["xxh3"])
        meta = self.file.metadata
        try:
            self.codec = meta["codec"]
            self.hidden_size, self.n_aux = int(meta["hidden_size"]), int(meta["n_aux"])
            names = self._state_names()
        except (KeyError, ValueError):
            raise DatasetError(
                f"{path}: shard damaged (hidden-state arrays or metadata missing)"
            ) from None
        if (self.hidden_size, self.n_aux) != (layout["hidden_size"], len(layout["layer_ids"])):
            raise shard_damaged(
                path,
                f"hidden size {self.hidden_size} and {self.n_aux} "
                "auxiliary states, the manifest's layout says "
                f"{layout['hidden_size']} and {len(layout['layer_ids'])}",
            )
        f = self.file
        self.partition_names = read_partition_names(f)
        self.tokens = f.array("tokens", "I32", 1)
        self.mask = f.array("loss_mask", "U8", 1)
        self.offsets = f.array("offsets", "I64", 1)
        self.prompt_lens = f.array("prompt_lens", "I32", 1)
        self.partition_index = f.array("partition_index", "I32", 1)
        self.states = {n: f.array(n, _STATE_DTYPES[self.codec][n]) for n in names}
        self._check(entry)
        check_samples(
            f,
            entry,
            self.offsets,
            self.prompt_lens,
            self.partition_index,
            self.partition_names,
            len(self.tokens),
        )
        self.starts: list[int] = self.offsets.tolist()
        if verify:
            check_unique(path, self.ids)
            upto = np.concatenate([[0], np.cumsum(self.mask, dtype=np.int64)])
            loss = upto[self.offsets[1:]] - upto[self.offsets[:-1]]
            check_counts(
                path,
                entry,
                own_counts(
                    self.offsets,
                    self.prompt_lens,
                    loss,
                    self.partition_index,
                    self.partition_names,
                    None,
                ),
            )

    def _state_names(self) -> tuple[str, ...]:
        return tuple(_STATE_DTYPES[self.codec])

    def _check(self, entry: dict) -> None:
        n, t, h = entry["samples"], len(self.tokens), self.hidden_size
        shapes = {
            "aux": (t, self.n_aux * h),
            "last": (t, h),
            "aux_scale": (t, self.n_aux),
            "last_scale": (t,),
            "states_zst_offsets": (n + 1,),
        }
        wrong = [k for k, v in self.states.items() if k in shapes and v.shape != shapes[k]]
        if (
            len(self.offsets) != n + 1
            or len(self.prompt_lens) != n
            or self.mask.shape != (t,)
            or (n and self.offsets[-1] != t)
            or wrong
        ):
            raise DatasetError(
                f"{self.file.path}: shard damaged (array sizes disagree with "
                f"each other or with the manifest's {n} samples)"
            )
        frames = self.states.get("states_zst_offsets")
        if frames is not None and not ascending_from_zero(frames, len(self.states["states_zst"])):
            raise shard_damaged(
                self.file.path,
                "compressed state offsets do not cover "
                f"its {len(self.states['states_zst'])} bytes of frames",
            )

    @cached_property
    def plens(self) -> list[int]:
        return self.prompt_lens.tolist()

    def loss_mask(self, i: int) -> np.ndarray:
        return self.mask[self.starts[i] : self.starts[i + 1]]

    @cached_property
    def ids(self) -> list[str]:
        return read_ids(self.file, len(self.prompt_lens))

    def _decode(self, i: int, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        s, h = self.states, self.hidden_size
        if self.codec == "raw":
            return from_bf16(s["aux"][start:end]), from_bf16(s["last"][start:end])
        if self.codec == "fp8":
            aux = from_fp8(
                s["aux"][start:end].reshape(end - start, self.n_aux, h), s["aux_scale"][start:end]
            )
            return (
                aux.reshape(end - start, -1),
                from_fp8(s["last"][start:end], s["last_scale"][start:end]),
            )
        lo, hi = s["states_zst_offsets"][i], s["states_zst_offsets"][i + 1]
        values = (end - start) * (self.n_aux + 1) * h
        try:
            # Bounded by the sample's exact size: a frame can never allocate more.
            data = unzstd(s["states_zst"][lo:hi].tobytes(), 2 * values)
            both = from_bf16(from_planes(data, values))
        except ValueError:
            raise DatasetError(
                f"{self.file.path}: shard damaged (sample {i}'s compressed states do not decode)"
            ) from None
        both = both.reshape(end - start, -1)
        return both[:, : self.n_aux * h], both[:, self.n_aux * h :]

    def sample(self, i: int) -> HiddenSample:
        start, end = self.starts[i], self.starts[i + 1]
        aux, last = self._decode(i, start, end)
        return HiddenSample(
            sample_id=self.ids[i],
            input_ids=self.tokens[start:end],
            loss_mask=self.mask[start:end],
            aux=aux,
            last=last,
            partition=self.partition_names[self.partition_index[i]],
            prompt_len=int(self.prompt_lens[i]),
        )


def open_shard(path: Path, entry: dict, verify: bool, ds: Dataset) -> HiddenShard:
    """A hidden shard of `ds`, for any reader of the dataset (e.g. `info`'s plain Dataset)."""
    layout = check_layout(ds.manifest.get("hidden"), ds.path / MANIFEST)
    return HiddenShard(path, entry, verify, layout)


SHARD_OPENERS["hidden"] = open_shard


class HiddenDataset(Dataset):
    """A committed hidden-state dataset, opened read-only; `ds[i]` is a HiddenSample.

    Counts come from the manifest; shards are memory-mapped and checked against their
    checksums when first touched. Anything wrong raises DatasetError naming the file.
    """

    def __init__(
        self, path: str | Path, *, verify_shards: bool = True, warn_stray: bool = True
    ) -> None:
        super().__init__(path, kind="hidden", verify_shards=verify_shards, warn_stray=warn_stray)
        self.layout = check_layout(self.manifest.get("hidden"), self.path / MANIFEST)

    @property
    def layer_ids(self) -> list[int]:
        """The auxiliary states' ids, boundary convention, in the order `aux` holds them."""
        return list(self.layout["layer_ids"])

    @property
    def hidden_size(self) -> int:
        return int(self.layout["hidden_size"])

    @property
    def last_state(self) -> str:
        """ "pre_norm": `last` is the last decoder layer's output, before the final norm."""
        return str(self.layout["last_state"])

    @property
    def target(self) -> dict:
        """The target's identity (config hash, vocab size, depth...) and where it was."""
        where = self.manifest.get("provenance", {}).get("target")
        return {**self.layout.get("target", {}), "path": where}

    @property
    def tokenizer(self) -> dict:
        return dict(self.layout.get("tokenizer") or {})

    @property
    def skipped(self) -> dict[str, str]:
        """Sample id -> why extract left it out, for the samples not in the dataset."""
        return dict(self.manifest.get("skipped", {}))

    @property
    def measured(self) -> dict:
        """Per codec: tokens, bytes, bytes_per_token, max_abs_error, max_rel_error."""
        return dict(self.manifest.get("measured", {}))


def committed_ids(path: Path) -> set[str]:
    """The sample ids a dataset at `path` already holds (none when there is no dataset),
    reading only their arrays: what a run would skip, for estimates made before it starts."""
    if not is_dataset(Path(path)):
        return set()
    ds = Dataset(path, kind="hidden", verify_shards=False, warn_stray=False)
    return read_committed_ids(ds.path, ds.manifest)

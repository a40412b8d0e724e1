"""Writing a hidden-state dataset: the queued samples packed into a shard's arrays in the
chosen codec, over the token datasets' directory, run lock and commit protocol (writer.py).
See eagle3kit.format.hidden for what a hidden shard holds, and docs/format.md.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

from eagle3kit._lock import file_lock
from eagle3kit.format._ints import to_int32
from eagle3kit.format._io import read_json, write_json_atomic
from eagle3kit.format.buffer import partition_stats
from eagle3kit.format.hidden import CODECS, ZSTD_LEVEL, HiddenSample
from eagle3kit.format.hidden_reader import check_layout
from eagle3kit.format.layout import COMMIT_LOCK, MANIFEST
from eagle3kit.format.sample import check_sample_id
from eagle3kit.format.state_codecs import (
    from_bf16,
    from_fp8,
    round_trip_errors,
    to_bf16,
    to_fp8,
    to_planes,
)
from eagle3kit.format.writer import DatasetWriter, OpenMode


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

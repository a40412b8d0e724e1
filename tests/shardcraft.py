"""Crafted shards: real datasets written by the writer, then rewritten with other contents and
their checksums recomputed, as a dataset from elsewhere can be (the checksums guard against
disks and copies, not against whoever made the files)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import zstandard

from eagle3kit.format import DatasetWriter, HiddenSample, HiddenWriter, TokenSample
from eagle3kit.format.layout import MANIFEST, SHARD_DIR
from eagle3kit.format.shard import ShardFile, file_checksum, write_shard

Arrays = dict[str, np.ndarray]
HIDDEN_LAYOUT = {"layer_ids": [1, 2, 3], "hidden_size": 8, "last_state": "pre_norm"}


def token_samples(n: int) -> list[TokenSample]:
    return [
        TokenSample(
            sample_id=f"s{i:03d}",
            prompt_ids=list(range(10 + i, 15 + 2 * i)),
            completion_ids=[500 + i + k for k in range(i % 4 + 1)],
            finish_reason="length" if i % 3 == 2 else "stop",
            partition="math" if i % 2 else "code",
            metadata={"i": i} if i % 2 else {},
        )
        for i in range(n)
    ]


def token_dataset(path: Path, shards: int = 3, per_shard: int = 4) -> Path:
    with DatasetWriter(path, commit_every=per_shard, config={"stage": "test"}) as writer:
        for sample in token_samples(shards * per_shard):
            writer.add(sample)
    return path


def hidden_dataset(path: Path, codec: str, shards: int = 2, per_shard: int = 3) -> Path:
    rng = np.random.default_rng(0)
    h, a = HIDDEN_LAYOUT["hidden_size"], len(HIDDEN_LAYOUT["layer_ids"])
    with HiddenWriter(path, layout=HIDDEN_LAYOUT, codec=codec, commit_every=per_shard) as w:
        for i in range(shards * per_shard):
            t = 2 + i % 3
            w.add(
                HiddenSample(
                    f"h{i}",
                    np.arange(t, dtype=np.int32) + i,
                    np.ones(t, np.uint8),
                    rng.standard_normal((t, a * h), np.float32),
                    rng.standard_normal((t, h), np.float32),
                    prompt_len=1,
                )
            )
    return path


def shard_paths(ds: Path) -> list[Path]:
    manifest = json.loads((ds / MANIFEST).read_text())
    return [ds / SHARD_DIR / s["name"] for s in manifest["shards"]]


def read_shard(path: Path) -> tuple[Arrays, dict[str, str], dict[str, str]]:
    """(arrays, header metadata without its checksum, safetensors dtypes) of a shard."""
    f = ShardFile(path)
    arrays = {n: np.array(f.array(n)) for n in f.names()}
    metadata = {k: v for k, v in f.metadata.items() if k != "content_xxh3"}
    return arrays, metadata, {n: f.dtype(n) for n in f.names()}


def recompute(ds: Path, shard: Path) -> None:
    """The manifest's size and checksum of `shard` made to match its bytes again."""
    manifest = json.loads((ds / MANIFEST).read_text())
    for entry in manifest["shards"]:
        if entry["name"] == shard.name:
            entry["bytes"], entry["xxh3"] = shard.stat().st_size, file_checksum(shard)
    (ds / MANIFEST).write_text(json.dumps(manifest))


def rewrite(ds: Path, k: int, edit: Callable[[Arrays, dict[str, str]], object]) -> Path:
    """Shard `k` of `ds` with `edit` applied to its arrays and metadata, both checksums
    recomputed: it reads as intact."""
    shard = shard_paths(ds)[k]
    arrays, metadata, dtypes = read_shard(shard)
    edit(arrays, metadata)
    keep = {n: d for n, d in dtypes.items() if d in ("BF16", "F8_E4M3") and n in arrays}
    write_shard(shard, arrays, metadata, keep)
    recompute(ds, shard)
    return shard


def zst(data: bytes) -> np.ndarray:
    return np.frombuffer(zstandard.ZstdCompressor(level=3).compress(data), np.uint8)


def bomb(payload: bytes, padding: int, stated: bool) -> np.ndarray:
    """A zstd frame of `payload` with `padding` spaces before its last byte (valid JSON stays
    valid), compressed in pieces so the test never holds the expanded bytes. `stated`: the
    frame header states its content size (as `compress` writes it) or not."""
    size = len(payload) + padding if stated else -1
    co = zstandard.ZstdCompressor(level=1).compressobj(size=size)
    out = [co.compress(payload[:-1])]
    piece = b" " * (1 << 20)
    for at in range(0, padding, len(piece)):
        out.append(co.compress(piece[: min(len(piece), padding - at)]))
    out += [co.compress(payload[-1:]), co.flush()]
    return np.frombuffer(b"".join(out), np.uint8)

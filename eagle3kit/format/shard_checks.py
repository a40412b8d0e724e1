"""The checks a shard passes when it is opened, token and hidden-state shards alike: its
per-sample arrays agree with each other and with its manifest entry, its ids are unique, its
metadata well formed, its counts the manifest's. A shard from elsewhere can hold anything
its checksums were recomputed over: each disagreement is a DatasetError naming the shard.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import orjson

from eagle3kit.format.errors import DatasetError
from eagle3kit.format.shard import ShardFile


def shard_damaged(path: Path, why: str) -> DatasetError:
    return DatasetError(f"{path}: shard damaged ({why})")


_META_TYPES: dict[str, tuple[type, ...]] = {
    "source": (dict,),
    "server": (dict,),
    "counts": (dict,),
    "metadata": (dict,),
    "latency": (int, float),
}


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
    if not (
        isinstance(names, list)
        and all(isinstance(p, str) for p in names)
        and len(set(names)) == len(names)
    ):
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


def check_samples(
    f: ShardFile,
    entry: dict,
    offsets: np.ndarray,
    prompt_lens: np.ndarray,
    partition_index: np.ndarray,
    names: list[str],
    n_tokens: int,
) -> None:
    """The per-sample arrays every shard has agree with each other and with the manifest's
    sample count: what every later index into them relies on."""
    n = entry["samples"]
    if len(prompt_lens) != n or len(offsets) != n + 1:
        raise DatasetError(
            f"{f.path}: shard holds {len(prompt_lens)} samples, the manifest says {n}"
        )
    if len(partition_index) != n:
        raise shard_damaged(f.path, f"{len(partition_index)} partition indices for {n} samples")
    check_token_count(f.path, entry, offsets, n_tokens)
    if n and ((prompt_lens < 0).any() or (prompt_lens > np.diff(offsets)).any()):
        raise shard_damaged(f.path, "a prompt length is negative or longer than its sample")
    if n and ((partition_index < 0).any() or (partition_index >= len(names)).any()):
        raise shard_damaged(f.path, "a partition index points past the header's partitions")


def check_spans(
    f: ShardFile, offsets: np.ndarray, spans: np.ndarray, span_offsets: np.ndarray
) -> None:
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
        raise DatasetError(
            f"{path}: shard damaged (its offsets do not cover its {n_tokens} tokens)"
        )
    if n_tokens != entry["tokens"]:
        raise DatasetError(
            f"{path}: the manifest's counts differ from the shard's own (tokens: "
            f"the manifest says {entry['tokens']}, the shard holds {n_tokens}); "
            "the manifest was edited or damaged"
        )


def own_counts(
    offsets: np.ndarray,
    prompt_lens: np.ndarray,
    loss: np.ndarray,
    partition_index: np.ndarray,
    names: list[str],
    finish: Sequence[str | None] | None,
) -> dict:
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
        for reason in [finish[i] for i in np.flatnonzero(m).tolist()] if finish is not None else []:
            reasons[reason] = reasons.get(reason, 0) + 1
        partitions[name] = {
            "samples": int(m.sum()),
            "tokens": int(lengths[m].sum()),
            "loss_tokens": int(loss[m].sum()),
            "completion_tokens": int(comp[m].sum()),
            "finish": reasons,
        }
    return {"loss_tokens": int(loss.sum()), "partitions": partitions}


def check_counts(path: Path, entry: dict, own: dict) -> None:
    """The manifest's loss tokens and per-partition counts for a shard are the shard's own."""
    differ = []
    if own["loss_tokens"] != entry["loss_tokens"]:
        differ.append(
            f"loss_tokens: the manifest says {entry['loss_tokens']}, the shard "
            f"holds {own['loss_tokens']}"
        )
    stated = entry["partitions"]
    for name in sorted(set(stated) | set(own["partitions"])):
        said, held = stated.get(name), own["partitions"].get(name)
        if said is None or held is None:
            differ.append(
                f"partition {name!r}: "
                + ("not in the shard" if held is None else "not in the manifest")
            )
            continue
        for key in ("samples", "tokens", "loss_tokens", "completion_tokens", "finish"):
            if said.get(key) != held[key]:
                differ.append(
                    f"partition {name!r} {key}: the manifest says "
                    f"{said.get(key)}, the shard holds {held[key]}"
                )
    if differ:
        raise DatasetError(
            f"{path}: the manifest's counts differ from the shard's own "
            f"({'; '.join(differ[:3])}); the manifest was edited or damaged"
        )

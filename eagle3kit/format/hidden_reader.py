"""Reading a hidden-state dataset: its manifest's layout checked, each shard's states opened
(and decoded from its codec) when first needed, and the ids a partial run committed. See
eagle3kit.format.hidden for what a hidden shard holds, and docs/format.md.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

import numpy as np

from eagle3kit.format.dataset_dir import is_dataset
from eagle3kit.format.errors import DatasetError
from eagle3kit.format.hidden import (
    LAST_STATES,
    MAX_AUX,
    MAX_HIDDEN_SIZE,
    STATE_DTYPES,
    HiddenSample,
)
from eagle3kit.format.layout import MANIFEST
from eagle3kit.format.reader import SHARD_OPENERS, Dataset, read_committed_ids
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
)


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
        self.states = {n: f.array(n, STATE_DTYPES[self.codec][n]) for n in names}
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
        return tuple(STATE_DTYPES[self.codec])

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

"""`eagle3kit convert --to speculators|specforge`: a hidden-state dataset exported to the
tool's per-sample files (the formats: `hidden.py`). Rerunning an export continues it: files
already written are kept."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from eagle3kit import _ui
from eagle3kit._durable import write_atomic
from eagle3kit.convert.config import HS_DIR, ConvertConfig
from eagle3kit.convert.hidden import (
    SF_GROUP,
    SIDECAR,
    bf16,
    check_target,
    hidden_result,
    import_datasets,
    read_sidecar,
)
from eagle3kit.convert.result import ConvertResult
from eagle3kit.errors import UserError
from eagle3kit.format import HiddenDataset, HiddenSample
from eagle3kit.target import read_config


def export_hidden(cfg: ConvertConfig) -> ConvertResult:
    """`--to speculators` or `--to specforge`."""
    return export_speculators(cfg) if cfg.to == "speculators" else export_specforge(cfg)


class _Export:
    """An export directory: refused when it holds something else, continued when it holds an
    unfinished export of the same dataset (files already written are kept)."""

    def __init__(self, cfg: ConvertConfig, ds: HiddenDataset, last_state: str) -> None:
        self.dst, self.tool = cfg.dst, str(cfg.to)
        self.header = {
            "written_by": "eagle3kit convert",
            "format": self.tool,
            "source": str(cfg.src.resolve()),
            "last_state": last_state,
            "layout": {**ds.layout, "last_state": last_state},
        }
        sidecar = self.dst / SIDECAR
        if self.dst.exists() and (not self.dst.is_dir() or any(self.dst.iterdir())):
            old = read_sidecar(self.dst) if sidecar.is_file() else None
            if old is None or {k: old.get(k) for k in ("format", "source")} != {
                "format": self.tool,
                "source": self.header["source"],
            }:
                raise UserError(
                    f"{self.dst}: exists and is not an export of {cfg.src} to "
                    f"{self.tool}; choose a new directory or remove it"
                )
        self.dst.mkdir(parents=True, exist_ok=True)
        self._save({**self.header, "complete": False})

    def _save(self, body: dict) -> None:
        write_atomic(
            self.dst / SIDECAR,
            lambda tmp: tmp.write_bytes(orjson.dumps(body, option=orjson.OPT_INDENT_2)),
        )

    def finish(self, samples: list[dict]) -> None:
        self._save({**self.header, "complete": True, "samples": samples})


def _export_samples(cfg: ConvertConfig, ds: HiddenDataset) -> Iterator[tuple[int, HiddenSample]]:
    with _ui.Progress("convert", len(ds), cfg.output, unit="samples") as progress:
        for i in range(len(ds)):
            sample = ds[i]
            yield i, sample
            progress.add(1, tokens=sample.num_tokens)


def _record(sample: HiddenSample) -> dict:
    return {
        "sample_id": sample.sample_id,
        "partition": sample.partition,
        "prompt_len": int(sample.prompt_len),
    }


def export_speculators(cfg: ConvertConfig) -> ConvertResult:
    """DST as speculators' --data-path: the token data (HF dataset) and hidden_states/."""
    datasets = import_datasets()
    import torch
    from safetensors.torch import save_file

    ds = HiddenDataset(cfg.src)
    _ui.warn_all(ds.warnings)
    out = _Export(cfg, ds, "pre_norm")
    hs_dir = cfg.dst / HS_DIR
    hs_dir.mkdir(exist_ok=True)
    ids: list[np.ndarray] = []
    masks: list[np.ndarray] = []
    records: list[dict] = []
    written = kept = 0
    for i, s in _export_samples(cfg, ds):
        ids.append(s.input_ids)  # views of the mapped shards: no copy held
        masks.append(s.loss_mask)
        records.append(_record(s))
        path = hs_dir / f"hs_{i}.safetensors"
        if path.is_file():
            kept += 1
            continue
        n, h = s.num_tokens, ds.hidden_size
        # [T, L, H]: the aux layers in order, then the last layer's pre-norm output.
        states = np.concatenate([s.aux.reshape(n, -1, h), s.last.reshape(n, 1, h)], axis=1)
        tensors = {
            "hidden_states": bf16(states),
            "token_ids": torch.from_numpy(np.asarray(s.input_ids, np.int64)),
        }
        write_atomic(path, partial(save_file, tensors))  # save_file(tensors, tmp)
        written += 1
    _save_token_data(datasets, cfg.dst, ids, masks)
    out.finish(records)
    _ui.info(
        f"{cfg.dst}: {len(ds):,} samples for speculators ({written:,} written, {kept:,} "
        f"already there); train with --data-path {cfg.dst}",
        cfg.output,
    )
    return hidden_result("export", cfg.dst, written, kept)


def _save_token_data(
    datasets: Any, dst: Path, ids: list[np.ndarray], masks: list[np.ndarray]
) -> None:
    """The columns speculators' prepare_data.py saves (torch format), built straight from
    arrays: no Python list per token."""
    import pyarrow as pa

    lengths = np.array([len(x) for x in ids], np.int64)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))

    def column(parts: list[np.ndarray]) -> Any:
        flat = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
        return pa.LargeListArray.from_arrays(offsets, pa.array(flat)).cast(pa.list_(pa.int64()))

    table = pa.table(
        {"input_ids": column(ids), "loss_mask": column(masks), "seq_len": pa.array(lengths)}
    )
    datasets.Dataset(table).with_format("torch").save_to_disk(str(dst))


def export_specforge(cfg: ConvertConfig) -> ConvertResult:
    """DST as SpecForge's --hidden-states-path: rows_<g>-<g+2000>/data_<i>.ckpt."""
    import torch

    ds = HiddenDataset(cfg.src)
    _ui.warn_all(ds.warnings)
    norm = None
    if ds.last_state == "pre_norm":
        check_target(ds, Path(str(cfg.target)))
        norm = _final_norm(Path(str(cfg.target)))
    out = _Export(cfg, ds, "post_norm")
    records: list[dict] = []
    written = kept = 0
    for i, s in _export_samples(cfg, ds):
        records.append(_record(s))
        group = (i // SF_GROUP) * SF_GROUP
        folder = cfg.dst / f"rows_{group}-{group + SF_GROUP}"
        path = folder / f"data_{i}.ckpt"
        if path.is_file():
            kept += 1
            continue
        folder.mkdir(exist_ok=True)
        last = torch.from_numpy(np.ascontiguousarray(s.last, np.float32))
        if norm is not None:
            with torch.no_grad():
                last = norm(last)
        record = {  # prepare_hidden_states.py's keys, in its order
            "input_ids": torch.from_numpy(np.asarray(s.input_ids, np.int64)),
            "loss_mask": torch.from_numpy(np.asarray(s.loss_mask, np.int64)),
            "aux_hidden_state": bf16(s.aux)[None],
            "hidden_state": last.to(torch.bfloat16)[None],
        }
        write_atomic(path, partial(torch.save, record))  # torch.save(record, tmp)
        written += 1
    out.finish(records)
    _ui.info(
        f"{cfg.dst}: {len(ds):,} samples for SpecForge ({written:,} written, {kept:,} "
        f"already there); train with --hidden-states-path {cfg.dst}",
        cfg.output,
    )
    return hidden_result("export", cfg.dst, written, kept)


def _final_norm(target: Path) -> Any:
    """The target's own final-norm module with its weights (fp32), whatever its kind."""
    import torch

    from eagle3kit.target import TargetHead

    head = TargetHead.load(target, read_config(target))
    return head.norm.to(torch.float32).eval()

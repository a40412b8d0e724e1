"""`eagle3kit convert` for hidden-state datasets: to and from speculators' and SpecForge's
per-sample files (docs/convert.md, "Hidden states: speculators and SpecForge").

speculators (vllm-project/speculators). Its token data is a Hugging Face dataset saved with
`save_to_disk` in torch format, columns `input_ids`, `loss_mask` (int64 lists) and `seq_len`
(scripts/prepare_data.py, src/speculators/data_generation/preprocessing.py); beside it,
`hidden_states/hs_<i>.safetensors` holds row i's states as vLLM's hidden-states connector writes
them: `hidden_states` [T, L, H], the aux layers in order then the last layer (id N), and
`token_ids` [T] (scripts/data_generation_offline.py, scripts/launch_vllm.py,
src/speculators/train/data.py). The last slot is the last decoder layer's output BEFORE the
final norm: speculators applies `verifier_norm` itself (EAGLE3.md §1.1), as eagle3kit does.

SpecForge (sgl-project/SpecForge). scripts/prepare_hidden_states.py writes one
`torch.save`d dict per sample, `rows_<g>-<g+2000>/data_<i>.ckpt` (`.ckpt.gz` with
--compress): `input_ids` [T] and `loss_mask` [T] (int64), `aux_hidden_state` [1, T, n*H] and
`hidden_state` [1, T, H] (specforge/algorithms/common/providers.py OfflineCaptureLayout,
specforge/data/preprocessing.py OfflineEagle3Dataset). `hidden_state` is the state AFTER the
final norm, the lm_head input (specforge/offline_capture/sglang_backend/utils.py stores the
logits processor's input); SpecForge's trainer applies only lm_head to it (EAGLE3.md §2).

Mapping the last state: export to SpecForge applies the target's final norm (--target); the
norm cannot be undone, so an import from SpecForge records `last_state: "post_norm"` and train
then applies only lm_head; such a dataset can go back to SpecForge but not to speculators.
SpecForge files are read with `torch.load(weights_only=True)` and nothing else is unpickled:
a file that needs more than tensors and plain containers is refused.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from eagle3kit import _ui
from eagle3kit._durable import write_atomic
from eagle3kit.checkpoints.tensors import BadFile, load_tensor_file
from eagle3kit.errors import UserError
from eagle3kit.format import Dataset, HiddenDataset, HiddenSample, HiddenWriter, is_dataset
from eagle3kit.target import (
    TargetInfo,
    check_layer_ids,
    identity_mismatch,
    parse_layer_ids,
    read_config,
    resolve_layer_ids,
)

if TYPE_CHECKING:
    from eagle3kit.convert.config import ConvertConfig
    from eagle3kit.convert.result import ConvertResult

TOOLS = ("speculators", "specforge")
SIDECAR = "eagle3kit-export.json"
"""What an export adds beside the tool's files (ids, partitions, layers, target), so importing
it back restores them; the tools ignore it."""
HS_DIR = "hidden_states"
HS_FILE = re.compile(r"^hs_(\d+)\.safetensors$")
SF_FILE = re.compile(r"^data_(\d+)\.ckpt(\.gz)?$")
SF_GROUP = 2000
"""prepare_hidden_states.py's default file_group_size: files per rows_<g>-<g+2000> folder."""
SF_KEYS = ("input_ids", "loss_mask", "aux_hidden_state", "hidden_state")
NAMES = {"speculators": "speculators", "specforge": "SpecForge"}


# Deciding what to do -----------------------------------------------------------------------
def detect(src: Path) -> str | None:
    """"eagle3kit" (a hidden-state dataset), "speculators", "specforge", or None (not ours)."""
    if is_dataset(src):
        kind = Dataset(src, kind=None, verify_shards=False, warn_stray=False).kind
        return "eagle3kit" if kind == "hidden" else None
    if not src.is_dir():
        return None
    if (src / "state.json").is_file():
        if not (src / HS_DIR).is_dir():
            raise UserError(f"{src}: a Hugging Face dataset without a {HS_DIR}/ folder: no "
                            "speculators hidden states to import (speculators' "
                            "data_generation_offline.py writes them there)")
        return "speculators"
    if any(HS_FILE.match(p.name) for p in src.iterdir()):
        raise UserError(f"{src}: speculators' {HS_DIR} folder; give its parent, the token data "
                        "(what speculators' train reads as --data-path)")
    if any((p.is_dir() and p.name.startswith("rows_")) or SF_FILE.match(p.name)
           for p in src.iterdir()):
        return "specforge"
    return None


def check_config(cfg: ConvertConfig) -> str | None:
    """"export" or "import" for a hidden-state conversion, None for a token one; a flag that
    does not fit is refused here, before anything is read or written."""
    if cfg.to is not None and cfg.to not in TOOLS:
        raise UserError(f"--to must be one of {', '.join(TOOLS)} (got {cfg.to!r})")
    if cfg.target is not None and not Path(cfg.target).is_dir():
        raise UserError(f"--target {cfg.target}: no such directory")
    source = detect(cfg.src)
    if source is None:
        if cfg.to and is_dataset(cfg.src):
            raise UserError(f"--to {cfg.to}: {cfg.src} is a token dataset; --to converts a "
                            "hidden-state dataset (from extract). A token dataset exports to "
                            "JSONL without --to")
        if cfg.to or cfg.target or cfg.layers:
            raise UserError("--to, --target and --layers apply to hidden-state conversions "
                            "(a hidden-state dataset, or speculators' or SpecForge's files)")
        return None
    if cfg.tokenizer or cfg.partition:
        raise UserError("--tokenizer and --partition apply to token datasets exported to JSONL")
    if source != "eagle3kit":
        if cfg.to:
            raise UserError(f"--to {cfg.to}: {cfg.src} holds {NAMES[source]} files, which are "
                            "imported into a hidden-state dataset: leave out --to")
        return "import"
    if cfg.to is None:
        raise UserError(f"{cfg.src} is a hidden-state dataset: give --to speculators or "
                        "--to specforge to export it")
    if cfg.skip_bad_lines or cfg.write.mode != "auto" or cfg.write.force:
        raise UserError("--skip-bad-lines, --resume, --overwrite and --force apply to import "
                        "only (rerunning an export continues it)")
    if cfg.layers:
        raise UserError("--layers applies to import: the dataset records its layers")
    if str(cfg.dst) == "-":
        raise UserError(f"--to {cfg.to} writes a directory; '-' (stdout) is for JSONL")
    last = HiddenDataset(cfg.src, verify_shards=False, warn_stray=False).last_state
    if cfg.to == "speculators":
        if last == "post_norm":
            raise UserError(f"{cfg.src} holds the last state after the final norm (imported "
                            "from SpecForge); speculators needs it before the norm, which "
                            "cannot be recovered: extract the states again with eagle3kit")
        if cfg.target is not None:
            raise UserError("--target is needed only with --to specforge (speculators keeps "
                            "the last state before the norm, as the dataset does)")
    elif last == "pre_norm" and cfg.target is None:
        raise UserError("--to specforge needs --target (the target model directory): SpecForge "
                        "stores the last state after the final norm, so export applies the "
                        "target's norm weights")
    return "export"


def run(cfg: ConvertConfig) -> ConvertResult:
    if cfg.hidden == "export":
        return export_speculators(cfg) if cfg.to == "speculators" else export_specforge(cfg)
    return import_hidden(cfg)


# Shared pieces -----------------------------------------------------------------------------
def _result(direction: str, dst: Path, written: int, skipped: int = 0, bad: int = 0
            ) -> ConvertResult:
    from eagle3kit.convert.result import ConvertResult

    return ConvertResult(direction, written, skipped_existing=skipped, bad_lines=bad,
                         dst=str(dst))


def _bf16(x: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(torch.bfloat16)


def _check_target(ds: HiddenDataset, target: Path) -> dict:
    """--target is the model the states came from, as far as the dataset recorded it."""
    ours = TargetInfo.load(target).identity
    mismatch = identity_mismatch(ds.target, ours)
    if mismatch:
        key, theirs, actual = mismatch
        raise UserError(f"--target {target}: not the model {ds.path} was extracted from "
                        f"({key} {actual!r}, the dataset records {theirs!r})")
    return ours


class _Export:
    """An export directory: refused when it holds something else, continued when it holds an
    unfinished export of the same dataset (files already written are kept)."""

    def __init__(self, cfg: ConvertConfig, ds: HiddenDataset, last_state: str) -> None:
        self.dst, self.tool = cfg.dst, str(cfg.to)
        self.header = {"written_by": "eagle3kit convert", "format": self.tool,
                       "source": str(cfg.src.resolve()), "last_state": last_state,
                       "layout": {**ds.layout, "last_state": last_state}}
        sidecar = self.dst / SIDECAR
        if self.dst.exists() and (not self.dst.is_dir() or any(self.dst.iterdir())):
            old = _read_sidecar(self.dst) if sidecar.is_file() else None
            if old is None or {k: old.get(k) for k in ("format", "source")} != {
                    "format": self.tool, "source": self.header["source"]}:
                raise UserError(f"{self.dst}: exists and is not an export of {cfg.src} to "
                                f"{self.tool}; choose a new directory or remove it")
        self.dst.mkdir(parents=True, exist_ok=True)
        self._save({**self.header, "complete": False})

    def _save(self, body: dict) -> None:
        write_atomic(self.dst / SIDECAR, lambda tmp: tmp.write_bytes(
            orjson.dumps(body, option=orjson.OPT_INDENT_2)))

    def finish(self, samples: list[dict]) -> None:
        self._save({**self.header, "complete": True, "samples": samples})


def _read_sidecar(where: Path) -> dict | None:
    path = where / SIDECAR
    if not path.is_file():
        return None
    try:
        body = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise UserError(f"{path}: unreadable ({exc}); remove it to import without it") from None
    if not isinstance(body, dict) or not isinstance(body.get("layout"), dict):
        raise UserError(f"{path}: not an eagle3kit export record; remove it to import "
                        "without it")
    return body


def _export_samples(cfg: ConvertConfig, ds: HiddenDataset) -> Iterator[tuple[int, HiddenSample]]:
    with _ui.Progress("convert", len(ds), cfg.output, unit="samples") as progress:
        for i in range(len(ds)):
            sample = ds[i]
            yield i, sample
            progress.add(1, tokens=sample.num_tokens)


def _record(sample: HiddenSample) -> dict:
    return {"sample_id": sample.sample_id, "partition": sample.partition,
            "prompt_len": int(sample.prompt_len)}


# Export ------------------------------------------------------------------------------------
def export_speculators(cfg: ConvertConfig) -> ConvertResult:
    """DST as speculators' --data-path: the token data (HF dataset) and hidden_states/."""
    datasets = _datasets()
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
        tensors = {"hidden_states": _bf16(states),
                   "token_ids": torch.from_numpy(np.asarray(s.input_ids, np.int64))}
        write_atomic(path, partial(save_file, tensors))  # save_file(tensors, tmp)
        written += 1
    _save_token_data(datasets, cfg.dst, ids, masks)
    out.finish(records)
    _ui.info(f"{cfg.dst}: {len(ds):,} samples for speculators ({written:,} written, {kept:,} "
             f"already there); train with --data-path {cfg.dst}", cfg.output)
    return _result("export", cfg.dst, written, kept)


def _datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise UserError("--to speculators and speculators imports need the `datasets` package "
                        "(pip install 'eagle3kit[hf]'): speculators keeps its token data as a "
                        "Hugging Face dataset") from None
    datasets.disable_progress_bars()
    return datasets


def _save_token_data(datasets: Any, dst: Path, ids: list[np.ndarray],
                     masks: list[np.ndarray]) -> None:
    """The columns speculators' prepare_data.py saves (torch format), built straight from
    arrays: no Python list per token."""
    import pyarrow as pa

    lengths = np.array([len(x) for x in ids], np.int64)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))

    def column(parts: list[np.ndarray]) -> Any:
        flat = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
        return pa.LargeListArray.from_arrays(offsets, pa.array(flat)).cast(pa.list_(pa.int64()))

    table = pa.table({"input_ids": column(ids), "loss_mask": column(masks),
                      "seq_len": pa.array(lengths)})
    datasets.Dataset(table).with_format("torch").save_to_disk(str(dst))


def export_specforge(cfg: ConvertConfig) -> ConvertResult:
    """DST as SpecForge's --hidden-states-path: rows_<g>-<g+2000>/data_<i>.ckpt."""
    import torch

    ds = HiddenDataset(cfg.src)
    _ui.warn_all(ds.warnings)
    norm = None
    if ds.last_state == "pre_norm":
        _check_target(ds, Path(str(cfg.target)))
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
            "aux_hidden_state": _bf16(s.aux)[None],
            "hidden_state": last.to(torch.bfloat16)[None],
        }
        write_atomic(path, partial(torch.save, record))  # torch.save(record, tmp)
        written += 1
    out.finish(records)
    _ui.info(f"{cfg.dst}: {len(ds):,} samples for SpecForge ({written:,} written, {kept:,} "
             f"already there); train with --hidden-states-path {cfg.dst}", cfg.output)
    return _result("export", cfg.dst, written, kept)


def _final_norm(target: Path) -> Any:
    """The target's own final-norm module with its weights (fp32), whatever its kind."""
    import torch

    from eagle3kit.target import TargetHead

    head = TargetHead.load(target, read_config(target))
    return head.norm.to(torch.float32).eval()


# Import ------------------------------------------------------------------------------------
@dataclass
class _Item:
    index: int
    path: Path


def _speculators_items(src: Path, rows: int) -> tuple[list[_Item], list[Path]]:
    found = {int(m.group(1)): p for p in (src / HS_DIR).iterdir()
             if (m := HS_FILE.match(p.name))}
    stray = sorted(i for i in found if i >= rows)
    if stray:
        raise UserError(f"{found[stray[0]]}: row {stray[0]} of the hidden states, but the token "
                        f"data in {src} has only {rows} rows: another run's files?")
    items = [_Item(i, p) for i, p in sorted(found.items())]
    missing = [src / HS_DIR / f"hs_{i}.safetensors" for i in range(rows) if i not in found]
    return items, missing


def _specforge_items(src: Path) -> list[_Item]:
    items: dict[int, Path] = {}
    for root, _dirs, names in os.walk(src):
        for name in names:
            if not name.endswith((".ckpt", ".ckpt.gz")):
                continue
            path = Path(root) / name
            m = SF_FILE.match(name)
            if m is None:
                raise UserError(f"{path}: not named data_<i>.ckpt as SpecForge names its files")
            if int(m.group(1)) in items:
                raise UserError(f"{path}: sample {m.group(1)} also in {items[int(m.group(1))]}")
            items[int(m.group(1))] = path
    return [_Item(i, p) for i, p in sorted(items.items())]


def _read_speculators(path: Path, ids: np.ndarray, mask: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError) as exc:
        raise BadFile(f"{path}: not a readable safetensors file ({exc})") from None
    missing = [k for k in ("hidden_states", "token_ids") if k not in tensors]
    if missing:
        raise BadFile(f"{path}: no {', '.join(missing)} (speculators' files hold "
                      "hidden_states [T, L, H] and token_ids [T])")
    states, echoed = tensors["hidden_states"], tensors["token_ids"]
    if states.ndim != 3 or states.shape[1] < 2 or states.shape[0] != len(ids):
        raise BadFile(f"{path}: hidden_states has shape {list(states.shape)}, expected "
                      f"[{len(ids)}, L, H] with L >= 2 (the aux layers, then the last)")
    if not np.array_equal(echoed.numpy().reshape(-1), ids):
        raise BadFile(f"{path}: token_ids differ from row {path.stem[3:]}'s input_ids in the "
                      "token data")
    stacked = states.float().numpy()
    n = len(ids)
    return ids, mask, stacked[:, :-1].reshape(n, -1), stacked[:, -1]


def _read_specforge(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    import torch

    data = load_tensor_file(path)
    if not isinstance(data, dict):
        raise BadFile(f"{path}: holds a {type(data).__name__}, SpecForge's files a dict of "
                      f"{', '.join(SF_KEYS)}")
    missing = [k for k in SF_KEYS if not isinstance(data.get(k), torch.Tensor)]
    if missing:
        raise BadFile(f"{path}: no tensor {', '.join(missing)} (SpecForge's EAGLE-3 files "
                      f"hold {', '.join(SF_KEYS)})")
    ids = data["input_ids"].reshape(-1).numpy()
    mask = data["loss_mask"].reshape(-1).numpy()
    aux, last = data["aux_hidden_state"], data["hidden_state"]
    aux = aux[0] if aux.ndim == 3 and aux.shape[0] == 1 else aux
    last = last[0] if last.ndim == 3 and last.shape[0] == 1 else last
    n = len(ids)
    if (len(mask) != n or aux.ndim != 2 or last.ndim != 2 or aux.shape[0] != n
            or last.shape[0] != n or aux.shape[1] % last.shape[1]):
        raise BadFile(f"{path}: shapes disagree: input_ids {list(data['input_ids'].shape)}, "
                      f"loss_mask {list(data['loss_mask'].shape)}, aux_hidden_state "
                      f"{list(data['aux_hidden_state'].shape)}, hidden_state "
                      f"{list(data['hidden_state'].shape)} (expected [T], [T], [1, T, n*H], "
                      "[1, T, H])")
    return ids, mask, aux.float().numpy(), last.float().numpy()


def _layers(cfg: ConvertConfig, tool: str, n_aux: int, sidecar: dict | None,
            num_layers: int | None) -> list[int]:
    given = parse_layer_ids(cfg.layers)
    if given is None and sidecar is not None:
        given = list(sidecar["layout"].get("layer_ids") or []) or None
    if given is None and num_layers is None:
        hint = (" (SpecForge numbers layer outputs: add 1 to each of its ids)"
                if tool == "specforge" else " (speculators' --target-layer-ids)")
        raise UserError(f"{cfg.src}: {NAMES[tool]}'s files do not record which layers they "
                        f"hold; give --layers in the boundary convention{hint}, or --target for "
                        "EAGLE-3's defaults (2, N//2, N-3)")
    layers = (resolve_layer_ids(given, num_layers) if num_layers is not None
              else check_layer_ids(given or []))
    if len(layers) != n_aux:
        raise UserError(f"--layers {','.join(map(str, layers))}: {len(layers)} ids, but the "
                        f"files hold {n_aux} auxiliary states per token")
    return layers


def import_hidden(cfg: ConvertConfig) -> ConvertResult:
    tool = str(detect(cfg.src))
    sidecar = _read_sidecar(cfg.src)
    if sidecar is not None and sidecar.get("format") != tool:
        raise UserError(f"{cfg.src / SIDECAR}: records a {sidecar.get('format')} export, but "
                        f"the files are {NAMES[tool]}'s")
    tokens = None
    missing: list[Path] = []
    if tool == "speculators":
        tokens = _token_data(cfg.src)
        items, missing = _speculators_items(cfg.src, len(tokens))
    else:
        items = _specforge_items(cfg.src)
    if not items:
        where = cfg.src / HS_DIR if tool == "speculators" else cfg.src
        raise UserError(f"{where}: no {NAMES[tool]} hidden-state files there")

    def read(item: _Item) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        if tokens is None:
            return _read_specforge(item.path)
        row = tokens[item.index]
        return _read_speculators(item.path, np.asarray(row["input_ids"]).astype(np.int64),
                                 np.asarray(row["loss_mask"]))

    first = _first_readable(items, read, cfg.skip_bad_lines)
    h, n_aux = first[3].shape[1], first[2].shape[1] // first[3].shape[1]
    layout, target_path = _import_layout(cfg, tool, sidecar, h, n_aux)
    known = {r["index"]: r for r in _sidecar_samples(sidecar)}
    result = _result("import", cfg.dst, 0)
    writer = HiddenWriter(
        cfg.dst, layout=layout, codec="raw", **cfg.write.writer_options(),
        config={"stage": "convert", "source": cfg.src.name, "from": tool},
        provenance={"source": str(cfg.src.resolve()), "target": target_path})
    _ui.warn_all(writer.warnings)
    with writer, _ui.Progress("convert", len(items), cfg.output, unit="samples") as progress:
        for item in items:
            try:
                ids, mask, aux, last = read(item)
                if aux.shape[1] != n_aux * h or last.shape[1] != h:
                    raise BadFile(f"{item.path}: states of width {aux.shape[1]} and "
                                  f"{last.shape[1]}, the first file's are {n_aux * h} and {h}")
                if not np.isin(mask, (0, 1)).all():
                    raise BadFile(f"{item.path}: loss_mask holds values other than 0 and 1")
                meta = known.get(item.index, {})
                _refuse_controls(cfg.src / SIDECAR, item.index, meta)
                default_id = f"{'hs' if tool == 'speculators' else 'data'}_{item.index}"
                sample = HiddenSample(
                    sample_id=meta.get("sample_id") or default_id, input_ids=ids,
                    loss_mask=mask.astype(np.uint8), aux=aux, last=last,
                    partition=meta.get("partition") or "default",
                    prompt_len=int(meta.get("prompt_len") or 0))
                added = writer.add(sample)
            except (BadFile, ValueError) as exc:
                if not cfg.skip_bad_lines:
                    raise UserError(f"{exc} (use --skip-bad-lines to skip such files; samples "
                                    "before it are committed)") from None
                result.bad_lines += 1
                progress.add(1, errors=1)
                continue
            result.written += int(added)
            result.skipped_existing += int(not added)
            progress.add(1, tokens=len(ids))
    if missing:
        _ui.warn(f"{len(missing):,} rows of the token data have no hidden-state file (first: "
                 f"{missing[0]}); speculators skips such rows too, and so did this import")
    if result.bad_lines:
        _ui.warn(f"{cfg.src}: skipped {result.bad_lines:,} unusable files")
    _ui.info(f"{cfg.dst}: {result.written:,} samples added, {result.skipped_existing:,} already "
             f"there, {writer.committed_samples:,} in the dataset (last state "
             f"{layout['last_state'].replace('_', '-')})", cfg.output)
    return result


def _token_data(src: Path) -> Any:
    datasets = _datasets()
    try:
        data = datasets.load_from_disk(str(src))
    except (OSError, ValueError, FileNotFoundError) as exc:
        raise UserError(f"{src}: cannot read speculators' token data there ({exc})") from None
    if not isinstance(data, datasets.Dataset):
        raise UserError(f"{src}: a dataset dictionary; give one split's directory")
    lacking = [c for c in ("input_ids", "loss_mask") if c not in data.column_names]
    if lacking:
        raise UserError(f"{src}: the token data lacks column {', '.join(lacking)} (speculators' "
                        "prepare_data.py writes input_ids and loss_mask)")
    return data.with_format("numpy", columns=["input_ids", "loss_mask"])


def _first_readable(items: list[_Item], read: Any, skip_bad: bool) -> Any:
    """The first file's states fix the hidden size and the number of aux states."""
    for item in items:
        try:
            return read(item)
        except BadFile as exc:
            if not skip_bad:
                raise UserError(f"{exc} (use --skip-bad-lines to skip such files)") from None
    raise UserError(f"{items[0].path.parent}: none of the files is usable")


def _refuse_controls(sidecar: Path, index: int, meta: dict) -> None:
    """An id or partition name holds no control character: shown on a terminal later, ESC
    and its kin would clear the screen or hide a line of the report there."""
    for key in ("sample_id", "partition"):
        found = _ui.control_in(meta[key]) if isinstance(meta.get(key), str) else None
        if found is not None:
            raise BadFile(f"{sidecar}: samples[{index}]: {key} holds a control character "
                          f"({found})")


def _sidecar_samples(sidecar: dict | None) -> list[dict]:
    if sidecar is None or not isinstance(sidecar.get("samples"), list):
        return []
    return [{"index": i, **r} for i, r in enumerate(sidecar["samples"]) if isinstance(r, dict)]


def _import_layout(cfg: ConvertConfig, tool: str, sidecar: dict | None, h: int, n_aux: int
                   ) -> tuple[dict, str | None]:
    """What the imported states mean. The last state is the files' own form: speculators'
    is pre-norm; SpecForge's is post-norm and stays so (train then applies only lm_head)."""
    old = dict(sidecar["layout"]) if sidecar else {}
    target: dict = old.get("target") or {}
    num_layers = old.get("num_layers")
    target_path = None
    if cfg.target is not None:
        target = TargetInfo.load(Path(cfg.target)).identity
        num_layers, target_path = target["num_layers"], str(Path(cfg.target).absolute())
        if target["hidden_size"] != h:
            raise UserError(f"--target {cfg.target}: hidden size {target['hidden_size']}, the "
                            f"files' states are {h} wide: another model's states")
    layers = _layers(cfg, tool, n_aux, sidecar, num_layers)
    layout = {
        "layer_ids": layers, "layer_convention": "boundary", "num_layers": num_layers,
        "hidden_size": h, "last_state": "pre_norm" if tool == "speculators" else "post_norm",
        "dtype": "bfloat16", "target": target, "tokenizer": old.get("tokenizer") or {},
        "imported_from": tool,
    }
    return layout, target_path


__all__ = ["SIDECAR", "TOOLS", "check_config", "detect", "run"]

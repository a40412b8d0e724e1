"""`eagle3kit convert` of speculators' or SpecForge's hidden-state files into a hidden-state
dataset (the formats: `hidden.py`), with the layers and target the files or their sidecar
record."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from eagle3kit import _text, _ui
from eagle3kit.checkpoints.tensors import BadFile, load_tensor_file
from eagle3kit.convert.config import HS_DIR, HS_FILE, NAMES, SF_FILE, ConvertConfig, detect
from eagle3kit.convert.hidden import (
    SF_KEYS,
    SIDECAR,
    hidden_result,
    import_datasets,
    read_sidecar,
)
from eagle3kit.convert.result import ConvertResult
from eagle3kit.errors import UserError
from eagle3kit.format import HiddenSample, HiddenWriter
from eagle3kit.target import TargetInfo, check_layer_ids, parse_layer_ids, resolve_layer_ids


@dataclass
class _Item:
    index: int
    path: Path


def _speculators_items(src: Path, rows: int) -> tuple[list[_Item], list[Path]]:
    found = {int(m.group(1)): p for p in (src / HS_DIR).iterdir() if (m := HS_FILE.match(p.name))}
    stray = sorted(i for i in found if i >= rows)
    if stray:
        raise UserError(
            f"{found[stray[0]]}: row {stray[0]} of the hidden states, but the token "
            f"data in {src} has only {rows} rows: another run's files?"
        )
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


def _read_speculators(
    path: Path, ids: np.ndarray, mask: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError) as exc:
        raise BadFile(f"{path}: not a readable safetensors file ({exc})") from None
    missing = [k for k in ("hidden_states", "token_ids") if k not in tensors]
    if missing:
        raise BadFile(
            f"{path}: no {', '.join(missing)} (speculators' files hold "
            "hidden_states [T, L, H] and token_ids [T])"
        )
    states, echoed = tensors["hidden_states"], tensors["token_ids"]
    if states.ndim != 3 or states.shape[1] < 2 or states.shape[0] != len(ids):
        raise BadFile(
            f"{path}: hidden_states has shape {list(states.shape)}, expected "
            f"[{len(ids)}, L, H] with L >= 2 (the aux layers, then the last)"
        )
    if not np.array_equal(echoed.numpy().reshape(-1), ids):
        raise BadFile(
            f"{path}: token_ids differ from row {path.stem[3:]}'s input_ids in the token data"
        )
    stacked = states.float().numpy()
    n = len(ids)
    return ids, mask, stacked[:, :-1].reshape(n, -1), stacked[:, -1]


def _read_specforge(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    import torch

    data = load_tensor_file(path)
    if not isinstance(data, dict):
        raise BadFile(
            f"{path}: holds a {type(data).__name__}, SpecForge's files a dict of "
            f"{', '.join(SF_KEYS)}"
        )
    missing = [k for k in SF_KEYS if not isinstance(data.get(k), torch.Tensor)]
    if missing:
        raise BadFile(
            f"{path}: no tensor {', '.join(missing)} (SpecForge's EAGLE-3 files "
            f"hold {', '.join(SF_KEYS)})"
        )
    ids = data["input_ids"].reshape(-1).numpy()
    mask = data["loss_mask"].reshape(-1).numpy()
    aux, last = data["aux_hidden_state"], data["hidden_state"]
    aux = aux[0] if aux.ndim == 3 and aux.shape[0] == 1 else aux
    last = last[0] if last.ndim == 3 and last.shape[0] == 1 else last
    n = len(ids)
    if (
        len(mask) != n
        or aux.ndim != 2
        or last.ndim != 2
        or aux.shape[0] != n
        or last.shape[0] != n
        or aux.shape[1] % last.shape[1]
    ):
        raise BadFile(
            f"{path}: shapes disagree: input_ids {list(data['input_ids'].shape)}, "
            f"loss_mask {list(data['loss_mask'].shape)}, aux_hidden_state "
            f"{list(data['aux_hidden_state'].shape)}, hidden_state "
            f"{list(data['hidden_state'].shape)} (expected [T], [T], [1, T, n*H], "
            "[1, T, H])"
        )
    return ids, mask, aux.float().numpy(), last.float().numpy()


def _layers(
    cfg: ConvertConfig, tool: str, n_aux: int, sidecar: dict | None, num_layers: int | None
) -> list[int]:
    given = parse_layer_ids(cfg.layers)
    if given is None and sidecar is not None:
        given = list(sidecar["layout"].get("layer_ids") or []) or None
    if given is None and num_layers is None:
        hint = (
            " (SpecForge numbers layer outputs: add 1 to each of its ids)"
            if tool == "specforge"
            else " (speculators' --target-layer-ids)"
        )
        raise UserError(
            f"{cfg.src}: {NAMES[tool]}'s files do not record which layers they "
            f"hold; give --layers in the boundary convention{hint}, or --target for "
            "EAGLE-3's defaults (2, N//2, N-3)"
        )
    layers = (
        resolve_layer_ids(given, num_layers)
        if num_layers is not None
        else check_layer_ids(given or [])
    )
    if len(layers) != n_aux:
        raise UserError(
            f"--layers {','.join(map(str, layers))}: {len(layers)} ids, but the "
            f"files hold {n_aux} auxiliary states per token"
        )
    return layers


def import_hidden(cfg: ConvertConfig) -> ConvertResult:
    tool = str(detect(cfg.src))
    sidecar = read_sidecar(cfg.src)
    if sidecar is not None and sidecar.get("format") != tool:
        raise UserError(
            f"{cfg.src / SIDECAR}: records a {sidecar.get('format')} export, but "
            f"the files are {NAMES[tool]}'s"
        )
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
        return _read_speculators(
            item.path, np.asarray(row["input_ids"]).astype(np.int64), np.asarray(row["loss_mask"])
        )

    first = _first_readable(items, read, cfg.skip_bad_lines)
    h, n_aux = first[3].shape[1], first[2].shape[1] // first[3].shape[1]
    layout, target_path = _import_layout(cfg, tool, sidecar, h, n_aux)
    known = {r["index"]: r for r in _sidecar_samples(sidecar)}
    result = hidden_result("import", cfg.dst, 0)
    writer = HiddenWriter(
        cfg.dst,
        layout=layout,
        codec="raw",
        **cfg.write.writer_options(),
        config={"stage": "convert", "source": cfg.src.name, "from": tool},
        provenance={"source": str(cfg.src.resolve()), "target": target_path},
    )
    _ui.warn_all(writer.warnings)
    with writer, _ui.Progress("convert", len(items), cfg.output, unit="samples") as progress:
        for item in items:
            try:
                ids, mask, aux, last = read(item)
                if aux.shape[1] != n_aux * h or last.shape[1] != h:
                    raise BadFile(
                        f"{item.path}: states of width {aux.shape[1]} and "
                        f"{last.shape[1]}, the first file's are {n_aux * h} and {h}"
                    )
                if not np.isin(mask, (0, 1)).all():
                    raise BadFile(f"{item.path}: loss_mask holds values other than 0 and 1")
                meta = known.get(item.index, {})
                _refuse_controls(cfg.src / SIDECAR, item.index, meta)
                default_id = f"{'hs' if tool == 'speculators' else 'data'}_{item.index}"
                sample = HiddenSample(
                    sample_id=meta.get("sample_id") or default_id,
                    input_ids=ids,
                    loss_mask=mask.astype(np.uint8),
                    aux=aux,
                    last=last,
                    partition=meta.get("partition") or "default",
                    prompt_len=int(meta.get("prompt_len") or 0),
                )
                added = writer.add(sample)
            except (BadFile, ValueError) as exc:
                if not cfg.skip_bad_lines:
                    raise UserError(
                        f"{exc} (use --skip-bad-lines to skip such files; samples "
                        "before it are committed)"
                    ) from None
                result.bad_lines += 1
                progress.add(1, errors=1)
                continue
            result.written += int(added)
            result.skipped_existing += int(not added)
            progress.add(1, tokens=len(ids))
    if missing:
        _ui.warn(
            f"{len(missing):,} rows of the token data have no hidden-state file (first: "
            f"{missing[0]}); speculators skips such rows too, and so did this import"
        )
    if result.bad_lines:
        _ui.warn(f"{cfg.src}: skipped {result.bad_lines:,} unusable files")
    _ui.info(
        f"{cfg.dst}: {result.written:,} samples added, {result.skipped_existing:,} already "
        f"there, {writer.committed_samples:,} in the dataset (last state "
        f"{layout['last_state'].replace('_', '-')})",
        cfg.output,
    )
    return result


def _token_data(src: Path) -> Any:
    datasets = import_datasets()
    try:
        data = datasets.load_from_disk(str(src))
    except (OSError, ValueError, FileNotFoundError) as exc:
        raise UserError(f"{src}: cannot read speculators' token data there ({exc})") from None
    if not isinstance(data, datasets.Dataset):
        raise UserError(f"{src}: a dataset dictionary; give one split's directory")
    lacking = [c for c in ("input_ids", "loss_mask") if c not in data.column_names]
    if lacking:
        raise UserError(
            f"{src}: the token data lacks column {', '.join(lacking)} (speculators' "
            "prepare_data.py writes input_ids and loss_mask)"
        )
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
        found = _text.control_in(meta[key]) if isinstance(meta.get(key), str) else None
        if found is not None:
            raise BadFile(f"{sidecar}: samples[{index}]: {key} holds a control character ({found})")


def _sidecar_samples(sidecar: dict | None) -> list[dict]:
    if sidecar is None or not isinstance(sidecar.get("samples"), list):
        return []
    return [{"index": i, **r} for i, r in enumerate(sidecar["samples"]) if isinstance(r, dict)]


def _import_layout(
    cfg: ConvertConfig, tool: str, sidecar: dict | None, h: int, n_aux: int
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
            raise UserError(
                f"--target {cfg.target}: hidden size {target['hidden_size']}, the "
                f"files' states are {h} wide: another model's states"
            )
    layers = _layers(cfg, tool, n_aux, sidecar, num_layers)
    layout = {
        "layer_ids": layers,
        "layer_convention": "boundary",
        "num_layers": num_layers,
        "hidden_size": h,
        "last_state": "pre_norm" if tool == "speculators" else "post_norm",
        "dtype": "bfloat16",
        "target": target,
        "tokenizer": old.get("tokenizer") or {},
        "imported_from": tool,
    }
    return layout, target_path

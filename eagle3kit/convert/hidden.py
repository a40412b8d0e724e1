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

The shared pieces are here (the files' names, the sidecar, the target check); the
conversions are `hidden_export.py` and `hidden_import.py`, and which one a run is, if any,
`config.py` decides (`detect`, `check_hidden`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson

from eagle3kit.convert.result import ConvertResult
from eagle3kit.errors import UserError
from eagle3kit.format import HiddenDataset
from eagle3kit.target import TargetInfo, identity_mismatch

SIDECAR = "eagle3kit-export.json"
"""What an export adds beside the tool's files (ids, partitions, layers, target), so importing
it back restores them; the tools ignore it."""
SF_GROUP = 2000
"""prepare_hidden_states.py's default file_group_size: files per rows_<g>-<g+2000> folder."""
SF_KEYS = ("input_ids", "loss_mask", "aux_hidden_state", "hidden_state")


def hidden_result(
    direction: str, dst: Path, written: int, skipped: int = 0, bad: int = 0
) -> ConvertResult:
    return ConvertResult(direction, written, skipped_existing=skipped, bad_lines=bad, dst=str(dst))


def bf16(x: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(torch.bfloat16)


def check_target(ds: HiddenDataset, target: Path) -> dict:
    """--target is the model the states came from, as far as the dataset recorded it."""
    ours = TargetInfo.load(target).identity
    mismatch = identity_mismatch(ds.target, ours)
    if mismatch:
        key, theirs, actual = mismatch
        raise UserError(
            f"--target {target}: not the model {ds.path} was extracted from "
            f"({key} {actual!r}, the dataset records {theirs!r})"
        )
    return ours


def read_sidecar(where: Path) -> dict | None:
    path = where / SIDECAR
    if not path.is_file():
        return None
    try:
        body = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise UserError(f"{path}: unreadable ({exc}); remove it to import without it") from None
    if not isinstance(body, dict) or not isinstance(body.get("layout"), dict):
        raise UserError(f"{path}: not an eagle3kit export record; remove it to import without it")
    return body


def import_datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise UserError(
            "--to speculators and speculators imports need the `datasets` package "
            "(pip install 'eagle3kit[hf]'): speculators keeps its token data as a "
            "Hugging Face dataset"
        ) from None
    datasets.disable_progress_bars()
    return datasets

"""What `bench accept` decodes with: the transformers target, the drafter in any layout
`eagle3kit info` reads, the check that the two fit, and what training predicted for the
drafter.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from eagle3kit.errors import UserError


def load_target(path: Path, device: Any, dtype: Any, trust_remote_code: bool = False) -> Any:
    from eagle3kit import _hf

    model = _hf.load_causal_lm(path, trust_remote_code, dtype=dtype)
    return model.to(device).eval()


def load_drafter(path: Path, embedding: Any, target_config: Any) -> tuple[Any, list[str]]:
    """The drafter and what is doubtful about its checkpoint: any layout `eagle3kit info`
    reads (checkpoints.load), else eagle3kit's own (checkpoints.native)."""
    loader: Callable[..., tuple[Any, Any]] | None
    try:
        from eagle3kit.checkpoints.load import load_any
    except ImportError:
        loader = None
    else:
        loader = load_any
    try:
        if loader is None:
            from eagle3kit.checkpoints.native import load_drafter as load

            return load(path, embedding=embedding), []
        drafter, info = loader(path, embedding, target_config=target_config)
        return drafter, [*info.problems, *info.warnings]
    except UserError as exc:
        raise UserError(f"--drafter {path}: {exc}") from None
    except (OSError, KeyError, ValueError, TypeError, RuntimeError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"--drafter {path}: cannot load an EAGLE-3 drafter ({reason})") from None


def check_pair(drafter: Any, model: Any, drafter_path: Path, target_path: Path) -> None:
    """The drafter must read this target's states and vocabulary; say which flag is off."""
    config, target = drafter.config, model.config
    n = target.num_hidden_layers
    where = f"--drafter {drafter_path} and --target {target_path}"
    if config.hidden_size != target.hidden_size:
        raise UserError(
            f"{where}: the drafter is {config.hidden_size} wide, the target "
            f"{target.hidden_size}: it was trained for another target"
        )
    bad = [i for i in config.aux_layer_ids if not 0 <= i <= n]
    if bad:
        raise UserError(
            f"{where}: the drafter reads layers {config.aux_layer_ids} "
            f"(boundary ids) but the target has {n} layers (ids 0..{n})"
        )
    if config.aux_width != len(config.aux_layer_ids) * target.hidden_size:
        raise UserError(
            f"{where}: the drafter fuses {config.aux_width} features, the target "
            f"gives {len(config.aux_layer_ids)} x {target.hidden_size}"
        )
    if config.vocab_size != target.vocab_size:
        raise UserError(
            f"{where}: the drafter was built for a vocabulary of "
            f"{config.vocab_size}, the target has {target.vocab_size}"
        )


def training_prediction(drafter_dir: Path) -> dict[str, Any] | None:
    """What training predicted: the eagle3kit.eval block train writes into config.json, or
    the copy export keeps beside an exported checkpoint."""
    from eagle3kit.checkpoints.provenance import training_prediction as recorded

    return recorded(drafter_dir)

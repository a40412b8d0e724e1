"""`train --init-from`: the drafter a run starts from, loaded from any layout checkpoints/
reads and checked against the target, the training states' layers and the asked layout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eagle3kit.errors import UserError
from eagle3kit.model import Eagle3Drafter, describe_variant, vocab_problems


def load_init(path: Path, target_cfg: Any) -> Eagle3Drafter:
    """--init-from: any EAGLE-3 layout checkpoints/ reads, else eagle3kit's own; without
    the embedding, which comes from the target once the drafter is known to fit it."""
    try:
        from eagle3kit.checkpoints.load import load_any

        def load(p: Path) -> Eagle3Drafter:
            model, _info = load_any(p, target_config=target_cfg)
            return model
    except ImportError:
        from eagle3kit.checkpoints.native import load_drafter as load  # type: ignore[assignment]
    if not (path / "config.json").is_file():
        raise UserError(f"--init-from {path}: no config.json there (a drafter directory?)")
    try:
        return load(path)
    except (UserError, OSError, KeyError, ValueError, TypeError, RuntimeError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        reason = reason.removeprefix(f"{path}: ")
        raise UserError(f"--init-from {path}: cannot use it ({reason})") from None


def check_init(model: Eagle3Drafter, target_cfg: Any, layers: list[int], path: Path) -> None:
    c = model.config
    where = f"--init-from {path}"
    if c.vocab_size != target_cfg.vocab_size:
        raise UserError(
            f"{where}: made for a vocabulary of {c.vocab_size}, --target has "
            f"{target_cfg.vocab_size}"
        )
    if c.hidden_size != target_cfg.hidden_size or c.aux_width != 3 * target_cfg.hidden_size:
        raise UserError(
            f"{where}: width {c.hidden_size} (fc input {c.aux_width}), --target "
            f"has hidden size {target_cfg.hidden_size}"
        )
    if list(c.aux_layer_ids) != list(layers):
        raise UserError(
            f"{where}: reads layers {c.aux_layer_ids}, the training states are from layers {layers}"
        )
    problems = vocab_problems(
        model.d2t.numpy(), model.t2d.numpy(), c.vocab_size, c.draft_vocab_size
    )
    if problems:
        raise UserError(f"{where}: its draft vocabulary is unusable: {problems[0]}")


def check_init_variant(model: Eagle3Drafter, cfg: Any) -> None:
    """--init-from keeps the checkpoint's layout: --variant or a field flag that asks for
    another one is refused by name."""
    if not cfg.variant_given:
        return
    wanted = cfg.drafter_variant()
    has = {name: getattr(model.config, name) for name in wanted}
    differ = [
        f"{name} {has[name]} (asked {wanted[name]})" for name in wanted if has[name] != wanted[name]
    ]
    if differ:
        raise UserError(
            f"--init-from {cfg.init_from}: a {describe_variant(has)} drafter, "
            f"and the weights keep their layout: {', '.join(differ)}; leave "
            f"--variant and the layout flags out"
        )

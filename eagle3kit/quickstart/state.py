"""The record of a quickstart directory (DIR/quickstart.json): which stages finished, with the
settings the directory was made with, so a rerun skips them and a foreign directory is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from eagle3kit._durable import write_text_atomic
from eagle3kit.checkpoints.rundir import RunDir
from eagle3kit.errors import UserError
from eagle3kit.quickstart.config import QuickstartConfig
from eagle3kit.quickstart.layout import STATE, Layout
from eagle3kit.quickstart.stages import STAGES

STATE_VERSION = 1


def load_state(cfg: QuickstartConfig) -> dict[str, Any]:
    """The record of an earlier run in `out`, or a fresh one; refuses a foreign directory."""
    path = cfg.out / STATE
    fresh = {"version": STATE_VERSION, "settings": cfg.artifact_options(), "stages": {}}
    if cfg.out.exists() and not cfg.out.is_dir():
        raise UserError(f"{cfg.out}: not a directory")
    if not path.is_file():
        if cfg.out.is_dir() and any(cfg.out.iterdir()):
            raise UserError(
                f"{cfg.out}: not empty and not a quickstart directory; name a new or empty DIR"
            )
        return fresh
    if cfg.write.mode == "overwrite":
        _clear(cfg.out)
        return fresh
    try:
        state = json.loads(path.read_text())
        # A record from before --target-arch existed was made with the Llama target.
        stages, settings = dict(state["stages"]), {"target_arch": "llama", **state["settings"]}
    except (OSError, ValueError, KeyError, TypeError):
        raise UserError(
            f"{path}: unreadable quickstart record; start afresh with --overwrite"
        ) from None
    if settings != cfg.artifact_options():
        changed = [
            f"--{k.replace('_', '-')} {settings.get(k)} -> {v}"
            for k, v in cfg.artifact_options().items()
            if settings.get(k) != v
        ]
        raise UserError(
            f"{cfg.out} was started with other settings ({', '.join(changed)}); "
            "rerun with the earlier ones, or start afresh with --overwrite"
        )
    return {
        "version": STATE_VERSION,
        "settings": settings,
        "stages": still_there(stages, Layout(cfg.out)),
    }


def still_there(stages: dict[str, dict], lay: Layout) -> dict[str, dict]:
    """The recorded stages up to the first whose output has since been deleted: that one and
    every later one run again."""
    outputs = {
        "target": lay.target / "tiny_training.json",
        "prompts": lay.bench_prompts,
        "gen": lay.tokens,
        "validate": lay.root / "validate.json",
        "extract": lay.hidden,
        "train": RunDir(lay.run).drafter,
        "export": lay.export / "vllm",
    }
    kept = {}
    for name, _, _ in STAGES:
        if name not in stages or (name in outputs and not outputs[name].exists()):
            break
        kept[name] = stages[name]
    return kept


def _clear(root: Path) -> None:
    for child in root.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def check_code(cfg: QuickstartConfig, lay: Layout, state: dict[str, Any]) -> None:
    """Refuse, before any stage loads anything with trust on, a Kimi quickstart directory
    that holds code make_kimi_target did not write (tiny_kimi.foreign_code): every stage trusts
    DIR's code only because quickstart wrote it. An unfinished target/ is written afresh
    before anything loads from it, so only what the record says is done is looked into."""
    from eagle3kit import tiny_kimi

    if not cfg.kimi or cfg.trust_remote_code or not cfg.out.is_dir():
        return
    rebuilt = None if "target" in state["stages"] else lay.target
    problem = tiny_kimi.foreign_code(lay.root, rebuilt)
    if problem:
        raise UserError(
            f"{problem}; quickstart runs only the code it wrote itself: start "
            "afresh with --overwrite, or pass --trust-remote-code to run it"
        )


def save_state(root: Path, state: dict[str, Any]) -> None:
    """Atomically: a kill leaves the old record or the new one, never half of one."""
    root.mkdir(parents=True, exist_ok=True)
    write_text_atomic(root / STATE, json.dumps(state, indent=2))

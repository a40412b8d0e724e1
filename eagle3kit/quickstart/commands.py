"""The command line that runs each quickstart stage by hand, as quickstart ran it."""

from __future__ import annotations

import json
import shlex
from typing import Any

from eagle3kit.quickstart.config import KIMI_LAYERS, K, QuickstartConfig
from eagle3kit.quickstart.layout import Layout
from eagle3kit.quickstart.stages import train_options


def _flag(name: str, value: Any) -> str:
    return (
        f"--{name.replace('_', '-')} {value:g}"
        if isinstance(value, float)
        else f"--{name.replace('_', '-')} {value}"
    )


def commands(cfg: QuickstartConfig, lay: Layout) -> dict[str, str]:
    """The command line that runs each stage by hand, as quickstart ran it."""
    q = shlex.quote
    target, tokens, hidden = q(str(lay.target)), q(str(lay.tokens)), q(str(lay.hidden))
    if cfg.kimi:
        make = (
            f"from eagle3kit import tiny, tiny_kimi; "
            f"tiny.train_target(tiny_kimi.make_kimi_target({json.dumps(str(lay.target))}), "
            f"**{{**tiny_kimi.KIMI_TRAINING, 'steps': {cfg.target_steps}}}, "
            "trust_remote_code=True)"
        )
    else:
        make = (
            f"from eagle3kit import tiny; "
            f"tiny.train_target(tiny.make_target({json.dumps(str(lay.target))}), "
            f"steps={cfg.target_steps})"
        )
    train = " ".join(
        _flag(k, v) if v is not True else f"--{k.replace('_', '-')}"
        for k, v in train_options(cfg).items()
    )
    trust = " --trust-remote-code" if cfg.trust else ""
    layers = f" --layers {','.join(map(str, KIMI_LAYERS))}" if cfg.kimi else ""
    return {
        "target": f"python -c {q(make)}",
        "gen": (
            f"eagle3kit gen {q(str(lay.train_prompts))} {tokens} --engine hf "
            f"--target {target} --temperature 0 --max-tokens {cfg.max_tokens}{trust}"
        ),
        "validate": f"eagle3kit validate {tokens}{trust}",
        "extract": (
            f"eagle3kit extract {tokens} {hidden} --target {target}{layers} --device cpu{trust}"
        ),
        "train": f"eagle3kit train {hidden} {q(str(lay.run))} --target {target} {train}",
        "export": (f"eagle3kit export {q(str(lay.run))} {q(str(lay.export))} --format both{trust}"),
        "bench": (
            f"eagle3kit bench accept {q(str(lay.bench_prompts))} --target {target} "
            f"--drafter {q(str(lay.export / 'vllm'))} --k {K} --temperature 0 "
            f"--device cpu{trust}"
        ),
    }

"""`eagle3kit quickstart`'s run: continue the record, run each stage not done, report."""

from __future__ import annotations

import time
from typing import Any

from eagle3kit import _ui
from eagle3kit.quickstart.commands import commands
from eagle3kit.quickstart.config import QuickstartConfig
from eagle3kit.quickstart.layout import Layout
from eagle3kit.quickstart.result import QuickstartResult, show
from eagle3kit.quickstart.stages import STAGES, prompt_chats, stage_output
from eagle3kit.quickstart.state import check_code, load_state, save_state


def _run_stages(cfg: QuickstartConfig, lay: Layout, state: dict[str, Any]) -> list[str]:
    out = stage_output(cfg)
    skipped = []
    for number, (name, what, stage) in enumerate(STAGES, 1):
        head = f"[{number}/{len(STAGES)}] {name}"
        if name in state["stages"]:
            _ui.info(f"{head}: done earlier, skipped", cfg.output)
            skipped.append(name)
            continue
        _ui.info(f"{head}: {what}", cfg.output)
        start = time.perf_counter()
        record = stage(cfg, lay, out)
        record["seconds"] = round(time.perf_counter() - start, 1)
        state["stages"][name] = record
        save_state(lay.root, state)
    return skipped


def _result(
    cfg: QuickstartConfig, lay: Layout, state: dict[str, Any], skipped: list[str], elapsed: float
) -> QuickstartResult:
    s = state["stages"]
    v, t, b = s["validate"], s["train"], s["bench"]
    seconds = {name: s[name]["seconds"] for name, _, _ in STAGES}
    seconds["this run"] = round(elapsed, 1)
    return QuickstartResult(
        predicted_acceptance_length=t["predicted_acceptance_length"],
        measured_acceptance_length=b["measured_acceptance_length"],
        samples=v["samples"],
        truncation_rate=v["truncation_rate"],
        tokens=v["tokens"],
        completion_tokens=v["completion_tokens"],
        final_loss=t["final_loss"],
        validate_passed=v["passed"],
        validate_summary=v["summary"],
        lossless=b["lossless"],
        skipped=skipped,
        continued=_continued(s),
        seconds=seconds,
        paths=lay.paths(),
        commands=commands(cfg, lay),
    )


def _continued(stages: dict[str, dict]) -> dict[str, int]:
    return {name: r["continued_from"] for name, r in stages.items() if r.get("continued_from")}


def run(cfg: QuickstartConfig) -> QuickstartResult:
    start = time.perf_counter()
    state = load_state(cfg)
    lay = Layout(cfg.out)
    check_code(cfg, lay, state)
    prompt_chats(cfg)  # too many asked for: say so before minutes of work, not after
    import torch

    save_state(lay.root, state)
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        skipped = _run_stages(cfg, lay, state)
    finally:
        torch.set_num_threads(threads)
    result = _result(cfg, lay, state, skipped, time.perf_counter() - start)
    show(result, cfg.output)
    if cfg.output.json:
        _ui.print_json(result.to_dict())
    return result

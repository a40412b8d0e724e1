"""The quickstart's stages, in order: each takes the config, the layout and the output options
its stage should use, runs the stage through its public `run()`, and returns what the summary
needs from it (kept in the record, so a skipped stage still reports)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from eagle3kit import _ui
from eagle3kit._durable import write_text_atomic
from eagle3kit._options import OutputOptions
from eagle3kit._signals import interrupt
from eagle3kit.errors import UserError
from eagle3kit.quickstart.config import KIMI_LAYERS, K, QuickstartConfig
from eagle3kit.quickstart.layout import Layout


def stage_output(cfg: QuickstartConfig) -> OutputOptions:
    # JSON is the quickstart's to print: the stages speak to the person on stderr only.
    o = cfg.output
    return OutputOptions(quiet=o.quiet, no_progress=o.no_progress, log_every=o.log_every)


def stage_target(cfg: QuickstartConfig, lay: Layout, out: OutputOptions) -> dict:
    from eagle3kit import tiny, tiny_kimi

    # Unfinished (no training log, written last): a minute or two to redo, so start over.
    if lay.target.exists():
        shutil.rmtree(lay.target)
    _ui.info(
        "target: a tokenizer from the standard library's docstrings, then "
        f"{cfg.target_steps} training steps (the longest stage: a minute or two)",
        out,
    )
    training: dict[str, Any] = dict(tiny_kimi.KIMI_TRAINING) if cfg.kimi else {}
    training.update(steps=cfg.target_steps, threads=cfg.threads, trust_remote_code=cfg.trust)
    (tiny_kimi.make_kimi_target if cfg.kimi else tiny.make_target)(lay.target)
    # The same live display (or status lines) as the later stages: this one must not look hung.
    with _ui.Progress("target", cfg.target_steps, out, unit="steps") as progress:

        def step(loss: float) -> None:
            progress.add(1)
            progress.set(loss=loss)

        tiny.train_target(lay.target, on_step=step, **training)
    losses = json.loads((lay.target / "tiny_training.json").read_text())["losses"]
    shape = (
        "Kimi-K2's shape (MLA, 8 routed + 1 shared experts, YaRN), 4 layers, hidden 256"
        if cfg.kimi
        else "8 layers, hidden 64, heads of 32"
    )
    _ui.info(
        f"target: {shape}, trained {cfg.target_steps} steps on "
        f"stdlib docstrings (loss {losses[0]:.2f} -> {losses[-1]:.2f})",
        out,
    )
    return {"target_loss": losses[-1]}


def prompt_chats(cfg: QuickstartConfig) -> list[list[dict[str, str]]]:
    from eagle3kit import tiny

    try:
        return tiny.prompts(cfg.prompts + cfg.bench_prompts)
    except ValueError as exc:
        raise UserError(
            f"--prompts {cfg.prompts} + --bench-prompts {cfg.bench_prompts}: {exc}"
        ) from None


def stage_prompts(cfg: QuickstartConfig, lay: Layout, out: OutputOptions) -> dict:
    chats = prompt_chats(cfg)
    for path, part in (
        (lay.train_prompts, chats[: cfg.prompts]),
        (lay.bench_prompts, chats[cfg.prompts :]),
    ):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, "".join(json.dumps({"messages": m}) + "\n" for m in part))
    _ui.info(
        f"prompts: {cfg.prompts} for gen, {cfg.bench_prompts} held out for bench "
        "(docstrings the target was not trained on)",
        out,
    )
    return {}


def stage_gen(cfg: QuickstartConfig, lay: Layout, out: OutputOptions) -> dict:
    from eagle3kit import gen

    result = gen.run(
        gen.GenConfig(
            [lay.train_prompts],
            lay.tokens,
            engine="hf",
            target=lay.target,
            temperature=0.0,
            max_tokens=cfg.max_tokens,
            output=out,
            write=replace(cfg.write, mode="auto"),
            trust_remote_code=cfg.trust,
        )
    )
    if result.stopped:
        raise interrupt(result.exit_code)
    return {"samples": result.total, "continued_from": result.previously_done}


def stage_validate(cfg: QuickstartConfig, lay: Layout, out: OutputOptions) -> dict:
    from eagle3kit import validate

    report = validate.run(
        validate.ValidateConfig(lay.tokens, output=out, trust_remote_code=cfg.trust)
    )
    (lay.root / "validate.json").write_text(json.dumps(report.to_dict(), indent=2, default=str))
    if not report.passed:  # the quickstart goes on; the summary says what failed
        _ui.warn(f"validate: {report.summary()}; going on, as a real run should not")
    parts = report.partitions.values()
    return {
        "passed": report.passed,
        "summary": report.summary(),
        "samples": report.samples,
        "tokens": report.tokens,
        "completion_tokens": sum(p["loss_tokens"] for p in parts),
        "truncation_rate": report.check("truncation").rate or 0.0,
    }


def stage_extract(cfg: QuickstartConfig, lay: Layout, out: OutputOptions) -> dict:
    from eagle3kit import extract

    # Returns only when every sample is done (an interruption raises).
    result = extract.run(
        extract.ExtractConfig(
            lay.tokens,
            lay.hidden,
            target=lay.target,
            device="cpu",
            output=out,
            trust_remote_code=cfg.trust,
            layers=list(KIMI_LAYERS) if cfg.kimi else None,
        )
    )
    return {"layers": result.layer_ids}


def train_options(cfg: QuickstartConfig) -> dict[str, Any]:
    """The drafter's training settings (and the flags the by-hand command shows)."""
    return {
        "max_steps": cfg.train_steps,
        "lr": 3e-3,
        "warmup": 0.1,
        "batch_tokens": 2048,
        "draft_vocab": 512,
        "ttt_steps": K,
        "eval_split": max(2, cfg.prompts // 12),
        "eval_every": 0,
        "checkpoint_every": 20,
        "device": "cpu",
        **({"trust_remote_code": True} if cfg.trust else {}),
    }


def stage_train(cfg: QuickstartConfig, lay: Layout, out: OutputOptions) -> dict:
    from eagle3kit import train

    data = [train.DataSpec.parse(lay.hidden)]
    result = train.run(
        train.TrainConfig(data, lay.run, lay.target, output=out, **train_options(cfg))
    )
    if result.steps < result.total_steps:
        raise interrupt(result.exit_code)
    predicted = (result.eval or {}).get("predicted_acceptance_length")
    return {
        "final_loss": result.loss,
        "predicted_acceptance_length": predicted,
        "continued_from": result.resumed_from or 0,
    }


def stage_export(cfg: QuickstartConfig, lay: Layout, out: OutputOptions) -> dict:
    from eagle3kit import export

    # Seconds to redo; overwriting also replaces what a killed export left half-written.
    # The target named: not the path a (copied) run.json records, which check_code never saw.
    export.run(
        export.ExportConfig(
            lay.run,
            lay.export,
            target=lay.target,
            format="both",
            overwrite=True,
            output=out,
            trust_remote_code=cfg.trust,
        )
    )
    return {}


def stage_bench(cfg: QuickstartConfig, lay: Layout, out: OutputOptions) -> dict:
    from eagle3kit.bench import accept

    report = accept.run(
        accept.AcceptConfig(
            lay.target,
            lay.export / "vllm",
            [lay.bench_prompts],
            k=K,
            temperature=0.0,
            max_new_tokens=128,
            device="cpu",
            output=out,
            trust_remote_code=cfg.trust,
        )
    )
    return {"measured_acceptance_length": report.acceptance_length, "lossless": report.lossless}


STAGES: list[tuple[str, str, Callable[[QuickstartConfig, Layout, OutputOptions], dict]]] = [
    ("target", "a tiny reasoning target, trained on stdlib docstrings", stage_target),
    ("prompts", "prompt files", stage_prompts),
    ("gen", "the target answers the prompts (in-process engine, temperature 0)", stage_gen),
    ("validate", "the gate before training", stage_validate),
    ("extract", "the target's hidden states", stage_extract),
    ("train", "an EAGLE-3 drafter, offline", stage_train),
    ("export", "vLLM and SGLang checkpoints", stage_export),
    ("bench", f"speculative decoding on held-out prompts, k={K}, temperature 0", stage_bench),
]

"""`eagle3kit quickstart`: the whole pipeline on a tiny reasoning target, on CPU, offline.

It makes a tokenizer and an 8-layer target (eagle3kit.tiny), trains the target for a minute or two
on the standard library's docstrings, then runs every stage through its public `run()`:
gen (in-process transformers engine), validate, extract, train, export (vLLM and SGLang
layouts) and bench accept on prompts neither the target nor the drafter saw. It ends with
the predicted and the measured acceptance length, where everything is, and the command line
that runs each stage by hand.

Rerunning continues: DIR/quickstart.json records each finished stage (and the settings the
directory was made with), finished stages are skipped, and an unfinished one is run again in
its own resume mode, so a kill loses at most the uncommitted part of one stage.
"""

from __future__ import annotations

import json
import shlex
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from eagle3kit import _ui
from eagle3kit._durable import write_text_atomic
from eagle3kit._options import OutputOptions, WriteOptions, arg, embed, opt
from eagle3kit._signals import interrupt
from eagle3kit.checkpoints.rundir import RunDir
from eagle3kit.errors import UserError

STATE = "quickstart.json"
ARCHS = ("llama", "kimi")
KIMI_LAYERS = [1, 2, 3]
"""Aux layer ids of the 4-layer Kimi target (the default 2, N//2, N-3 needs 8 layers); all
below its depth, as vLLM captures only the states entering a layer."""
STATE_VERSION = 1
K = 3
"""Draft chain length of the predicted and the measured acceptance length."""


@dataclass
class QuickstartConfig:
    out: Path = field(default=Path("eagle3kit-quickstart"), metadata=arg(metavar="[DIR]"))
    """Where everything goes (continued when it holds a quickstart)."""
    prompts: int = 96
    """Held-out docstring prompts gen answers: the drafter's training data."""
    bench_prompts: int = 24
    """Further held-out prompts bench accept measures on."""
    target_steps: int = 300
    """Training (optimizer) steps of the tiny target."""
    target_arch: str = field(default="llama", metadata=opt(metavar="ARCH"))
    """The tiny target's architecture: llama (8 layers, hidden 64), or kimi: Kimi-K2's
    (DeepSeek-V3's) shape at 4 layers, hidden 256: Multi-head Latent Attention, routed and
    shared experts, YaRN, Kimi's chat markers and a tokenizer loaded through its own code,
    which every stage runs as if given --trust-remote-code (the quickstart wrote that code,
    and checks, byte for byte, that DIR holds no other before any stage runs)."""
    trust_remote_code: bool = field(default=False, metadata=opt(cli_only="code"))
    """Run code DIR holds that quickstart did not write (a Kimi quickstart directory copied
    from elsewhere, or edited): without it, such a directory is refused, naming the file."""
    train_steps: int = 60
    """Training (optimizer) steps of the drafter."""
    max_tokens: int = 256
    """Longest completion gen asks for."""
    threads: int = 1
    """torch threads: matrices this small gain little from more, and lose a lot on a busy
    machine where threads spin waiting for each other."""
    write: WriteOptions = field(
        default_factory=lambda: WriteOptions(commit_every=16, commit_interval=10.0),
        metadata=embed("overwrite"),
    )
    """--overwrite: start afresh, removing what an earlier quickstart left in `out`; the
    commit cadence gen uses (small: the quickstart's datasets are small)."""
    output: OutputOptions = field(default_factory=OutputOptions)

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        for flag, value, least in (
            ("--prompts", self.prompts, 4),
            ("--bench-prompts", self.bench_prompts, 1),
            ("--target-steps", self.target_steps, 1),
            ("--train-steps", self.train_steps, 1),
            ("--max-tokens", self.max_tokens, 16),
            ("--threads", self.threads, 1),
        ):
            if value < least:
                raise UserError(f"{flag} must be at least {least} (got {value})")
        if self.target_arch not in ARCHS:
            raise UserError(f"--target-arch {self.target_arch}: choose {' or '.join(ARCHS)}")

    @property
    def kimi(self) -> bool:
        return self.target_arch == "kimi"

    @property
    def trust(self) -> bool:
        """Only the Kimi target ships code of its own (its tokenizer), which quickstart wrote
        (`check_code` holds that), or the person allowed any code with the flag."""
        return self.kimi or self.trust_remote_code

    def artifact_options(self) -> dict[str, int | str]:
        """What decides the artifacts: a rerun with others would mix two quickstarts."""
        return {
            "prompts": self.prompts,
            "bench_prompts": self.bench_prompts,
            "target_steps": self.target_steps,
            "train_steps": self.train_steps,
            "max_tokens": self.max_tokens,
            "target_arch": self.target_arch,
        }


@dataclass(frozen=True)
class Layout:
    """Where each stage writes, under the quickstart directory."""

    root: Path

    @property
    def target(self) -> Path:
        return self.root / "target"

    @property
    def train_prompts(self) -> Path:
        return self.root / "prompts" / "docstrings.jsonl"

    @property
    def bench_prompts(self) -> Path:
        return self.root / "prompts" / "heldout.jsonl"

    @property
    def tokens(self) -> Path:
        return self.root / "tokens"

    @property
    def hidden(self) -> Path:
        return self.root / "hidden"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def export(self) -> Path:
        return self.root / "export"

    def paths(self) -> dict[str, str]:
        return {
            "dir": str(self.root),
            "target": str(self.target),
            "prompts": str(self.train_prompts),
            "bench_prompts": str(self.bench_prompts),
            "tokens": str(self.tokens),
            "validate_report": str(self.root / "validate.json"),
            "hidden": str(self.hidden),
            "run": str(self.run),
            "drafter": str(RunDir(self.run).drafter),
            "vllm": str(self.export / "vllm"),
            "sglang": str(self.export / "sglang"),
            "state": str(self.root / STATE),
        }


@dataclass
class QuickstartResult:
    predicted_acceptance_length: float | None
    """Training's held-out forecast, chain k=3 at temperature 0."""
    measured_acceptance_length: float | None
    """bench accept's measurement with the exported vLLM checkpoint, k=3, temperature 0."""
    samples: int
    truncation_rate: float
    tokens: int
    """Tokens in the token dataset, prompts and completions."""
    completion_tokens: int
    final_loss: float | None
    validate_passed: bool
    validate_summary: str
    lossless: bool | None
    skipped: list[str]
    """Stages an earlier run had finished."""
    continued: dict[str, int]
    """Stages that continued what a killed run committed: samples (gen) or steps (train)."""
    seconds: dict[str, float]
    """Wall time of each stage (as first run) and in total for this invocation."""
    paths: dict[str, str]
    commands: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- state ----------------------------------------------------------------------------------


def _load_state(cfg: QuickstartConfig) -> dict[str, Any]:
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
        "stages": _still_there(stages, Layout(cfg.out)),
    }


def _still_there(stages: dict[str, dict], lay: Layout) -> dict[str, dict]:
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


def _save_state(root: Path, state: dict[str, Any]) -> None:
    """Atomically: a kill leaves the old record or the new one, never half of one."""
    root.mkdir(parents=True, exist_ok=True)
    write_text_atomic(root / STATE, json.dumps(state, indent=2))


# -- stages ---------------------------------------------------------------------------------
# Each takes the config, the layout and the output options its stage should use, runs the
# stage, and returns what the summary needs from it (kept in the record, so a skipped stage
# still reports).


def _stage_output(cfg: QuickstartConfig) -> OutputOptions:
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


def _prompts(cfg: QuickstartConfig) -> list[list[dict[str, str]]]:
    from eagle3kit import tiny

    try:
        return tiny.prompts(cfg.prompts + cfg.bench_prompts)
    except ValueError as exc:
        raise UserError(
            f"--prompts {cfg.prompts} + --bench-prompts {cfg.bench_prompts}: {exc}"
        ) from None


def stage_prompts(cfg: QuickstartConfig, lay: Layout, out: OutputOptions) -> dict:
    chats = _prompts(cfg)
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


# -- by hand --------------------------------------------------------------------------------


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


# -- run ------------------------------------------------------------------------------------


def _run_stages(cfg: QuickstartConfig, lay: Layout, state: dict[str, Any]) -> list[str]:
    out = _stage_output(cfg)
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
        _save_state(lay.root, state)
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


def _fmt(value: float | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


PATH_LABELS = {
    "dir": "directory",
    "target": "target model",
    "prompts": "prompts (gen)",
    "bench_prompts": "prompts (bench)",
    "tokens": "token dataset",
    "validate_report": "validate report",
    "hidden": "hidden states",
    "run": "train run",
    "drafter": "drafter (eagle3kit)",
    "vllm": "drafter (vLLM)",
    "sglang": "drafter (SGLang)",
    "state": "quickstart record",
}


def show(r: QuickstartResult, opts: OutputOptions) -> None:
    measured = _fmt(r.measured_acceptance_length, ".2f")
    if r.lossless is not None:
        measured += "  (lossless)" if r.lossless else "  (NOT lossless: see bench above)"
    stages = sum(v for k, v in r.seconds.items() if k != "this run")
    spent = f"{stages:.0f} s"
    if r.skipped:
        spent += f"; this run {r.seconds['this run']:.0f} s ({', '.join(r.skipped)} done earlier)"
    if r.continued:
        spent += "; continued " + ", ".join(f"{k} from {v:,}" for k, v in r.continued.items())
    rows: list[Sequence[object]] = [
        ["predicted acceptance length", _fmt(r.predicted_acceptance_length, ".2f")],
        ["measured acceptance length", measured],
        ["samples", f"{r.samples:,}"],
        ["truncation rate", f"{r.truncation_rate:.1%}"],
        ["tokens", f"{r.tokens:,} ({r.completion_tokens:,} in completions)"],
        ["final training loss", _fmt(r.final_loss, ".3f")],
        ["validate", r.validate_summary],
        ["time", spent],
        *([PATH_LABELS.get(k, k), v] for k, v in r.paths.items()),
        *([f"by hand: {k}", v] for k, v in r.commands.items()),
    ]
    title = f"quickstart (acceptance lengths: chain k = {K}, temperature 0)"
    _ui.table(title, ["what", "value"], rows, opts, fold=True)


def run(cfg: QuickstartConfig) -> QuickstartResult:
    start = time.perf_counter()
    state = _load_state(cfg)
    lay = Layout(cfg.out)
    check_code(cfg, lay, state)
    _prompts(cfg)  # too many asked for: say so before minutes of work, not after
    import torch

    _save_state(lay.root, state)
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

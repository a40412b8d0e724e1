"""Drafter quality: eagle3kit's trainer against speculators 0.9.0's, on the same data.

    python benchmarks/quality_bench.py              # the full run (~25 min on 2 busy cores)
    python benchmarks/quality_bench.py --quick      # a smoke run of a few minutes
    python benchmarks/quality_bench.py --json > quality.json   # table on stderr, figures on stdout
    python benchmarks/quality_bench.py --no-peer --ours-args "--ttt-decay 1" --label decay1

The world: a tiny reasoning target (eagle3kit.tiny: stdlib tokenizer, think/answer chat
template, 8 layers) trained from scratch on the docstrings outside a held-out third; prompts
are the first sentences of the held-out docstrings, which neither the target nor a drafter
saw. `eagle3kit gen --engine hf` answers the training prompts at temperature 0 (on-policy
data), `eagle3kit extract` stores their hidden states and `eagle3kit convert --to
speculators` hands the very same states to speculators. Then, per seed:

- ours: `eagle3kit train` with the recipe below (ttt steps and lr matched to speculators',
  the full vocabulary as speculators uses without a frequency file);
- peer: `speculators train` (0.9.0, its own trainer, its CLI defaults: Muon + AdamW, lr 1e-3,
  linear schedule, forward KL, 3 TTT steps, its norm flags), in its own venv, on the CPU;

both for the same number of epochs over the same samples in 1,024-token packed batches
(BATCH_TOKENS: speculators' --total-seq-len, eagle3kit's --batch-tokens), so the tokens each
one trains on match (the table shows both counts). Every drafter is measured by
`eagle3kit bench accept` on the same held-out prompts (chain k=3, temperature 0).

The table gives each side's acceptance length and per-position acceptance rates (mean over
seeds, every seed's figure beside it), its training tokens/s (tokens over the training loop's
wall time, each side on one thread, alone on the machine's share it gets), the ratio
eagle3kit / speculators of the mean acceptance length (target >= 1.05), and eagle3kit
train's predicted acceptance length (its held-out split, from the training distribution)
against the measured one (target within 5%).

Stages are kept under --dir and reused when their settings match (target, data, states);
drafters are trained again unless --reuse-drafters. The speculators venv is
~/.cache/eagle3kit/speculators-0.9.0 ($EAGLE3KIT_SPECULATORS_VENV), as the slow suite's
tests/test_speculators_load.py builds it; --build-venv builds it the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

# After the thread settings above, which torch reads when it loads.
from _common import REPO  # noqa: E402

from eagle3kit import tiny  # noqa: E402
from eagle3kit._lock import file_lock  # noqa: E402
from eagle3kit.format import Dataset  # noqa: E402

VENV = Path(
    os.environ.get(
        "EAGLE3KIT_SPECULATORS_VENV", Path.home() / ".cache" / "eagle3kit" / "speculators-0.9.0"
    )
)
VENV_INSTALLS = [  # tests/test_speculators_load.py's INSTALLS, the same list: either builds it
    ["torch==2.13.0", "transformers<=5.19"],
    ["--no-deps", "speculators==0.9.0", "hs-connectors==0.9.0"],
    ["openai", "datasets>=4.0.0,<=5.1.0", "loguru>=0.7.2,<=0.7.3", "pydantic-settings", "httpx"],
]
TRAINER_INSTALLS = ["httpx", "pydantic-settings", "psutil", "protobuf", "torch==2.13.0"]
"""What `speculators train` imports beyond the loader (torch pinned: never replaced)."""
HELD_OUT_EVERY = 3
"""Every third docstring (index % 3 == 2) is kept from the target: the prompts come from them."""
K = 3
BATCH_TOKENS = 1024
"""Tokens per packed batch, both sides (speculators' --total-seq-len, eagle3kit's
--batch-tokens). Their default is 8,192; speculators pads every batch to it and its sdpa
attention takes a dense mask over it, which on a CPU made one step of a few thousand real
tokens cost many seconds, so both run at an eighth of it (the samples are < 300 tokens)."""
OURS_RECIPE = ["--ttt-steps", "3", "--lr", "1e-3"]
"""eagle3kit train's flags beyond its defaults: the settings matched to speculators'."""

PEER_RUNNER = r'''
"""speculators' own trainer on the CPU, counting the tokens and time of its training loop."""
import json, sys, time
import torch
import speculators.train.trainer as trainer

# Its trainer moves the model and every batch to the local rank (an accelerator index),
# and its step timer synchronizes the accelerator: on a CPU-only machine the device is the
# CPU, whose work is done when the call returns. Nothing else is changed.
trainer.get_local_rank = lambda: "cpu"
if not torch.accelerator.is_available():
    torch.accelerator.synchronize = lambda *a, **k: None
counts = {"tokens": 0, "steps": 0, "seconds": 0.0}
train_epoch = trainer.Trainer.train_epoch


def timed_epoch(self, epoch, **kw):
    if not getattr(self, "_counting", False):
        def count(module, args, kwargs):
            if module.training:
                counts["tokens"] += int((kwargs["document_ids"] != -1).sum())
                counts["steps"] += 1
        self.model.register_forward_pre_hook(count, with_kwargs=True)
        self._counting = True
    start = time.perf_counter()
    try:
        return train_epoch(self, epoch, **kw)
    finally:
        counts["seconds"] += time.perf_counter() - start


trainer.Trainer.train_epoch = timed_epoch
torch.set_num_threads(1)
out = sys.argv[1]
from speculators.train.cli import main
from speculators.train.config import TrainConfig

main(TrainConfig.resolve(sys.argv[2:]))
with open(out, "w") as f:
    json.dump(counts, f)
'''


@dataclass
class Sizes:
    target_steps: int
    train_prompts: int
    bench_prompts: int
    max_tokens: int
    epochs: int

    def key(self) -> dict:
        return asdict(self)


FULL = Sizes(target_steps=300, train_prompts=300, bench_prompts=100, max_tokens=128, epochs=6)
QUICK = Sizes(target_steps=120, train_prompts=40, bench_prompts=12, max_tokens=64, epochs=10)


@dataclass
class Side:
    name: str
    seeds: dict[int, dict] = field(default_factory=dict)


def log(msg: str) -> None:
    print(f"[quality {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def sh(
    cmd: list[str],
    *,
    python: str = sys.executable,
    env: dict | None = None,
    capture: bool = False,
    log_file: Path | None = None,
) -> str:
    """Run one stage as its own process; its stdout when `capture`, else stdout and stderr
    go to `log_file` (or are dropped): only this script writes to stdout."""
    full = [python, *cmd]
    with open(log_file or os.devnull, "w") as sink:
        proc = subprocess.run(
            full,
            env=env,
            text=True,
            stdout=subprocess.PIPE if capture else sink,
            stderr=subprocess.PIPE if capture else subprocess.STDOUT,
            cwd=REPO,
        )
    if proc.returncode != 0:
        tail = proc.stderr if capture else (log_file.read_text() if log_file else "")
        sys.exit(
            f"quality_bench: {shlex.join(full)} exited {proc.returncode}:\n{(tail or '')[-4000:]}"
        )
    return proc.stdout if capture else ""


def eagle3kit(*args: str, capture: bool = False, log_file: Path | None = None) -> str:
    return sh(["-m", "eagle3kit", *args], capture=capture, log_file=log_file)


# -- the world ------------------------------------------------------------------------------


def _stage_done(path: Path, key: dict) -> bool:
    marker = path / ".quality-bench.json"
    return marker.is_file() and json.loads(marker.read_text()) == key


def _mark(path: Path, key: dict) -> None:
    (path / ".quality-bench.json").write_text(json.dumps(key))


def split_docs() -> tuple[list[str], list[str]]:
    """(the target's training docstrings, the held-out ones the prompts come from)."""
    docs = tiny.stdlib_docstrings()
    held = [d for i, d in enumerate(docs) if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1]
    return [d for i, d in enumerate(docs) if i % HELD_OUT_EVERY != HELD_OUT_EVERY - 1], held


def make_target(root: Path, sizes: Sizes) -> Path:
    target = root / "target"
    key = {"steps": sizes.target_steps, "held_out_every": HELD_OUT_EVERY}
    if _stage_done(target, key):
        return target
    shutil.rmtree(target, ignore_errors=True)
    log(
        f"target: tiny 8-layer Llama, {sizes.target_steps} training steps on 2/3 of the stdlib "
        "docstrings"
    )
    train_docs, _ = split_docs()
    tiny.train_target(tiny.make_target(target), steps=sizes.target_steps, corpus=train_docs)
    _mark(target, key)
    return target


def write_prompts(root: Path, sizes: Sizes) -> tuple[Path, Path]:
    _, held = split_docs()
    questions = list(dict.fromkeys(tiny.docstring_chat(d)[0] for d in held))
    need = sizes.train_prompts + sizes.bench_prompts
    if len(questions) < need:
        sys.exit(f"quality_bench: only {len(questions)} held-out prompts (asked for {need})")
    # Bench prompts first, so a larger --train-prompts never takes one of them.
    bench, train = questions[: sizes.bench_prompts], questions[sizes.bench_prompts : need]
    paths = root / "train.jsonl", root / "bench.jsonl"
    for path, part in zip(paths, (train, bench), strict=True):
        path.write_text(
            "".join(json.dumps({"messages": [{"role": "user", "content": q}]}) + "\n" for q in part)
        )
    return paths


def make_data(root: Path, target: Path, train_prompts: Path, sizes: Sizes) -> dict:
    """gen, extract, convert: the token, hidden and speculators datasets."""
    key = {
        "target": json.loads((target / ".quality-bench.json").read_text()),
        "train_prompts": sizes.train_prompts,
        "bench_prompts": sizes.bench_prompts,
        "max_tokens": sizes.max_tokens,
    }
    paths = {"tokens": root / "tokens", "hidden": root / "hidden", "peer": root / "peer-data"}
    seconds: dict[str, float] = {}
    if not _stage_done(root / "tokens", key):
        for path in paths.values():
            shutil.rmtree(path, ignore_errors=True)
        log(
            f"gen: {sizes.train_prompts} prompts, temperature 0, --max-tokens {sizes.max_tokens} "
            "(transformers in-process)"
        )
        start = time.perf_counter()
        eagle3kit(
            "gen",
            str(train_prompts),
            str(paths["tokens"]),
            "--engine",
            "hf",
            "--target",
            str(target),
            "--temperature",
            "0",
            "--max-tokens",
            str(sizes.max_tokens),
            "-q",
            log_file=root / "gen.log",
        )
        seconds["gen"] = time.perf_counter() - start
        log("extract: hidden states at the default layers")
        start = time.perf_counter()
        eagle3kit(
            "extract",
            str(paths["tokens"]),
            str(paths["hidden"]),
            "--target",
            str(target),
            "--device",
            "cpu",
            "-q",
            log_file=root / "extract.log",
        )
        seconds["extract"] = time.perf_counter() - start
        eagle3kit(
            "convert",
            str(paths["hidden"]),
            str(paths["peer"]),
            "--to",
            "speculators",
            "-q",
            log_file=root / "convert.log",
        )
        _mark(root / "tokens", key)
    tokens = Dataset(paths["tokens"])
    return {
        **{k: str(v) for k, v in paths.items()},
        "samples": len(tokens),
        "tokens": tokens.num_tokens,
        "loss_tokens": tokens.num_loss_tokens,
        "seconds": seconds,
    }


# -- the two trainers -----------------------------------------------------------------------


def train_ours(
    root: Path,
    target: Path,
    hidden: Path,
    seed: int,
    sizes: Sizes,
    extra: list[str],
    label: str,
    eval_split: int,
    reuse: bool,
) -> dict:
    run = root / f"ours-{label}-s{seed}"
    result_file = run / "quality-result.json"
    if reuse and result_file.is_file():
        return json.loads(result_file.read_text())
    args = [
        "train",
        str(hidden),
        str(run),
        "--target",
        str(target),
        "--device",
        "cpu",
        "--draft-vocab",
        "1000000",
        "--batch-tokens",
        str(BATCH_TOKENS),
        "--epochs",
        str(sizes.epochs),
        "--eval-split",
        str(eval_split),
        "--eval-every",
        "0",
        "--eval-k",
        str(K),
        "--seed",
        str(seed),
        "--overwrite",
        "--json",
        "-q",
        *OURS_RECIPE,
        *extra,
    ]
    log(f"ours s{seed} [{label}]: eagle3kit {shlex.join(args[1:])}")
    result = json.loads(eagle3kit(*args, capture=True))
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "tokens_per_s" in r]
    out = {
        "drafter": str(run / "drafter"),
        "tokens": result["tokens"],
        "steps": result["steps"],
        "tokens_per_s": steps[-1]["tokens_per_s"],
        "train_seconds": steps[-1]["elapsed"],
        "predicted": result["eval"]["predicted_acceptance_length"],
        "predicted_per_position": result["eval"].get("per_position"),
        "loss": result["loss"],
    }
    result_file.write_text(json.dumps(out))
    return out


def peer_python() -> Path:
    return VENV / "bin" / "python"


def venv_lock() -> AbstractContextManager[None]:
    """The lock tests/test_speculators_load.py builds the venv under (the slow tier runs
    both at once, and a venv cleared by one while the other used it lost its packages)."""
    VENV.parent.mkdir(parents=True, exist_ok=True)
    return file_lock(VENV.with_name(VENV.name + ".lock"))


def build_venv() -> None:
    """Build the venv unless it is ready (it may have been, once the lock was ours)."""
    ready = VENV / ".eagle3kit-ready"
    if ready.is_file() and json.loads(ready.read_text()) == VENV_INSTALLS:
        return
    log(f"building the speculators venv in {VENV}")
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
    for args in VENV_INSTALLS:
        subprocess.run([str(peer_python()), "-m", "pip", "install", "-q", *args], check=True)
    ready.write_text(json.dumps(VENV_INSTALLS))


def ensure_trainer() -> None:
    """The venv the slow suite builds has the loader; add what the trainer imports."""
    probe = [str(peer_python()), "-c", "import speculators.train.cli"]
    if subprocess.run(probe, capture_output=True).returncode == 0:
        return
    log(f"adding speculators' trainer dependencies to {VENV}: {' '.join(TRAINER_INSTALLS)}")
    subprocess.run(
        [str(peer_python()), "-m", "pip", "install", "-q", *TRAINER_INSTALLS], check=True
    )


def peer_checkpoint(save: Path) -> Path:
    """The last epoch's checkpoint directory speculators wrote under `save`."""
    epochs = sorted((int(p.name), p) for p in save.iterdir() if p.name.isdigit())
    if not epochs:
        sys.exit(f"quality_bench: speculators wrote no checkpoint under {save}")
    return epochs[-1][1]


def train_peer(root: Path, target: Path, data: Path, seed: int, sizes: Sizes, reuse: bool) -> dict:
    run = root / f"peer-s{seed}"
    result_file = run / "quality-result.json"
    if reuse and result_file.is_file():
        return json.loads(result_file.read_text())
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    (run / "runner.py").write_text(PEER_RUNNER)
    counts = run / "counts.json"
    # Everything left at speculators' CLI default except: where things go, the budget
    # (--epochs), the seed, and what a CPU needs: fp32 states (bf16 autocast is a GPU path),
    # sdpa attention and the eager loss (flex attention and the fused loss are Triton
    # kernels; the eager loss is the same formula), no dataloader worker processes.
    args = [
        str(run / "runner.py"),
        str(counts),
        "--verifier-name-or-path",
        str(target),
        "--data-path",
        str(data),
        "--save-path",
        str(run / "checkpoints"),
        "--log-dir",
        str(run / "logs"),
        "--epochs",
        str(sizes.epochs),
        "--seed",
        str(seed),
        "--total-seq-len",
        str(BATCH_TOKENS),
        "--hidden-states-dtype",
        "float32",
        "--draft-attn-impl",
        "sdpa",
        "--loss-implementation",
        "eager",
        "--num-workers",
        "0",
        "--on-missing",
        "raise",
        "--no-resume-from-checkpoint",
    ]
    log(f"peer s{seed}: speculators train {shlex.join(args[2:])}")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    sh(args, python=str(peer_python()), env=env, log_file=run / "train.log")
    measured = json.loads(counts.read_text())
    out = {
        "drafter": str(peer_checkpoint(run / "checkpoints")),
        "tokens": measured["tokens"],
        "steps": measured["steps"],
        "tokens_per_s": round(measured["tokens"] / max(measured["seconds"], 1e-9), 1),
        "train_seconds": round(measured["seconds"], 2),
        "predicted": None,
    }
    result_file.write_text(json.dumps(out))
    return out


def bench(target: Path, drafter: str, prompts: Path, sizes: Sizes) -> dict:
    report = json.loads(
        eagle3kit(
            "bench",
            "accept",
            str(prompts),
            "--target",
            str(target),
            "--drafter",
            drafter,
            "--k",
            str(K),
            "--temperature",
            "0",
            "--max-new-tokens",
            str(sizes.max_tokens),
            "--device",
            "cpu",
            "--json",
            "-q",
            capture=True,
        )
    )
    return {
        "acceptance_length": report["acceptance_length"],
        "per_position": report["per_position"],
        "rounds": report["rounds"],
        "lossless": report["lossless"],
    }


# -- the table ------------------------------------------------------------------------------


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def summarize(side: Side) -> dict:
    runs = list(side.seeds.values())
    als = [r["acceptance_length"] for r in runs]
    positions = list(zip(*[r["per_position"] for r in runs], strict=True))
    out = {
        "acceptance_length": mean(als),
        "acceptance_length_per_seed": als,
        "per_position": [mean([p or 0.0 for p in pos]) for pos in positions],
        "tokens_per_s": mean([r["tokens_per_s"] for r in runs]),
        "tokens": mean([r["tokens"] for r in runs]),
        "steps": mean([r["steps"] for r in runs]),
    }
    predicted = [r["predicted"] for r in runs if r.get("predicted") is not None]
    if predicted:
        out["predicted"] = mean(predicted)
        out["predicted_per_seed"] = predicted
        out["predicted_error"] = mean([r["predicted"] / r["acceptance_length"] - 1 for r in runs])
    return out


def table(sides: dict[str, dict], label: str) -> str:
    rows = [
        f"| drafter | acceptance length (k={K}) | per seed | per position | train tokens/s "
        "| tokens seen | steps |",
        "|---|---:|---|---|---:|---:|---:|",
    ]
    for name, s in sides.items():
        title = f"eagle3kit [{label}]" if name == "ours" else "speculators 0.9.0 (CLI defaults)"
        rows.append(
            f"| {title} | {s['acceptance_length']:.3f} | "
            f"{' / '.join(f'{a:.3f}' for a in s['acceptance_length_per_seed'])} | "
            f"{' / '.join(f'{p:.3f}' for p in s['per_position'])} | {s['tokens_per_s']:,.0f} | "
            f"{s['tokens']:,.0f} | {s['steps']:.0f} |"
        )
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke sizes: a few minutes")
    ap.add_argument("--dir", type=Path, default=REPO / "bench-out" / "quality")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--epochs", type=int, help="override the sizes' epochs (both sides)")
    ap.add_argument("--train-prompts", type=int)
    ap.add_argument("--bench-prompts", type=int)
    ap.add_argument(
        "--ours-args",
        default="",
        help="extra eagle3kit train flags (recipe runs); a lone flag needs '=': --ours-args=--auf",
    )
    ap.add_argument("--label", default="default", help="names the eagle3kit runs")
    ap.add_argument("--no-peer", action="store_true", help="only the eagle3kit side")
    ap.add_argument(
        "--reuse-drafters",
        action="store_true",
        help="keep drafters an earlier run trained with the same label and seed",
    )
    ap.add_argument("--build-venv", action="store_true")
    ap.add_argument(
        "--world-only", action="store_true", help="build the target and the datasets, then stop"
    )
    ap.add_argument("--json", action="store_true", help="the figures as JSON on stdout")
    a = ap.parse_args()

    sizes = QUICK if a.quick else FULL
    for name in ("epochs", "train_prompts", "bench_prompts"):
        if getattr(a, name) is not None:
            setattr(sizes, name, getattr(a, name))
    seeds = [int(s) for s in a.seeds.split(",")]
    root = a.dir / ("quick" if a.quick else "full")
    root.mkdir(parents=True, exist_ok=True)
    peer = not a.no_peer
    if peer:
        with venv_lock():
            if not (VENV / ".eagle3kit-ready").is_file() and not a.build_venv:
                sys.exit(
                    f"quality_bench: no speculators venv at {VENV}; add --build-venv "
                    "(or --no-peer for the eagle3kit side only)"
                )
            if a.build_venv:
                build_venv()
            ensure_trainer()

    began = time.perf_counter()
    target = make_target(root, sizes)
    train_prompts, bench_prompts = write_prompts(root, sizes)
    data = make_data(root, target, train_prompts, sizes)
    if a.world_only:
        print(json.dumps(data, indent=2), file=sys.stderr)
        return
    # speculators holds out 10% (--train-data-ratio 0.9): eagle3kit holds out as many, so
    # both train on as many samples (not the same ones: each picks its own).
    eval_split = max(2, round(0.1 * data["samples"]))
    extra = shlex.split(a.ours_args)
    sides = {"ours": Side("ours")}
    if peer:
        sides["peer"] = Side("peer")
    train_seconds = {}
    for seed in seeds:
        start = time.perf_counter()
        run = train_ours(
            root,
            target,
            Path(data["hidden"]),
            seed,
            sizes,
            extra,
            a.label,
            eval_split,
            a.reuse_drafters,
        )
        train_seconds[f"ours-s{seed}"] = time.perf_counter() - start
        run.update(bench(target, run["drafter"], bench_prompts, sizes))
        sides["ours"].seeds[seed] = run
        log(
            f"ours s{seed}: AL {run['acceptance_length']:.3f} (predicted {run['predicted']:.3f}), "
            f"{run['tokens_per_s']:,.0f} tok/s"
        )
        if peer:
            start = time.perf_counter()
            run = train_peer(root, target, Path(data["peer"]), seed, sizes, a.reuse_drafters)
            train_seconds[f"peer-s{seed}"] = time.perf_counter() - start
            run.update(bench(target, run["drafter"], bench_prompts, sizes))
            sides["peer"].seeds[seed] = run
            log(
                f"peer s{seed}: AL {run['acceptance_length']:.3f}, {run['tokens_per_s']:,.0f} tok/s"
            )

    summary = {name: summarize(side) for name, side in sides.items()}
    ours = summary["ours"]
    figures = {
        "sizes": sizes.key(),
        "seeds": seeds,
        "label": a.label,
        "ours_args": extra,
        "recipe": OURS_RECIPE,
        "data": data,
        "sides": summary,
        "runs": {n: s.seeds for n, s in sides.items()},
        "predicted_vs_measured": ours.get("predicted_error"),
        "wall_s": round(time.perf_counter() - began, 1),
    }
    lines = [table(summary, a.label), ""]
    if peer:
        ratio = ours["acceptance_length"] / summary["peer"]["acceptance_length"]
        speed = ours["tokens_per_s"] / summary["peer"]["tokens_per_s"]
        figures.update(ratio=ratio, speed_ratio=speed)
        lines.append(
            f"acceptance length eagle3kit / speculators: {ratio:.3f}x "
            f"(target >= 1.05x, mean of {len(seeds)} seeds)"
        )
        lines.append(f"train tokens/s eagle3kit / speculators: {speed:.2f}x")
    if "predicted" in ours:
        lines.append(
            f"eagle3kit train's predicted acceptance length {ours['predicted']:.3f} vs "
            f"measured {ours['acceptance_length']:.3f}: "
            f"{100 * ours['predicted_error']:+.1f}% (target within 5%)"
        )
    lines.append(
        f"{data['samples']} training samples ({data['tokens']} tokens), "
        f"{sizes.bench_prompts} held-out prompts, {sizes.epochs} epochs, seeds "
        f"{a.seeds}; wall {figures['wall_s']:.0f} s"
    )
    print("\n".join(lines), file=sys.stderr)
    if a.json:
        print(json.dumps(figures, indent=2, default=str))


if __name__ == "__main__":
    main()

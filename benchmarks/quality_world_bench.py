"""Drafter quality: eagle3kit's trainer against speculators 0.9.0's, in a world like the served one.

    python benchmarks/quality_world_bench.py --build-venv   # the full run (hours on 2 busy cores)
    python benchmarks/quality_world_bench.py --quick        # a smoke run of a few minutes
    python benchmarks/quality_world_bench.py --json > quality.json  # figures on stdout
    python benchmarks/quality_world_bench.py --variant auf="--auf" --reuse-drafters

The world (eagle3kit.tiny_reasoning, docs/quality.md): a tiny reasoning target (Llama, 8
layers) trained from a seed on synthetic step-by-step tasks (arithmetic with carries, sorting
with every pass, unit conversion, rule chains) in think/answer form mixed with stdlib
docstring chats, so that its outputs at temperature 1 are about as predictable as a real
reasoning model's. Prompts come from its three disjoint splits: the drafters' training data
from `train`, the benchmark's from `heldout`, which neither the target nor a drafter nor any
checkpoint choice saw. `eagle3kit gen --engine hf` answers the training prompts (on-policy
data), `eagle3kit extract` stores their hidden states and `eagle3kit convert --to
speculators` hands the very same states to speculators. Then, per seed:

- ours: `eagle3kit train` at its defaults (plus each --variant's flags), evaluated once an
  epoch on its own held-out share of the training samples, which picks its drafter;
- peer: `speculators train` (0.9.0, its own trainer, in its own venv, on the CPU) under each
  recipe of PEER_RECIPES: its CLI defaults, the tuned recipe, and the tuned recipe with its
  `lk_hybrid` loss; its drafter is the one its --save-best points at (lowest validation loss);

both over the same samples in BATCH_TOKENS-token packed batches: the peer for the sizes'
epochs, eagle3kit for as many optimizer steps as the peer took (`--max-steps`; the two pack
an epoch into different numbers of batches, and at this size steps decide much), or for the
same epochs with --same-epochs; the table shows the steps and tokens. Every drafter is measured by
`eagle3kit bench accept` on the same held-out prompts (chain k = 3) under each of CONDITIONS:
temperature 0, and temperature 1 verified by vLLM's default rule (greedy drafts, one-hot) and
by `probabilistic`; the sampling seed is the training seed, so the sides are paired.

Tables: per condition, each drafter's acceptance length (pooled over seeds and prompts,
every seed's beside it), per draft position and per context-depth bucket; then eagle3kit /
the peer's best recipe under that condition, with a paired bootstrap 95% interval over
prompts and seeds (the peer's best is picked on the held-out figures themselves, which only
favours the peer); the trainers' tokens/s (one after the other, one thread each) and train's
predicted acceptance length against the measured one at temperature 0.

The target and the greedy training data of the full sizes are shipped, made by this script,
under benchmarks/worlds/reasoning/ (their settings recorded beside them): a run whose
settings match copies them instead of training (3 to 45 minutes) and gen (9 to 13), and the
same recipe makes another target on another machine (--rebuild-world makes its own).
--gen-temperature and --gen-samples make other data (gen at that temperature, that many
answers a prompt, seeded).

Stages are kept under --dir and reused when their settings match (target, data, states);
drafters (and their bench figures) are trained again unless --reuse-drafters. The
speculators venv is ~/.cache/eagle3kit/speculators-0.9.0 ($EAGLE3KIT_SPECULATORS_VENV), as
the slow suite's tests/test_speculators_load.py builds it; --build-venv builds it the same way.
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
from dataclasses import asdict, dataclass, replace
from pathlib import Path

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

# After the thread settings above, which torch reads when it loads.
from eagle3kit import tiny_reasoning  # noqa: E402
from eagle3kit._lock import file_lock  # noqa: E402
from eagle3kit.format import Dataset  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
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
K = 3
CONDITIONS: dict[str, tuple[float, str | None]] = {
    "T=0": (0.0, None),
    "T=1 onehot": (1.0, "onehot"),
    "T=1 probabilistic": (1.0, "probabilistic"),
}
"""Name -> (temperature, bench accept --verify): greedy, and T = 1 under vLLM's default rule
(greedy drafts, one-hot acceptance) and under its `probabilistic` one."""
TUNED = [
    "--optimizer",
    "adamw",
    "--lr",
    "1e-3",
    "--weight-decay",
    "0.01",
    "--scheduler-type",
    "cosine",
    "--scheduler-warmup-ratio",
    "0.05",
    "--loss-fn",
    "kl_div",
    "--ttt-steps",
    "3",
    "--ttt-step-loss-decay",
    "1.0",
]
"""speculators' recipe as a careful user tunes it (issue 40): AdamW lr 1e-3, weight decay
0.01, cosine with 5% warm-up, forward KL, 3 TTT steps, step-loss decay 1.0; the full
vocabulary (no frequency file), BATCH_TOKENS packed batches and gradient clipping at 1.0 are
what every recipe here gets (speculators clips at 1.0 always)."""
PEER_RECIPES: dict[str, list[str]] = {
    "defaults": [],
    "tuned": TUNED,
    "lk_hybrid": [
        *TUNED[: TUNED.index("--loss-fn")],
        "--loss-fn",
        "lk_hybrid",
        *TUNED[TUNED.index("--loss-fn") + 2 :],
    ],
}
BOOTSTRAP = 2000
"""Bootstrap replicates of the ratio's interval."""

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
    target: tiny_reasoning.TargetRecipe
    train_prompts: int
    bench_prompts: int
    gen_tokens: int
    """gen's --max-tokens: the longest training answer."""
    bench_tokens: int
    """bench accept's --max-new-tokens."""
    epochs: int
    batch_tokens: int
    """Tokens per packed batch, both sides (speculators' --total-seq-len, eagle3kit's
    --batch-tokens), at least the longest sample: speculators pads every batch to it and
    its sdpa attention takes a dense mask over it, so it is kept near the longest sample."""
    depth_edges: str
    """bench accept's --depth-buckets: where this world's rounds happen."""
    world_seed: int = 0

    def key(self) -> dict:
        return asdict(self)


FULL = Sizes(
    target=tiny_reasoning.TargetRecipe(),
    train_prompts=400,
    bench_prompts=300,
    gen_tokens=1536,
    bench_tokens=768,
    epochs=6,
    batch_tokens=2048,
    depth_edges="256,512",
)
QUICK = Sizes(
    target=tiny_reasoning.TargetRecipe(
        hidden_size=64,
        heads=2,
        kv_heads=1,
        vocab_size=384,
        chats=600,
        steps=40,
        row_tokens=256,
        rows=4,
    ),
    train_prompts=40,
    bench_prompts=8,
    gen_tokens=128,
    bench_tokens=48,
    epochs=3,
    batch_tokens=1024,
    depth_edges="64,128",
)


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


SHIPPED = REPO / "benchmarks" / "worlds" / "reasoning"
"""The full world's target and greedy training data as this script made them
(docs/quality.md, "The world, shipped"): the target takes up to ~45 minutes on one thread,
every session starts on a fresh machine, and another machine's kernels make another target
from the recipe. A stage takes its shipped copy when the copy's settings are the ones asked
for (--rebuild-world never does)."""


def _from_shipped(path: Path, key: dict, use_shipped: bool) -> bool:
    """Copy the shipped `path.name` into `path` when its recorded settings are `key`."""
    shipped = SHIPPED / path.name
    if not use_shipped or not _stage_done(shipped, key):
        return False
    shutil.rmtree(path, ignore_errors=True)
    shutil.copytree(shipped, path)
    log(f"{path.name}: the shipped copy ({shipped.relative_to(REPO)}), made with these settings")
    return True


def make_target(root: Path, sizes: Sizes, use_shipped: bool = True) -> Path:
    target = root / "target"
    key = asdict(sizes.target)
    if _stage_done(target, key) or _from_shipped(target, key, use_shipped):
        return target
    shutil.rmtree(target, ignore_errors=True)
    r = sizes.target
    log(
        f"target: tiny reasoning Llama, {r.num_layers} layers, hidden {r.hidden_size}, "
        f"{r.steps} steps of {r.rows}x{r.row_tokens} tokens (one thread)"
    )
    tiny_reasoning.train_reasoning_target(target, r)
    log(f"target trained in {tiny_reasoning.load_record(target)['train_seconds']:.0f} s")
    _mark(target, key)
    return target


DRAFTER_DATA_SEED = 1000
"""The drafters' training prompts are drawn from the train split with world seed + this, so
they are other problems than the target trained on (same split, same kinds)."""


def write_prompts(root: Path, sizes: Sizes) -> tuple[Path, Path]:
    """(the drafters' training prompts, the held-out benchmark prompts) as JSONL."""
    train = tiny_reasoning.write_prompts(
        root / "train.jsonl", "train", sizes.train_prompts, sizes.world_seed + DRAFTER_DATA_SEED
    )
    bench = tiny_reasoning.write_prompts(
        root / "bench.jsonl", "heldout", sizes.bench_prompts, sizes.world_seed
    )
    return train, bench


def make_data(
    root: Path,
    target: Path,
    train_prompts: Path,
    sizes: Sizes,
    gen_temperature: float,
    use_shipped: bool = True,
    gen_samples: int = 1,
) -> dict:
    """gen, extract, convert: the token, hidden and speculators datasets (gen's from the
    shipped copy when it was made with these settings)."""
    key = {
        "target": json.loads((target / ".quality-bench.json").read_text()),
        "train_prompts": sizes.train_prompts,
        "gen_tokens": sizes.gen_tokens,
        "gen_temperature": gen_temperature,
        "world_seed": sizes.world_seed,
        # only where it is not 1, so a key of the one-sample data is what it always was
        **({"gen_samples": gen_samples} if gen_samples != 1 else {}),
    }
    # Samples at T > 0 are seeded (by the world seed and each sample's id): the data reproduces.
    sampling = ["--sampling-seed", str(sizes.world_seed)] if gen_temperature > 0 else []
    paths = {"tokens": root / "tokens", "hidden": root / "hidden", "peer": root / "peer-data"}
    seconds: dict[str, float] = {}
    # Done once convert is (its marker); tokens/ keeps one too, which makes it a copy to ship.
    if not _stage_done(paths["peer"], key):
        for path in paths.values():
            shutil.rmtree(path, ignore_errors=True)
        if not _from_shipped(paths["tokens"], key, use_shipped):
            log(
                f"gen: {sizes.train_prompts} prompts x {gen_samples} samples, temperature "
                f"{gen_temperature:g}, --max-tokens {sizes.gen_tokens} (transformers in-process)"
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
                str(gen_temperature),
                "--max-tokens",
                str(sizes.gen_tokens),
                "--n",
                str(gen_samples),
                *sampling,
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
        _mark(paths["tokens"], key)
        _mark(paths["peer"], key)
    tokens = Dataset(paths["tokens"])
    return {
        **{k: str(v) for k, v in paths.items()},
        "samples": len(tokens),
        "tokens": tokens.num_tokens,
        "loss_tokens": tokens.num_loss_tokens,
        "seconds": seconds,
    }


# -- the two trainers -----------------------------------------------------------------------


def _reused(result_file: Path, key: dict, reuse: bool) -> dict | None:
    if reuse and result_file.is_file():
        result = json.loads(result_file.read_text())
        if result.get("key") == key:
            return result
    return None


def train_ours(
    root: Path,
    target: Path,
    hidden: Path,
    seed: int,
    sizes: Sizes,
    extra: list[str],
    label: str,
    eval_split: int,
    eval_every: int,
    reuse: bool,
    steps: int | None = None,
) -> dict:
    """`eagle3kit train` for sizes.epochs, or for exactly `steps` optimizer steps (the
    peer's, so both sides take as many: the two trainers pack the same epochs into different
    numbers of batches)."""
    run = root / f"ours-{label}-s{seed}"
    budget = ["--max-steps", str(steps)] if steps else ["--epochs", str(sizes.epochs)]
    args = [
        "train",
        str(hidden),
        str(run),
        "--target",
        str(target),
        "--device",
        "cpu",
        "--batch-tokens",
        str(sizes.batch_tokens),
        *budget,
        "--eval-split",
        str(eval_split),
        "--eval-every",
        str(eval_every),
        "--eval-k",
        str(K),
        "--seed",
        str(seed),
        "--overwrite",
        "--json",
        "-q",
        *extra,
    ]
    result_file = run / "quality-result.json"
    if (done := _reused(result_file, {"args": args}, reuse)) is not None:
        return done
    log(f"eagle3kit [{label}] s{seed}: eagle3kit {shlex.join(args)}")
    result = json.loads(eagle3kit(*args, capture=True))
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "tokens_per_s" in r]
    out = {
        "key": {"args": args},
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
    """The checkpoint speculators chose under `save`: the one its --save-best link points
    at (lowest validation loss), else the last epoch's."""
    best = save / "checkpoint_best"
    if best.exists():
        return best.resolve()
    epochs = sorted((int(p.name), p) for p in save.iterdir() if p.name.isdigit())
    if not epochs:
        sys.exit(f"quality_bench: speculators wrote no checkpoint under {save}")
    return epochs[-1][1]


def train_peer(
    root: Path, target: Path, data: Path, seed: int, sizes: Sizes, recipe: str, reuse: bool
) -> dict:
    run = root / f"peer-{recipe}-s{seed}"
    counts = run / "counts.json"
    # Everything left at speculators' CLI default but the recipe's flags, where things go,
    # the budget (--epochs), the seed, its own checkpoint choice (--save-best), and what a
    # CPU needs: fp32 states (bf16 autocast is a GPU path), sdpa attention and the eager
    # loss (flex attention and the fused loss are Triton kernels; the eager loss is the same
    # formula), no dataloader worker processes.
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
        str(sizes.batch_tokens),
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
        "--save-best",
        "--no-resume-from-checkpoint",
        *PEER_RECIPES[recipe],
    ]
    result_file = run / "quality-result.json"
    if (done := _reused(result_file, {"args": args}, reuse)) is not None:
        return done
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    (run / "runner.py").write_text(PEER_RUNNER)
    log(f"speculators [{recipe}] s{seed}: speculators train {shlex.join(args[2:])}")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    sh(args, python=str(peer_python()), env=env, log_file=run / "train.log")
    measured = json.loads(counts.read_text())
    out = {
        "key": {"args": args},
        "drafter": str(peer_checkpoint(run / "checkpoints")),
        "tokens": measured["tokens"],
        "steps": measured["steps"],
        "tokens_per_s": round(measured["tokens"] / max(measured["seconds"], 1e-9), 1),
        "train_seconds": round(measured["seconds"], 2),
        "predicted": None,
    }
    result_file.write_text(json.dumps(out))
    return out


# -- measuring ------------------------------------------------------------------------------


def _slug(condition: str) -> str:
    return condition.replace("=", "").replace(" ", "-")


def per_prompt(prompt: dict) -> dict:
    """One prompt's rounds as sums: rounds, drafts accepted, and rounds that kept at least j
    drafts (j = 1..K)."""
    rounds = prompt["rounds"]
    return {
        "rounds": len(rounds),
        "accepted": sum(rounds),
        "at_least": [sum(a >= j for a in rounds) for j in range(1, K + 1)],
    }


def bench(
    target: Path,
    drafter: str,
    prompts: Path,
    sizes: Sizes,
    condition: str,
    seed: int,
    run: Path,
    reuse: bool,
) -> dict:
    """bench accept under `condition`, reduced to per-prompt sums (kept beside the drafter)."""
    temperature, verify = CONDITIONS[condition]
    args = [
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
        str(temperature),
        *(["--verify", verify] if verify else []),
        "--seed",
        str(seed),
        "--max-new-tokens",
        str(sizes.bench_tokens),
        "--depth-buckets",
        sizes.depth_edges,
        "--device",
        "cpu",
        "--json",
        "-q",
    ]
    result_file = run / f"bench-{_slug(condition)}.json"
    if (done := _reused(result_file, {"args": args}, reuse)) is not None:
        return done
    report = json.loads(eagle3kit(*args, capture=True))
    out = {
        "key": {"args": args},
        "acceptance_length": report["acceptance_length"],
        "per_position": report["per_position"],
        "rounds": report["rounds"],
        "lossless": report["lossless"],
        "depths": report["depths"],
        "prompts": [per_prompt(p) for p in report["prompts"]],
    }
    result_file.write_text(json.dumps(out))
    return out


# -- the figures ----------------------------------------------------------------------------


def pooled(runs: list[dict]) -> dict:
    """Acceptance pooled over seeds and prompts: the acceptance length, per position, per
    depth bucket (acceptance length and rounds)."""
    prompts = [p for r in runs for p in r["prompts"]]
    rounds = sum(p["rounds"] for p in prompts)
    accepted = sum(p["accepted"] for p in prompts)
    at_least = [sum(p["at_least"][j] for p in prompts) for j in range(K)]
    # Per depth bucket: bench accept's own buckets (eagle3kit.model.depth), pooled by rounds.
    buckets: dict[str, dict] = {}
    for run in runs:
        for name, figures in run["depths"].items():
            cell = buckets.setdefault(name, {"rounds": 0, "accepted": 0.0})
            cell["rounds"] += figures["rounds"]
            cell["accepted"] += figures["rounds"] * (figures["acceptance_length"] - 1)
    depths = {
        name: {"rounds": c["rounds"], "acceptance_length": 1 + c["accepted"] / c["rounds"]}
        for name, c in buckets.items()
        if c["rounds"]
    }
    return {
        "acceptance_length": 1 + accepted / rounds if rounds else None,
        "acceptance_length_per_seed": [r["acceptance_length"] for r in runs],
        "per_position": [a / rounds if rounds else None for a in at_least],
        "depths": depths,
        "rounds": rounds,
    }


def paired_ratio(ours: list[dict], peer: list[dict], seed: int = 0) -> dict:
    """Acceptance length ours / peer (pooled), with a paired bootstrap 95% interval: each
    replicate draws seeds (seed i of both sides together) and prompts (prompt j of both
    sides together) with replacement."""
    import numpy as np

    def grids(runs: list[dict]) -> tuple[np.ndarray, np.ndarray]:
        return (
            np.array([[p["accepted"] for p in r["prompts"]] for r in runs], float),
            np.array([[p["rounds"] for p in r["prompts"]] for r in runs], float),
        )

    (a_o, r_o), (a_p, r_p) = grids(ours), grids(peer)
    point = (1 + a_o.sum() / r_o.sum()) / (1 + a_p.sum() / r_p.sum())
    rng = np.random.default_rng(seed)
    n_seeds, n_prompts = a_o.shape
    ratios = []
    for _ in range(BOOTSTRAP):
        ws = np.bincount(rng.integers(0, n_seeds, n_seeds), minlength=n_seeds)
        wp = np.bincount(rng.integers(0, n_prompts, n_prompts), minlength=n_prompts)
        ro, rp = ws @ r_o @ wp, ws @ r_p @ wp
        if ro and rp:
            ratios.append((1 + ws @ a_o @ wp / ro) / (1 + ws @ a_p @ wp / rp))
    low, high = np.percentile(ratios, [2.5, 97.5])
    return {"ratio": float(point), "low": float(low), "high": float(high)}


def _al(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _depth_cell(figures: dict | None) -> str:
    """'2.431 (812)': the bucket's acceptance length and its rounds."""
    return "-" if figures is None else f"{_al(figures['acceptance_length'])} ({figures['rounds']})"


def condition_table(condition: str, sides: dict[str, dict], edges: list[str]) -> str:
    rows = [
        f"{condition}, k = {K}:",
        "| drafter | acceptance length | per seed | per position | "
        + " | ".join(f"depth {e}" for e in edges)
        + " |",
        "|---|---:|---|---|" + "---:|" * len(edges),
    ]
    for name, s in sides.items():
        rows.append(
            f"| {name} | {_al(s['acceptance_length'])} | "
            f"{' / '.join(_al(a) for a in s['acceptance_length_per_seed'])} | "
            f"{' / '.join(_al(p) for p in s['per_position'])} | "
            + " | ".join(_depth_cell(s["depths"].get(e)) for e in edges)
            + " |"
        )
    return "\n".join(rows)


def training_table(trained: dict[str, list[dict]]) -> str:
    rows = [
        "| drafter | train tokens/s | tokens seen | optimizer steps | train s |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, runs in trained.items():
        rows.append(
            f"| {name} | {mean([r['tokens_per_s'] for r in runs]):,.0f} | "
            f"{mean([r['tokens'] for r in runs]):,.0f} | "
            f"{mean([r['steps'] for r in runs]):.0f} | "
            f"{mean([r['train_seconds'] for r in runs]):.0f} |"
        )
    return "\n".join(rows)


def _bucket_floor(name: str) -> int:
    """Where a bucket named by bench accept ('<256', '256-512', '>=1K') starts, in tokens."""
    if name.startswith("<"):
        return 0
    low = name.lstrip(">=").split("-")[0]
    return int(low[:-1]) * 1024 if low.endswith("K") else int(low)


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def parse_variants(values: list[str], ours_args: str, label: str) -> dict[str, list[str]]:
    """--variant NAME=FLAGS (repeatable); without any, the one of --label and --ours-args."""
    if not values:
        return {label: shlex.split(ours_args)}
    out = {}
    for value in values:
        name, sep, flags = value.partition("=")
        if not sep or not name:
            sys.exit(
                f"quality_bench: --variant {value!r}: give NAME=FLAGS, e.g. --variant auf=--auf"
            )
        out[name] = shlex.split(flags)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke sizes: a few minutes")
    ap.add_argument("--dir", type=Path, default=REPO / "bench-out" / "quality")
    ap.add_argument("--seeds", help="comma-separated (default 0,1,2; with --quick 0,1)")
    ap.add_argument("--epochs", type=int, help="override the sizes' epochs (both sides)")
    ap.add_argument("--train-prompts", type=int)
    ap.add_argument("--bench-prompts", type=int)
    ap.add_argument("--bench-tokens", type=int, help="bench accept's --max-new-tokens")
    ap.add_argument(
        "--gen-tokens", type=int, help="gen's --max-tokens: the longest training answer"
    )
    ap.add_argument(
        "--gen-temperature",
        type=float,
        default=0.0,
        help="the temperature gen answers the training prompts at",
    )
    ap.add_argument(
        "--gen-samples",
        type=int,
        default=1,
        help="gen's --n: answers per training prompt (several, at a temperature > 0)",
    )
    ap.add_argument(
        "--conditions", default=",".join(CONDITIONS), help=f"which of: {', '.join(CONDITIONS)}"
    )
    ap.add_argument(
        "--peer-recipes",
        default=",".join(PEER_RECIPES),
        help=f"which of: {', '.join(PEER_RECIPES)}",
    )
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=FLAGS",
        help="an eagle3kit run with these extra train flags (repeatable)",
    )
    ap.add_argument(
        "--ours-args",
        default="",
        help="extra eagle3kit train flags (one variant); a lone flag needs '=': --ours-args=--auf",
    )
    ap.add_argument("--label", default="default", help="names the --ours-args variant")
    ap.add_argument("--no-peer", action="store_true", help="only the eagle3kit side")
    ap.add_argument("--no-ours", action="store_true", help="only the peer's side")
    ap.add_argument(
        "--same-epochs",
        action="store_true",
        help="eagle3kit trains --epochs like the peer instead of the peer's optimizer steps",
    )
    ap.add_argument(
        "--ours-steps",
        type=int,
        help="eagle3kit's optimizer steps, given (with --no-peer: the peer's, from an earlier run)",
    )
    ap.add_argument(
        "--reuse-drafters",
        action="store_true",
        help="keep drafters (and their bench figures) an earlier run made with the same flags",
    )
    ap.add_argument("--build-venv", action="store_true")
    ap.add_argument(
        "--world-only", action="store_true", help="build the target and the datasets, then stop"
    )
    ap.add_argument(
        "--rebuild-world",
        action="store_true",
        help="train the target and gen the data here, not from the shipped copies",
    )
    ap.add_argument("--json", action="store_true", help="the figures as JSON on stdout")
    a = ap.parse_args()

    sizes = replace(QUICK if a.quick else FULL)
    for name, attr in (
        ("epochs", "epochs"),
        ("train_prompts", "train_prompts"),
        ("bench_prompts", "bench_prompts"),
        ("bench_tokens", "bench_tokens"),
        ("gen_tokens", "gen_tokens"),
    ):
        if getattr(a, name) is not None:
            setattr(sizes, attr, getattr(a, name))
    seeds = [int(s) for s in (a.seeds or ("0,1" if a.quick else "0,1,2")).split(",")]
    conditions = [c.strip() for c in a.conditions.split(",")]
    recipes = [r.strip() for r in a.peer_recipes.split(",")]
    for given, known, flag in (
        (conditions, CONDITIONS, "--conditions"),
        (recipes, PEER_RECIPES, "--peer-recipes"),
    ):
        if unknown := [g for g in given if g not in known]:
            sys.exit(
                f"quality_bench: {flag}: unknown {', '.join(unknown)} (known: {', '.join(known)})"
            )
    variants = {} if a.no_ours else parse_variants(a.variant, a.ours_args, a.label)
    if a.no_ours and a.no_peer:
        sys.exit("quality_bench: --no-ours with --no-peer leaves nothing to train")
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
    target = make_target(root, sizes, not a.rebuild_world)
    train_prompts, bench_prompts = write_prompts(root, sizes)
    data = make_data(
        root,
        target,
        train_prompts,
        sizes,
        a.gen_temperature,
        not a.rebuild_world,
        a.gen_samples,
    )
    data["target"] = {k: v for k, v in tiny_reasoning.load_record(target).items() if k != "losses"}
    if a.world_only:
        print(json.dumps(data, indent=2), file=sys.stderr)
        return
    # speculators holds out 10% (--train-data-ratio 0.9): eagle3kit holds out as many, so
    # both train on as many samples (not the same ones: each picks its own), and evaluates
    # about once an epoch, as speculators does.
    eval_split = max(2, round(0.1 * data["samples"]))
    eval_every = max(1, round(0.9 * data["tokens"] / sizes.batch_tokens))
    trained: dict[str, list[dict]] = {}
    measured: dict[str, dict[str, list[dict]]] = {}

    def measure(name: str, run: dict, seed: int) -> None:
        trained.setdefault(name, []).append(run)
        for condition in conditions:
            result = bench(
                target,
                run["drafter"],
                bench_prompts,
                sizes,
                condition,
                seed,
                Path(run["drafter"]).parent,
                a.reuse_drafters,
            )
            measured.setdefault(name, {}).setdefault(condition, []).append(result)
            log(f"{name} s{seed} {condition}: AL {_al(result['acceptance_length'])}")

    for seed in seeds:
        # The peer first: eagle3kit then takes as many optimizer steps as its first recipe
        # did (speculators packs the same epochs into more batches: 473 against 416 here).
        peer_steps = None
        if peer:
            for recipe in recipes:
                run = train_peer(
                    root, target, Path(data["peer"]), seed, sizes, recipe, a.reuse_drafters
                )
                peer_steps = peer_steps or run["steps"]
                measure(f"speculators [{recipe}]", run, seed)
        for label, extra in variants.items():
            measure(
                f"eagle3kit [{label}]",
                train_ours(
                    root,
                    target,
                    Path(data["hidden"]),
                    seed,
                    sizes,
                    extra,
                    label,
                    eval_split,
                    eval_every,
                    a.reuse_drafters,
                    a.ours_steps or (None if a.same_epochs else peer_steps),
                ),
                seed,
            )

    # bench accept's bucket names, in order of depth (each run names those it had rounds in)
    edges = sorted(
        {
            name
            for runs in measured.values()
            for condition_runs in runs.values()
            for run in condition_runs
            for name in run["depths"]
        },
        key=_bucket_floor,
    )
    ours_names = [f"eagle3kit [{label}]" for label in variants]
    peer_names = [n for n in measured if n not in ours_names]
    summary: dict[str, dict[str, dict]] = {}
    ratios: dict[str, dict[str, dict]] = {}
    lines = []
    for condition in conditions:
        sides = {name: pooled(runs[condition]) for name, runs in measured.items()}
        summary[condition] = sides
        lines += [condition_table(condition, sides, edges), ""]
        # The peer's column is its best recipe here; without a peer, the first variant.
        if peer_names:
            base = max(peer_names, key=lambda n: sides[n]["acceptance_length"] or 0)
        else:
            base = ours_names[0]
        # Every other drafter against it: eagle3kit's, and the peer's other recipes.
        for name in [*ours_names, *peer_names]:
            if name == base:
                continue
            r = paired_ratio(measured[name][condition], measured[base][condition])
            r["against"] = base
            ratios.setdefault(condition, {})[name] = r
            lines.append(
                f"{condition}: {name} / {base}: {r['ratio']:.3f}x "
                f"(paired bootstrap 95% interval {r['low']:.3f}-{r['high']:.3f}, "
                f"{len(seeds)} seeds x {sizes.bench_prompts} prompts)"
            )
        lines.append("")
    lines += [training_table(trained), ""]
    if peer_names and ours_names:
        speed = mean([r["tokens_per_s"] for r in trained[ours_names[0]]]) / mean(
            [r["tokens_per_s"] for n in peer_names for r in trained[n]]
        )
        lines.append(f"train tokens/s {ours_names[0]} / speculators: {speed:.2f}x")
    predicted_error = None
    if "T=0" in summary and ours_names:
        first = trained[ours_names[0]]
        al = summary["T=0"][ours_names[0]]["acceptance_length_per_seed"]
        predicted_error = mean([r["predicted"] / m - 1 for r, m in zip(first, al, strict=True)])
        lines.append(
            f"{ours_names[0]} train's predicted acceptance length "
            f"{mean([r['predicted'] for r in first]):.3f} vs measured at T=0 "
            f"{mean(al):.3f}: {100 * predicted_error:+.1f}% (target within 5%)"
        )
        if sizes.bench_tokens < sizes.gen_tokens:
            # Train predicts over whole held-out answers; a reasoning trace's opening (the
            # problem restated) is harder to draft than what follows, so a measurement cut
            # short is lower for that alone (docs/quality.md).
            lines.append(
                f"  (not the same span: measured over each answer's first {sizes.bench_tokens} "
                f"new tokens, predicted over whole answers of up to {sizes.gen_tokens})"
            )
    wall = round(time.perf_counter() - began, 1)
    lines.append(
        f"{data['samples']} training samples ({data['tokens']} tokens), "
        f"{sizes.bench_prompts} held-out prompts, {sizes.epochs} epochs, seeds "
        f"{','.join(map(str, seeds))}; wall {wall:.0f} s"
    )
    print("\n".join(lines), file=sys.stderr)
    if a.json:
        figures = {
            "sizes": sizes.key(),
            "seeds": seeds,
            "conditions": conditions,
            "variants": variants,
            "peer_recipes": {r: PEER_RECIPES[r] for r in recipes} if peer else {},
            "data": data,
            "sides": summary,
            "ratios": ratios,
            "training": trained,
            "predicted_vs_measured": predicted_error,
            "runs": measured,
            "wall_s": wall,
        }
        print(json.dumps(figures, indent=2, default=str))


if __name__ == "__main__":
    main()

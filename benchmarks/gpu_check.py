"""The one GPU check: train, extract and bench accept on the accelerator, measured and
compared with a CPU run.

On a CUDA device (issue 28) it prints, each as a figure and as a ratio to a baseline measured
in the same run where one exists:

- train: tokens/s and peak GPU memory of eagle3kit's training step (`train.TTTLoss`: the
  TTT-unrolled loss, backward, clipping, AdamW on fp32 master weights under bf16 autocast)
  for a Kimi-K2.5-sized drafter (hidden 7168, target vocabulary 163,840, draft vocabulary
  32,000, train's default TTT steps) at 2K, 8K and 32K tokens per sample, against a plain
  PyTorch loop of the same model and loss (testkit/ttt_reference.py, the quadratic
  attention and logits; "out of memory" where it does not fit), and the model FLOP
  utilisation against the chip's bf16 peak;
- extract: tokens/s of extract's hooked forward (`target.Capture`, what `HfEngine` runs) on
  a mid-size random target built from a config, against the same model's bare forward;
- bench accept: decoding rounds/s of `eagle3kit bench accept` with that target and an
  untrained drafter (rounds/s measures the decoding machinery, not the drafter);
- parity: the same train step on the device (in its training dtype) and on the CPU in
  float32 at toy size: the losses and gradient norms agree within bf16 rounding.

`--smoke` runs every one of these code paths at toy size on the CPU in seconds (the sizes are
parameters of the same functions, not another path); the default test run does that
(tests/test_gpu_check.py). Every figure is one line `name: value [unit]` on stdout, so the
test and a reader find them.

Packages needed beyond the device image (PyTorch, transformers, safetensors, numpy, httpx,
typer, rich): eagle3kit's own dependencies that are not in it, as wheels to carry along:

    pip download --no-deps -d wheels orjson zstandard xxhash httpx-aiohttp aiohttp pyyaml

and on the device `pip install --no-index --no-deps wheels/*.whl` (or PYTHONPATH at the
repository root with those installed).

    python benchmarks/gpu_check.py [--smoke] [--device cuda] [--lengths 2048,8192,32768]
        [--steps 3] [--peak-tflops N] [--skip train,extract,accept,parity]
"""

from __future__ import annotations

import argparse
import math
import resource
import sys
import tempfile
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch
from _common import DATA, with_testkit
from transformers import AutoModelForCausalLM, LlamaConfig

from eagle3kit._options import OutputOptions
from eagle3kit.bench import AcceptConfig, run_accept
from eagle3kit.checkpoints import save_drafter
from eagle3kit.model import DrafterConfig, Eagle3Drafter, build_vocab
from eagle3kit.target import Capture
from eagle3kit.tiny import make_target, make_tokenizer, stdlib_docstrings
from eagle3kit.train import TargetBatch, TargetHead, TrainConfig, TTTLoss, step_counts

with_testkit()

from ttt_reference import quadratic_loss  # noqa: E402  (the plain PyTorch loop's loss)

PROMPTS = [DATA / "prompts/eagle/mt_bench/question.jsonl"]
# Dense bf16 tensor-core peaks (TFLOP/s) by device name; --peak-tflops for any other chip.
BF16_PEAK = {
    "H200": 989.0,
    "H100": 989.0,
    "H800": 989.0,
    "A100": 312.0,
    "L40S": 362.0,
    "B200": 2250.0,
}


def _train_default(name: str) -> Any:
    """The default of train's option `name` (what `eagle3kit train` runs without the flag)."""
    return next(f.default for f in fields(TrainConfig) if f.name == name)


TTT_STEPS: int = _train_default("ttt_steps")
TTT_DECAY: float = _train_default("ttt_decay")
"""train's default unroll and step-loss decay."""


@dataclass(frozen=True)
class Sizes:
    """Every size the check uses: the full run's, or --smoke's toy ones."""

    hidden: int = 7168
    heads: int = 56
    intermediate: int = 18432
    target_vocab: int = 163_840
    draft_vocab: int = 32_000
    ttt_steps: int = TTT_STEPS
    lengths: tuple[int, ...] = (2048, 8192, 32768)
    steps: int = 3
    # The mid-size target (about 3B parameters) for extract and bench accept.
    target_hidden: int = 3072
    target_layers: int = 28
    target_heads: int = 24
    target_intermediate: int = 8192
    extract_batch: int = 4
    extract_len: int = 1024
    accept_prompts: int = 4
    accept_new_tokens: int = 64
    # The toy size of the device-against-CPU comparison.
    parity_hidden: int = 128
    parity_len: int = 96


SMOKE = Sizes(
    hidden=64,
    heads=2,
    intermediate=128,
    target_vocab=512,
    draft_vocab=128,
    lengths=(64, 128),
    steps=1,
    target_hidden=64,
    target_layers=4,
    target_heads=2,
    target_intermediate=128,
    extract_batch=2,
    extract_len=32,
    accept_prompts=1,
    accept_new_tokens=8,
    parity_hidden=64,
    parity_len=48,
)


def say(name: str, value: float | str, unit: str = "") -> None:
    """One figure, `name: value unit`, on stdout."""
    text = f"{value:.4g}" if isinstance(value, float) else str(value)
    print(f"{name}: {text}{' ' + unit if unit else ''}", flush=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_mb(device: torch.device) -> float:
    """Peak GPU memory allocated since the last reset, or the process's peak RSS on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# Train --------------------------------------------------------------------------------------
class TrainSetup:
    """A drafter with fp32 master weights, its frozen target head, AdamW and one batch."""

    def __init__(self, s: Sizes, hidden: int, length: int, device: torch.device) -> None:
        gen = torch.Generator().manual_seed(0)
        heads = max(1, hidden // (s.hidden // s.heads))
        target = LlamaConfig(
            vocab_size=s.target_vocab,
            hidden_size=hidden,
            intermediate_size=s.intermediate * hidden // s.hidden,
            num_hidden_layers=8,
            num_attention_heads=heads,
            num_key_value_heads=heads,
        )
        vocab = build_vocab(
            torch.randint(0, 1000, (s.target_vocab,), generator=gen).numpy(), s.draft_vocab
        )
        torch.manual_seed(0)
        drafter = Eagle3Drafter(DrafterConfig.from_target(target, draft_vocab_size=s.draft_vocab))
        drafter.set_vocab(torch.from_numpy(vocab.d2t), torch.from_numpy(vocab.t2d))
        weights = [torch.randn(s.target_vocab, hidden, generator=gen) * 0.02 for _ in range(2)]
        drafter.load_target_embedding(weights[0])
        self.drafter = drafter.to(device)
        # The frozen target head in bf16 on a GPU (as train loads the target), fp32 on CPU.
        head_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        self.head = TargetHead(
            weights[0].to(device, head_dtype),
            torch.nn.Identity(),
            weights[1].to(device, head_dtype),
        )
        normed = torch.randn(1, length, hidden, generator=gen).to(device, head_dtype)
        ids = torch.randint(0, s.target_vocab, (1, length), generator=gen).to(device)
        mask = torch.ones(1, length, dtype=torch.bool, device=device)
        mask[:, : min(64, length // 4)] = False  # a prompt
        aux = torch.randn(1, length, 3 * hidden, generator=gen).to(device)
        self.batch = TargetBatch(
            ids, mask, torch.tensor([length], device=device), aux, normed, self.head.argmax(normed)
        )
        self.params = self.drafter.trainable_parameters()
        self.optimizer = torch.optim.AdamW(self.params, lr=1e-4, betas=(0.9, 0.95))
        self.counts = step_counts(self.batch, self.drafter.t2d, s.ttt_steps)
        self.loss = TTTLoss(self.drafter, self.head, s.ttt_steps, TTT_DECAY)
        self.steps = s.ttt_steps

    def step(self, impl: str, autocast: torch.dtype | None) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step: (loss, gradient norm), left on the device."""
        if impl == "eagle3kit":
            loss = self.loss(self.batch, self.counts, autocast)[0]
        else:
            loss = quadratic_loss(
                self.drafter, self.head, self.batch, self.counts, self.steps, 0.8, autocast
            )[0]
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.params, 0.5)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach(), norm


def train_flops(s: Sizes, length: int) -> float:
    """Model FLOPs of one training step: 6 per trainable weight per token per TTT step (the
    decoder layer, the draft head), the fc projection once, 2 per frozen target-head weight
    per token (the teacher's distribution) and the causal attention's scores and values."""
    h, steps = s.hidden, s.ttt_steps
    layer = 4 * h * h + 2 * h * h + 3 * h * s.intermediate  # qkv+o (input 2h), MLP
    trained = steps * (layer + h * s.draft_vocab) + 3 * h * h
    attention = steps * 2 * 2 * length * h  # QK^T and AV, causal half of 2x
    return length * (6 * trained + 3 * attention + 2 * h * s.target_vocab)


def measure_train(
    s: Sizes, length: int, impl: str, device: torch.device, autocast: torch.dtype | None
) -> dict[str, float]:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    setup = TrainSetup(s, s.hidden, length, device)
    setup.step(impl, autocast)  # warm-up: kernels, allocator, AdamW state
    sync(device)
    began = time.perf_counter()
    for _ in range(s.steps):
        loss, _ = setup.step(impl, autocast)
    sync(device)
    seconds = (time.perf_counter() - began) / s.steps
    out = {"tokens_per_s": length / seconds, "peak_mb": peak_mb(device), "loss": float(loss)}
    del setup
    return out


def check_train(s: Sizes, device: torch.device, peak_tflops: float) -> None:
    autocast = torch.bfloat16 if device.type == "cuda" else None
    say(
        "train drafter",
        f"hidden {s.hidden}, target vocab {s.target_vocab}, "
        f"draft vocab {s.draft_vocab}, {s.ttt_steps} TTT steps, {device}",
    )
    for length in s.lengths:
        ours = measure_train(s, length, "eagle3kit", device, autocast)
        say(f"train {length} tokens_per_s", ours["tokens_per_s"], "tok/s")
        say(f"train {length} peak_mb", ours["peak_mb"], "MB")
        mfu = ours["tokens_per_s"] * train_flops(s, length) / length / (peak_tflops * 1e12)
        say(f"train {length} mfu", mfu)
        try:
            plain = measure_train(s, length, "plain", device, autocast)
        except torch.OutOfMemoryError:
            say(f"train {length} plain", "out of memory")
            continue
        say(f"train {length} plain_tokens_per_s", plain["tokens_per_s"], "tok/s")
        say(f"train {length} plain_peak_mb", plain["peak_mb"], "MB")
        say(f"train {length} speed_ratio", ours["tokens_per_s"] / plain["tokens_per_s"])
        say(f"train {length} memory_ratio", ours["peak_mb"] / plain["peak_mb"])


# Extract and bench accept ---------------------------------------------------------------------
def build_target(s: Sizes, work: Path) -> Path:
    make_tokenizer(work / "tok", corpus=stdlib_docstrings(20_000))
    return make_target(
        work / "target",
        work / "tok",
        hidden_size=s.target_hidden,
        num_layers=s.target_layers,
        heads=s.target_heads,
        kv_heads=max(1, s.target_heads // 3),
        head_dim=s.target_hidden // s.target_heads,
        intermediate_size=s.target_intermediate,
        max_positions=max(2048, s.extract_len),
        seed=3,
    )


def check_extract(s: Sizes, target: Path, device: torch.device) -> None:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(target, dtype=dtype).to(device).eval()
    layers = [1, s.target_layers // 2, s.target_layers - 2]
    capture = Capture(model, layers, who="gpu_check")
    ids = torch.randint(0, model.config.vocab_size, (s.extract_batch, s.extract_len), device=device)

    def timed(call: Any) -> float:
        with torch.no_grad():
            call()  # warm-up
            sync(device)
            began = time.perf_counter()
            for _ in range(max(s.steps, 2)):
                call()
            sync(device)
        return ids.numel() * max(s.steps, 2) / (time.perf_counter() - began)

    params = sum(p.numel() for p in model.parameters())
    say(
        "extract target",
        f"{params / 1e9:.2f}B parameters, {s.target_layers} layers, "
        f"hidden {s.target_hidden}, {dtype}",
    )
    bare = timed(lambda: model(input_ids=ids))
    hooked = timed(lambda: capture(ids))
    say("extract tokens_per_s", hooked, "tok/s")
    say("extract bare_forward_tokens_per_s", bare, "tok/s")
    say("extract ratio", hooked / bare)


def check_accept(s: Sizes, target: Path, work: Path, device: torch.device) -> None:
    model = AutoModelForCausalLM.from_pretrained(target)
    torch.manual_seed(2)
    drafter = Eagle3Drafter(DrafterConfig.from_target(model.config))
    drafter.load_target_embedding(model.get_input_embeddings().weight)
    save_drafter(drafter, work / "drafter")
    del model
    report = run_accept(
        AcceptConfig(
            target,
            work / "drafter",
            PROMPTS,
            max_new_tokens=s.accept_new_tokens,
            max_samples=s.accept_prompts,
            device=str(device),
            dtype="auto",
            output=OutputOptions(quiet=True),
        )
    )
    rounds = sum(len(p.rounds) for p in report.prompts)
    seconds = sum(p.spec_seconds for p in report.prompts)
    say("accept rounds_per_s", rounds / seconds, "rounds/s")
    say("accept spec_tokens_per_s", report.spec_tokens_per_s, "tok/s")
    say("accept plain_tokens_per_s", report.plain_tokens_per_s, "tok/s")
    say("accept speedup", report.speedup)


# The device against the CPU ------------------------------------------------------------------
def check_parity(s: Sizes, device: torch.device) -> bool:
    """The same two train steps at toy size on the device, in train's dtype there (bf16
    autocast on a GPU; bf16 autocast on the CPU under --smoke, so the tolerance is
    exercised), and on the CPU in float32: losses and gradient norms within bf16 rounding."""
    toy = replace(s, lengths=(s.parity_len,))
    runs = []
    for where, autocast in ((device, torch.bfloat16), (torch.device("cpu"), None)):
        setup = TrainSetup(toy, s.parity_hidden, s.parity_len, where)
        # The head in fp32 on both sides: the comparison is of the step, not the head's dtype.
        setup.head = TargetHead(
            *(t.float() for t in (setup.head.embedding,)),
            torch.nn.Identity(),
            setup.head.lm_head.float(),
        )
        setup.loss = TTTLoss(setup.drafter, setup.head, toy.ttt_steps, TTT_DECAY)
        setup.batch = replace(setup.batch, normed=setup.batch.normed.float())
        runs.append([tuple(float(x) for x in setup.step("eagle3kit", autocast)) for _ in range(2)])
    worst = max(
        abs(a - b) / max(abs(b), 1e-6)
        for d, c in zip(*runs, strict=True)
        for a, b in zip(d, c, strict=True)
    )
    tolerance = 0.05  # bf16 keeps 8 bits of mantissa (2^-8 per rounding), over a step's sums
    say("parity worst_relative_difference", worst)
    say("parity tolerance", tolerance)
    ok = math.isfinite(worst) and worst <= tolerance
    say("parity", "agree" if ok else "DISAGREE")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="every path at toy size on the CPU (the default test run's)",
    )
    parser.add_argument("--device", default=None, help="default: cuda if present, else cpu")
    parser.add_argument("--lengths", help="train tokens per sample, e.g. 2048,8192,32768")
    parser.add_argument("--steps", type=int, help="timed steps per measurement")
    parser.add_argument(
        "--peak-tflops",
        type=float,
        help="the chip's dense bf16 peak (default: from the device's name; "
        "1 on a CPU, a nominal figure)",
    )
    parser.add_argument("--skip", default="", help="comma-separated: train,extract,accept,parity")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sizes = SMOKE if args.smoke else Sizes()
    if args.lengths:
        sizes = replace(sizes, lengths=tuple(int(x) for x in args.lengths.split(",")))
    if args.steps:
        sizes = replace(sizes, steps=args.steps)
    device = torch.device(
        args.device or ("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    )
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = args.peak_tflops or next((v for k, v in BF16_PEAK.items() if k in name), 1.0)
    say("device", f"{name}, bf16 peak {peak:g} TFLOP/s")
    skip = set(filter(None, args.skip.split(",")))
    ok = True
    began = time.perf_counter()
    if "train" not in skip:
        check_train(sizes, device, peak)
    if "parity" not in skip:
        ok = check_parity(sizes, device)
    if not {"extract", "accept"} <= skip:
        with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
            target = build_target(sizes, Path(tmp))
            if "extract" not in skip:
                check_extract(sizes, target, device)
                if device.type == "cuda":
                    torch.cuda.empty_cache()  # the extract model is gone: its cache too
            if "accept" not in skip:
                check_accept(sizes, target, Path(tmp), device)
    say("seconds", time.perf_counter() - began, "s")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

"""benchmarks/gpu_check.py on the CPU at toy size (`--smoke`, the same code paths as the
device run), and the CUDA-specific paths as `gpu` tests, skipped with one reason without a
CUDA device (issue 28)."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_check.py"
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_smoke_prints_every_figure_finite(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--threads", "1"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    figures = dict(line.split(": ", 1) for line in done.stdout.splitlines() if ": " in line)
    wanted = [
        f"train {n} {what}"
        for n in (64, 128)
        for what in (
            "tokens_per_s",
            "peak_mb",
            "mfu",
            "plain_tokens_per_s",
            "plain_peak_mb",
            "speed_ratio",
            "memory_ratio",
        )
    ]
    wanted += [
        "extract tokens_per_s",
        "extract bare_forward_tokens_per_s",
        "extract ratio",
        "accept rounds_per_s",
        "accept spec_tokens_per_s",
        "accept speedup",
        "parity worst_relative_difference",
    ]
    for name in wanted:
        assert name in figures, (name, done.stdout)
        value = float(re.split(r"\s", figures[name])[0])
        assert math.isfinite(value) and value >= 0, (name, figures[name])
    assert figures["parity"] == "agree"


@pytest.mark.gpu
@needs_cuda
def test_gpu_check_runs_on_cuda_at_toy_size(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--device", "cuda"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "parity: agree" in done.stdout


@pytest.mark.gpu
@needs_cuda
def test_bf16_autocast_steps_on_cuda_keep_fp32_master_weights() -> None:
    sys.path.insert(0, str(SCRIPT.parent))
    from gpu_check import SMOKE, TrainSetup

    setup = TrainSetup(SMOKE, SMOKE.hidden, 64, torch.device("cuda"))
    before = [p.detach().clone() for p in setup.params]
    loss, norm = setup.step("eagle3kit", torch.bfloat16)
    assert torch.isfinite(loss) and torch.isfinite(norm)
    for p, old in zip(setup.params, before, strict=True):
        assert p.dtype == torch.float32 and p.device.type == "cuda"
        assert not torch.equal(p.detach(), old)  # the step moved the master weights

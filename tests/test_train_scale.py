"""train at scale: whole long samples, signals and interval checkpoints, FSDP.

Real subprocesses get real signals (SIGTERM, SIGINT, SIGUSR1, SIGKILL); the distributed
tests run `torchrun` with 2 gloo processes on CPU. The tiny target and datasets are
conftest's `train_world`.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import prewarmed
import pytest
import torch
from tiny_train import (
    close_weights,
    config,
    env,
    losses,
    metrics,
    torchrun,
    train_cmd,
    weights,
    write_tokens,
)

from eagle3kit._ui import OutputOptions
from eagle3kit.train import run

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "eagle3kit", *args]


def wait_for_steps(proc: subprocess.Popen, run_dir: Path, n: int, timeout: float = 300) -> None:
    """Until metrics.jsonl records step n (the run must still be going)."""
    deadline = time.monotonic() + timeout
    while True:
        path = run_dir / "metrics.jsonl"
        done = [m for m in metrics(run_dir) if "loss" in m] if path.is_file() else []
        if len(done) >= n:
            return
        assert proc.poll() is None, f"the run ended before step {n}"
        assert time.monotonic() < deadline, f"no step {n} within {timeout}s"
        time.sleep(0.01)


def checkpoints(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir())


def rerun(printed: str) -> subprocess.CompletedProcess:
    """The command a stopped run printed, run as it says."""
    args = shlex.split(printed)
    if args[0] == "eagle3kit":
        args = [sys.executable, "-m", "eagle3kit", *args[1:]]
    elif args[0] == "torchrun":
        args = [sys.executable, "-m", "torch.distributed.run", *args[1:]]
    return subprocess.run(args, capture_output=True, text=True, env=env(), timeout=600)


def printed_command(stderr: str) -> str:
    lines = stderr.splitlines()
    at = next(i for i, line in enumerate(lines) if line.rstrip().endswith("Continue with:"))
    return lines[at + 1].strip()


# Full-length samples ------------------------------------------------------------------------
def test_whole_samples_by_default_and_the_summary_counts_the_cut(train_world, tmp_path, capsys):
    """No 2048 default: a 2,100-token sample trains whole under a target of 4,096
    positions; --max-len cuts samples and the summary says by how much."""
    from eagle3kit.tiny import make_target

    target = make_target(
        tmp_path / "target", train_world["target"], hidden_size=32, seed=2, max_positions=4096
    )
    rng = np.random.default_rng(0)
    tokens = write_tokens(tmp_path / "tokens", [rng.integers(5, 300, 2100).tolist()], prompt=8)
    shown = OutputOptions(no_progress=True)
    whole = run(
        config(
            {**train_world, "target": target},
            tokens,
            tmp_path / "whole",
            online=True,
            max_steps=1,
            eval_split=0,
            batch_tokens=4096,
            output=shown,
        )
    )
    assert whole.tokens == 2100
    assert whole.metrics["long_samples"]["tokens_cut"] == 0
    assert whole.metrics["long_samples"]["max_len"] == 4096
    assert "tokens cut      0 of 2,100 (0.00%; 0 samples truncated, 0 dropped; limit 4,096)" in (
        capsys.readouterr().err
    )
    cut = run(
        config(
            train_world,
            train_world["hidden"],
            tmp_path / "cut",
            max_steps=1,
            max_len=24,
            eval_split=0,
            output=shown,
        )
    )
    long = cut.metrics["long_samples"]
    assert long["truncated"] > 0 and long["tokens_cut"] > 0
    assert (
        f"{long['tokens_cut']:,} of {long['tokens']:,} "
        f"({100 * long['tokens_cut'] / long['tokens']:.2f}%; {long['truncated']} samples "
        f"truncated, 0 dropped; limit 24)"
    ) in capsys.readouterr().err
    run_json = json.loads((tmp_path / "cut" / "run.json").read_text())
    assert run_json["plan"]["long_samples"] == long


def _peak_rss_of(cmd: list[str], logs: Path) -> tuple[int, float, str, str]:
    """(exit status, peak resident set in GB, stdout, stderr) of a child process (os.wait4:
    its own figure, not the largest of this test process's children)."""
    with open(logs / "out", "w") as out, open(logs / "err", "w") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env())
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return (
        proc.returncode,
        usage.ru_maxrss / (1 << 20),
        (logs / "out").read_text(),
        (logs / "err").read_text(),
    )


@pytest.mark.slow
@pytest.mark.timeout(1800)  # subprocesses and torchrun launches, on busy cores
def test_a_16k_token_sample_trains_on_cpu_within_24_gb(train_world, tmp_path):
    """One whole 16,384-token sample, online, through the CLI: the quadratic attention
    would need ~4 GB per score matrix, several per training-time-test step."""
    from eagle3kit.tiny import make_target

    target = make_target(
        tmp_path / "target", train_world["target"], hidden_size=32, seed=3, max_positions=32768
    )
    rng = np.random.default_rng(1)
    tokens = write_tokens(tmp_path / "tokens", [rng.integers(5, 300, 16384).tolist()], prompt=256)
    status, peak_gb, stdout, stderr = _peak_rss_of(
        cli(
            "train",
            str(tokens),
            str(tmp_path / "run"),
            "--target",
            str(target),
            "--online",
            "--device",
            "cpu",
            "--max-steps",
            "1",
            "--eval-split",
            "0",
            "--draft-vocab",
            "200",
            "--batch-tokens",
            "16384",
            "--no-progress",
            "--json",
        ),
        tmp_path,
    )
    assert status == 0, stderr[-3000:]
    result = json.loads(stdout)
    assert result["tokens"] == 16384 and result["metrics"]["long_samples"]["tokens_cut"] == 0
    print(f"16K-token sample: peak RSS {peak_gb:.2f} GB")
    assert peak_gb < 24


# Interval checkpoints ---------------------------------------------------------------------------
def test_checkpoint_interval_writes_checkpoints_between_step_counts(train_world, tmp_path):
    run(
        config(
            train_world,
            train_world["hidden"],
            tmp_path / "often",
            checkpoint_every=1000,
            checkpoint_interval=1e-9,
            keep=10,
        )
    )
    assert checkpoints(tmp_path / "often") == [f"step-{i:08d}" for i in range(1, 5)]
    run(
        config(
            train_world, train_world["hidden"], tmp_path / "rarely", checkpoint_every=1000, keep=10
        )
    )
    assert checkpoints(tmp_path / "rarely") == ["step-00000004"]  # the last step's only


# Signals ---------------------------------------------------------------------------------------
STOP_SCRIPT = """
import sys, time
from eagle3kit.train.stopping import StopRequests
with StopRequests(lambda sig: print("first", sig.name, flush=True)) as stop:
    print("ready", flush=True)
    while True:
        time.sleep(0.01)
"""


def test_a_repeated_signal_within_a_second_is_one_request_and_later_aborts():
    """A scheduler's signal that reaches a worker twice (directly and forwarded by torchrun)
    is one request; a second one a moment later aborts with the signal's own status."""
    proc = subprocess.Popen(
        [sys.executable, "-c", STOP_SCRIPT], stdout=subprocess.PIPE, text=True, env=env()
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    assert proc.stdout.readline().strip() == "first SIGTERM"
    time.sleep(0.5)
    assert proc.poll() is None
    time.sleep(0.7)
    proc.send_signal(signal.SIGUSR1)
    assert proc.wait(timeout=30) == -signal.SIGUSR1


def _stop_run(
    train_world, tmp_path, sig: signal.Signals, at_step: int, total: int = 24
) -> tuple[subprocess.CompletedProcess, int]:
    """The CLI training `total` steps, sent `sig` once step `at_step` is logged; returns the
    finished process and the step it stopped after."""
    out = tmp_path / "cut"
    cmd = cli(
        *train_cmd(
            train_world,
            out,
            "--max-steps",
            str(total),
            "--eval-every",
            "0",
            "--checkpoint-every",
            "1000",
        )
    )
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env()
    )
    wait_for_steps(proc, out, at_step)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=300)
    done = len(losses(out))
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr), done


def test_sigterm_finishes_the_step_checkpoints_it_and_prints_the_command(train_world, tmp_path):
    stopped, done = _stop_run(train_world, tmp_path, signal.SIGTERM, 2)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert 2 <= done < 24
    assert "SIGTERM: finishing this step, then writing a checkpoint" in stopped.stderr
    assert f"stopped by SIGTERM after step {done} of 24" in stopped.stderr
    assert "Traceback" not in stopped.stderr
    assert checkpoints(tmp_path / "cut") == [f"step-{done:08d}"]
    assert printed_command(stopped.stderr) == shlex.join(
        [
            "eagle3kit",
            *train_cmd(
                train_world,
                tmp_path / "cut",
                "--max-steps",
                "24",
                "--eval-every",
                "0",
                "--checkpoint-every",
                "1000",
            ),
        ]
    )


@pytest.mark.slow
def test_sigterm_checkpoints_the_step_and_the_printed_command_ends_bitwise_equal(
    train_world, tmp_path
):
    whole = run(
        config(
            train_world,
            train_world["hidden"],
            tmp_path / "whole",
            max_steps=24,
            eval_every=0,
            checkpoint_every=1000,
        )
    )
    at = random.Random().randint(2, 10)
    stopped, done = _stop_run(train_world, tmp_path, signal.SIGTERM, at)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert at <= done < 24
    assert f"stopped by SIGTERM after step {done} of 24" in stopped.stderr
    assert "Traceback" not in stopped.stderr
    assert checkpoints(tmp_path / "cut") == [f"step-{done:08d}"]
    command = printed_command(stopped.stderr)
    assert command.startswith("eagle3kit train ") and str(tmp_path / "cut") in command
    finished = rerun(command)
    assert finished.returncode == 0, finished.stderr[-3000:]
    a, b = weights(tmp_path / "whole"), weights(tmp_path / "cut")
    assert all(torch.equal(a[k], b[k]) for k in a)  # bitwise, CPU fp32
    assert losses(tmp_path / "cut") == losses(tmp_path / "whole")
    assert whole.steps == 24


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "status"), [(signal.SIGINT, 130), (signal.SIGUSR1, 143)])
def test_sigint_and_sigusr1_stop_with_a_checkpoint(train_world, tmp_path, sig, status):
    stopped, done = _stop_run(train_world, tmp_path, sig, 3)
    assert stopped.returncode == status, stopped.stderr[-3000:]
    assert f"stopped by {sig.name} after step {done} of 24" in stopped.stderr
    assert checkpoints(tmp_path / "cut") == [f"step-{done:08d}"]
    finished = rerun(printed_command(stopped.stderr))
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert len(losses(tmp_path / "cut")) == 24


@pytest.mark.slow
@pytest.mark.timeout(1800)  # subprocesses and torchrun launches, on busy cores
def test_sigkill_during_a_checkpoint_write_leaves_the_previous_one(train_world, tmp_path):
    """Killed while a checkpoint is being written (its temp directory exists), the run
    still has the one before, whole; resuming ends where an uninterrupted run does."""
    whole = tmp_path / "whole"
    run(
        config(
            train_world,
            train_world["hidden"],
            whole,
            max_steps=16,
            eval_every=0,
            checkpoint_every=1,
        )
    )
    out = tmp_path / "cut"
    args = train_cmd(
        train_world, out, "--max-steps", "16", "--eval-every", "0", "--checkpoint-every", "1"
    )
    # Each trial's command forks from the worker's pre-warmed interpreter (testkit/prewarmed.py):
    # a fresh one spent most of a trial importing torch; prewarmed.kill SIGKILLs the command.
    cmd = [*prewarmed.argv(), *args]
    mid_write = 0
    for _ in range(12):
        if (out / "drafter").is_dir() and len(losses(out)) >= 16:
            break
        proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env()
        )
        # Kill inside the second checkpoint write of this run: one commits first, so every
        # trial gets further and a previous checkpoint always exists.
        start = max(checkpoints(out), default="") if (out / "checkpoints").is_dir() else ""
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            # A millisecond's sleep still lands inside a write (tens of milliseconds here) and
            # leaves the core to the run: spinning took it from the run on 2 cores.
            time.sleep(0.001)
            if not (out / "checkpoints").is_dir():
                continue
            names = checkpoints(out)
            committed = [n for n in names if n.startswith("step-")]
            if any(n.endswith(".tmp") for n in names) and max(committed, default="") > start:
                prewarmed.kill(proc)
                break
        proc.wait()
        if list((out / "checkpoints").glob(".step-*.tmp")):
            mid_write += 1
        steps = [p for p in (out / "checkpoints").iterdir() if p.name.startswith("step-")]
        newest = max(steps, key=lambda p: p.name)
        # The newest committed checkpoint is whole: every file there and readable.
        assert {p.name for p in newest.iterdir()} >= {
            "model.safetensors",
            "optimizer.pt",
            "scheduler.pt",
            "state.json",
            "rng-rank0.safetensors",
        }
        json.loads((newest / "state.json").read_text())
        torch.load(newest / "optimizer.pt", weights_only=True)
    assert mid_write >= 1, "no kill landed inside a checkpoint write"
    done = subprocess.run(cli(*args), capture_output=True, text=True, env=env(), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not list((out / "checkpoints").glob(".step-*.tmp"))
    a, b = weights(whole), weights(out)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert losses(out) == losses(whole)


# torchrun ------------------------------------------------------------------------------------


def _workers(launcher: int) -> dict[int, int]:
    """RANK -> pid of the launcher's worker processes, read from /proc."""
    found: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid != launcher:
                continue
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        for item in environ:
            if item.startswith(b"RANK="):
                found[int(item[5:])] = int(entry.name)
    return found


@pytest.mark.slow
@pytest.mark.timeout(1800)  # subprocesses and torchrun launches, on busy cores
def test_a_signal_to_one_rank_stops_both_at_the_same_step(train_world, tmp_path):
    one = tmp_path / "one"
    run(
        config(
            train_world,
            train_world["hidden"],
            one,
            max_steps=24,
            grad_accum=2,
            batch_tokens=128,
            eval_every=0,
            checkpoint_every=1000,
        )
    )
    out = tmp_path / "two"
    cmd = torchrun(
        *train_cmd(
            train_world,
            out,
            "--max-steps",
            "24",
            "--batch-tokens",
            "128",
            "--eval-every",
            "0",
            "--checkpoint-every",
            "1000",
        )
    )
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env()
    )
    wait_for_steps(proc, out, 3)
    workers = _workers(proc.pid)
    assert sorted(workers) == [0, 1]
    os.kill(workers[1], signal.SIGTERM)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode != 0  # torchrun reports its workers' 143 as a failure
    done = len(losses(out))
    assert 3 <= done < 24
    assert f"stopped by SIGTERM after step {done} of 24" in stderr
    # One checkpoint, that step's, which both ranks wrote into.
    assert checkpoints(out) == [f"step-{done:08d}"]
    step_dir = out / "checkpoints" / f"step-{done:08d}"
    written = {p.name for p in step_dir.iterdir()}
    assert {"rng-rank0.safetensors", "rng-rank1.safetensors"} <= written
    command = printed_command(stderr)
    assert command.startswith("torchrun --nnodes 1 --nproc_per_node 2 -m eagle3kit train")
    finished = subprocess.run(
        torchrun(*shlex.split(command)[7:]), capture_output=True, text=True, env=env(), timeout=600
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    np.testing.assert_allclose(losses(out), losses(one), rtol=1e-5)


# FSDP --------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(1800)  # subprocesses and torchrun launches, on busy cores
def test_fsdp_takes_the_steps_of_one_process_and_resumes_across_ddp(train_world, tmp_path):
    """--fsdp with 2 processes: the losses of 1 process with --grad-accum 2 (1e-5), and a
    checkpoint written under FSDP resumes under DDP, and one written under DDP under
    FSDP, to the same end."""
    one = tmp_path / "one"
    run(
        config(train_world, train_world["hidden"], one, max_steps=4, grad_accum=2, batch_tokens=128)
    )
    flags = (
        "--max-steps",
        "4",
        "--batch-tokens",
        "128",
        "--eval-every",
        "2",
        "--checkpoint-every",
        "2",
    )
    launches = [("fsdp", ("--fsdp",)), ("ddp", ())]
    for name, extra in launches:
        proc = subprocess.run(
            torchrun(*train_cmd(train_world, tmp_path / name, *flags, *extra)),
            capture_output=True,
            text=True,
            env=env(),
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert json.loads((tmp_path / name / "run.json").read_text())["parallel"] == name
        np.testing.assert_allclose(losses(tmp_path / name), losses(one), rtol=1e-5)
        close_weights(tmp_path / name, one)
    fsdp_eval = json.loads((tmp_path / "fsdp" / "drafter" / "config.json").read_text())
    assert (
        fsdp_eval["eagle3kit"]["eval"]["tried"]
        == json.loads((one / "drafter" / "config.json").read_text())["eagle3kit"]["eval"]["tried"]
    )
    # Each resumed from its step-2 checkpoint under the other scheme.
    for name, extra in (("fsdp", ()), ("ddp", ("--fsdp",))):
        run_dir = tmp_path / name
        shutil.rmtree(run_dir / "checkpoints" / "step-00000004")
        shutil.rmtree(run_dir / "drafter")
        proc = subprocess.run(
            torchrun(*train_cmd(train_world, run_dir, *flags, *extra)),
            capture_output=True,
            text=True,
            env=env(),
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "resuming after step 2" in proc.stderr
        assert json.loads((run_dir / "run.json").read_text())["parallel"] == (
            "ddp" if name == "fsdp" else "fsdp"
        )
        np.testing.assert_allclose(losses(run_dir), losses(one), rtol=1e-5)
        # the step-4 weights (drafter/ holds the best step, and the resumed run forgot the
        # steps before its checkpoint along with the drafter/ this test deleted)
        from safetensors.torch import load_file

        last = Path("checkpoints") / "step-00000004" / "model.safetensors"
        wa, wb = load_file(str(run_dir / last)), load_file(str(one / last))
        assert wa.keys() == wb.keys()
        for k in wa:
            torch.testing.assert_close(wa[k], wb[k], rtol=1e-4, atol=1e-5, msg=k)

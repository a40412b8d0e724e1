"""train keeps the checkpoint that serves best: drafter/ is the evaluated step with the highest
held-out predicted acceptance length (--drafter-step best, the default), run.json and `info`
say which step and why, export takes it, and a stopped and resumed run keeps the record.

A later step is made worse honestly and deterministically: a learning rate that keeps growing
(a constant schedule whose linear warm-up of 100 steps runs to --lr 0.2, so step s trains at
0.002 s) improves the drafter for a few steps, then wrecks it. On CPU in fp32 the steps are
bitwise reproducible (test_train's resume tests), so every run of the same command takes the
same steps and the same evaluations. The tiny target and datasets are conftest's `train_world`;
every run is a real `eagle3kit` process.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import prewarmed
import pytest
import torch
from safetensors.torch import load_file
from tiny_train import env, metrics

from eagle3kit.train import selection

pytestmark = pytest.mark.usefixtures("one_torch_thread")
AL = "predicted_acceptance_length"
STEPS = 14
GROWING_LR = ("--lr", "0.2", "--warmup", "100", "--schedule", "constant")


def train(train_world: dict, out: Path, *extra: str) -> list[str]:
    """The train command's arguments (after `eagle3kit`)."""
    return [
        "train",
        str(train_world["hidden"]),
        str(out),
        "--target",
        str(train_world["target"]),
        "--device",
        "cpu",
        "--batch-tokens",
        "256",
        "--draft-vocab",
        "200",
        "--eval-split",
        "4",
        "--eval-every",
        "2",
        "--checkpoint-every",
        "2",
        "--no-progress",
        *GROWING_LR,
        *extra,
    ]


def eagle3kit(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*prewarmed.argv(), *args],
        capture_output=True,
        text=True,
        env=env(),
        timeout=timeout,
    )


def finished(cmd: list[str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [*prewarmed.argv(), *cmd], capture_output=True, text=True, env=env(), timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def evaluations(run_dir: Path) -> dict[int, float]:
    """The held-out AL metrics.jsonl recorded at each evaluation, by step."""
    return {m["step"]: m["eval"][AL] for m in metrics(run_dir) if "eval" in m}


def tensors(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(str(directory / "model.safetensors"))


def same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    """Byte for byte: the same names, dtypes, shapes and bits."""
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype
        and a[k].shape == b[k].shape
        and a[k].contiguous().view(torch.uint8).equal(b[k].contiguous().view(torch.uint8))
        for k in a
    )


def drafter_block(directory: Path) -> dict:
    return json.loads((directory / "config.json").read_text())["eagle3kit"]


@pytest.fixture(scope="module")
def reference(train_world, tmp_path_factory) -> dict:
    """One uninterrupted run of STEPS steps keeping every checkpoint, the best evaluated step
    read off its metrics.jsonl (the earliest of the highest)."""
    out = tmp_path_factory.mktemp("best") / "run"
    finished(train(train_world, out, "--max-steps", str(STEPS), "--keep", "100"))
    evals = evaluations(out)
    trained = {s: a for s, a in evals.items() if s >= 1}
    best = min(s for s, a in trained.items() if a == max(trained.values()))
    return {"run": out, "evals": evals, "best": best}


# The rule, as functions --------------------------------------------------------------------------
def ev(step: int, al: float) -> dict:
    return {"step": step, AL: al, "k": 3}


def test_the_rule_keeps_the_highest_trained_step_and_the_earlier_on_a_tie() -> None:
    best = None
    for e in (ev(0, 1.9), ev(2, 1.2), ev(4, 1.5), ev(6, 1.5), ev(8, 1.1)):
        if selection.improves(e, best):
            best = e
    assert best == ev(4, 1.5)  # step 0 (untrained) never; 6 ties 4: the earlier stays
    assert selection.better_of(ev(6, 1.5), ev(4, 1.5)) == ev(4, 1.5)
    assert selection.better_of(None, ev(4, 1.5)) == ev(4, 1.5)
    assert selection.better_of(ev(2, 1.6), ev(4, 1.5)) == ev(2, 1.6)
    chosen = selection.record("best", 4, best, ev(8, 1.1), heldout=True)
    assert chosen["step"] == 4 and chosen["best"]["step"] == 4 and chosen["last"]["step"] == 8
    assert chosen["why"] == (
        "the highest held-out predicted AL 1.500 at step 4; the last evaluation has 1.100 at step 8"
    )
    last = selection.record("last", 8, best, ev(8, 1.1), heldout=True)
    assert last["step"] == 8 and "best evaluated step was 4 (1.500)" in last["why"]
    none = selection.record("best", 8, None, None, heldout=False)
    assert none["step"] == 8 and none["why"].startswith("no held-out split (--eval-split 0)")


def test_a_bad_drafter_step_is_one_line_naming_the_flag(train_world, tmp_path):
    proc = eagle3kit(*train(train_world, tmp_path / "run", "--drafter-step", "newest"))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: --drafter-step must be one of best, last (got newest)"
    ]
    assert not (tmp_path / "run").exists()


# A whole run -----------------------------------------------------------------------------------
def test_drafter_is_the_best_evaluated_step_when_a_later_one_is_worse(train_world, reference):
    out, evals, best = reference["run"], reference["evals"], reference["best"]
    assert sorted(evals) == list(range(0, STEPS + 1, 2))  # recorded at every evaluation
    assert 0 < best < STEPS and evals[STEPS] < evals[best]  # the growing lr wrecks it
    # drafter/ is step `best`, byte for byte its checkpoint's weights, not the last step's.
    assert same_tensors(tensors(out / "drafter"), tensors(out / "checkpoints" / f"step-{best:08d}"))
    assert not same_tensors(
        tensors(out / "drafter"), tensors(out / "checkpoints" / f"step-{STEPS:08d}")
    )
    block = drafter_block(out / "drafter")
    assert block["training"]["step"] == best and block["chosen"] == "best"
    run_json = json.loads((out / "run.json").read_text())
    assert block["training"]["ttt_steps"] == run_json["config"]["ttt_steps"]  # export's check
    assert block["eval"]["step"] == best and block["eval"][AL] == evals[best]
    chosen = run_json["selection"]
    assert chosen["rule"] == "best" and chosen["step"] == best
    assert chosen["best"] == {"step": best, AL: round(evals[best], 6), "k": 3}
    assert chosen["last"] == {"step": STEPS, AL: round(evals[STEPS], 6), "k": 3}
    assert chosen["why"] == (
        f"the highest held-out predicted AL {evals[best]:.3f} at step "
        f"{best}; the last evaluation has {evals[STEPS]:.3f} at step "
        f"{STEPS}"
    )


def test_info_says_which_step_and_why(reference):
    out, evals, best = reference["run"], reference["evals"], reference["best"]
    shown = eagle3kit("info", str(out))
    assert shown.returncode == 0, shown.stderr
    lines = [line.strip() for line in shown.stderr.splitlines()]
    assert f"step             {best} (--drafter-step best)" in lines
    assert (
        f"why              the highest held-out predicted AL {evals[best]:.3f} at step "
        f"{best}; the last evaluation has {evals[STEPS]:.3f} at step {STEPS}"
    ) in lines
    assert f"last evaluation  step {STEPS}, held-out AL {round(evals[STEPS], 6)}" in lines
    as_json = json.loads(eagle3kit("info", str(out), "--json").stdout)
    assert as_json["selection"]["step"] == best


def test_export_takes_the_best_and_a_kept_step_on_request(reference, tmp_path):
    out, best = reference["run"], reference["best"]
    done = eagle3kit("export", str(out), str(tmp_path / "best"), "--dtype", "float32")
    assert done.returncode == 0, done.stderr
    assert same_tensors(tensors(tmp_path / "best"), tensors(out / "drafter"))
    provenance = json.loads((tmp_path / "best" / "eagle3kit-export.json").read_text())
    assert provenance["selection"]["step"] == best and provenance["eval"]["step"] == best
    # The last step: its checkpoint folder is a whole checkpoint export reads.
    last = out / "checkpoints" / f"step-{STEPS:08d}"
    done = eagle3kit("export", str(last), str(tmp_path / "last"), "--dtype", "float32")
    assert done.returncode == 0, done.stderr
    assert same_tensors(tensors(tmp_path / "last"), tensors(last))


def test_sigterm_mid_run_and_resume_keep_the_best(train_world, reference, tmp_path):
    """Stopped by SIGTERM after evaluations worse than the best, the run's drafter/ is the
    best step whole; resumed, its later (worse) evaluations never replace it, though the
    checkpoint of the best step itself has been rotated away (--keep 2)."""
    out, best = tmp_path / "run", reference["best"]
    cmd = train(train_world, out, "--max-steps", str(STEPS + 8))  # the reference's steps, and more
    proc = subprocess.Popen(  # a process of its own: it gets the SIGTERM
        [sys.executable, "-m", "eagle3kit", *cmd],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
    )
    deadline = time.monotonic() + 300
    while not (out / "checkpoints" / f"step-{best + 4:08d}").is_dir():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=300) == 143, proc.stderr.read()
    proc.stderr.close()
    expected = tensors(reference["run"] / "checkpoints" / f"step-{best:08d}")
    assert same_tensors(tensors(out / "drafter"), expected)
    assert drafter_block(out / "drafter")["training"]["step"] == best
    stopped_at = max(int(p.name[5:]) for p in (out / "checkpoints").iterdir())
    assert stopped_at >= best + 4
    assert (
        json.loads((out / "checkpoints" / f"step-{stopped_at:08d}" / "state.json").read_text())[
            "best"
        ]["step"]
        == best
    )

    finished(cmd)  # the same command resumes
    evals = evaluations(out)
    assert max(s for s in evals) == STEPS + 8 and all(
        evals[s] <= evals[best] for s in evals if s > stopped_at
    )
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        f"step-{STEPS + 6:08d}",
        f"step-{STEPS + 8:08d}",
    ]  # step `best`'s is gone
    assert same_tensors(tensors(out / "drafter"), expected)
    chosen = json.loads((out / "run.json").read_text())["selection"]
    assert chosen["step"] == best and chosen["last"]["step"] == STEPS + 8


def test_drafter_step_last_keeps_the_last_and_names_the_best(train_world, reference, tmp_path):
    out, best = tmp_path / "run", reference["best"]
    finished(train(train_world, out, "--max-steps", str(STEPS), "--drafter-step", "last"))
    last = reference["run"] / "checkpoints" / f"step-{STEPS:08d}"
    assert same_tensors(tensors(out / "drafter"), tensors(last))
    chosen = json.loads((out / "run.json").read_text())["selection"]
    assert chosen["rule"] == "last" and chosen["step"] == STEPS
    assert chosen["best"]["step"] == best
    assert chosen["why"].startswith("--drafter-step last (the last evaluation: ")
    assert f"the best evaluated step was {best} " in chosen["why"]


def test_without_a_held_out_split_the_drafter_is_the_last(train_world, tmp_path):
    out = tmp_path / "run"
    cmd = train(train_world, out, "--max-steps", "4")
    cmd[cmd.index("--eval-split") + 1] = "0"
    proc = finished(cmd)
    assert same_tensors(tensors(out / "drafter"), tensors(out / "checkpoints" / "step-00000004"))
    chosen = json.loads((out / "run.json").read_text())["selection"]
    assert chosen == {
        "rule": "best",
        "step": 4,
        "best": None,
        "last": None,
        "why": "no held-out split (--eval-split 0): nothing to choose by, so the last step",
    }
    assert "step 4: no held-out split (--eval-split 0)" in proc.stderr


def test_a_drafter_killed_mid_write_is_never_half_of_two_steps(train_world, tmp_path):
    """drafter/ is replaced whole: a copy of a run stopped between the two renames (the
    new drafter in place, the old one aside under its hidden name) or before them (only
    the hidden temp folder written) resumes with a whole drafter/."""
    out = tmp_path / "run"
    # --fc-scale off: the trajectory this test was built on, whose best is not its last
    cmd = train(train_world, out, "--max-steps", "8", "--keep", "10", "--fc-scale", "off")
    finished(cmd)
    before = tensors(out / "drafter")
    assert drafter_block(out / "drafter")["training"]["step"] < 8  # the best is not the last
    aside = out / f".drafter.tmp-old-{12345}"
    (out / "drafter").rename(aside)  # the moment between publish_dir's renames
    shutil.copytree(out / "checkpoints" / "step-00000002", out / ".drafter.tmp")
    finished(cmd)
    assert same_tensors(tensors(out / "drafter"), before)
    assert not aside.exists()


# --patience: stop once the held-out chain figure stops rising -----------------------------------
def test_patience_is_counted_in_evaluation_periods_since_the_best() -> None:
    assert not selection.patience_spent(0, 2, ev(2, 1.5), ev(20, 1.1))  # off
    assert not selection.patience_spent(2, 2, ev(4, 1.5), ev(6, 1.4))  # one evaluation since
    assert selection.patience_spent(2, 2, ev(4, 1.5), ev(8, 1.4))
    assert not selection.patience_spent(2, 2, None, ev(8, 1.4))  # no trained evaluation yet


def test_patience_ends_training_after_evaluations_without_a_better_step(
    train_world, reference, tmp_path
):
    """With the growing learning rate the held-out figure peaks at the reference's best step:
    --patience 2 stops two evaluations later, keeps that best step in drafter/, and the same
    command run again trains no further."""
    best, evals = reference["best"], reference["evals"]
    stop = best + 2 * 2
    assert stop < STEPS  # the reference run peaks early enough for patience to show
    out = tmp_path / "run"
    cmd = train(train_world, out, "--max-steps", str(STEPS), "--patience", "2", "--json")
    proc = finished(cmd)
    result = json.loads(proc.stdout)
    assert result["steps"] == stop and result["patience_spent"] and result["exit_code"] == 0
    assert "--patience 2: no better held-out acceptance since step" in proc.stderr
    assert evaluations(out) == {s: a for s, a in evals.items() if s <= stop}
    assert drafter_block(out / "drafter")["training"]["step"] == best
    lines = len(metrics(out))
    again = json.loads(finished(cmd).stdout)
    assert again["steps"] == stop and again["patience_spent"] and len(metrics(out)) == lines

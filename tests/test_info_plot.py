"""`eagle3kit info RUN --plot FILE.png`: a run's curves without a tracker.

A real tiny run (`eagle3kit train --online` on a random tiny target, 6 steps, held-out
evaluation every 2) is drawn by the real command; the PNG is read back (its size is the
figure's, and it is not blank), and `--json` lists the three axes by title with, per series,
as many points as metrics.jsonl logged. `--plot` on a dataset, or with a file name matplotlib
cannot write, is one line naming the flag, with no figure written.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import prewarmed
import pytest

from eagle3kit.format import DatasetWriter, TokenSample

REPO = Path(__file__).resolve().parent.parent
STEPS = 6
EVAL_EVERY = 2
EVALS = STEPS // EVAL_EVERY + 1  # and one before the first step, the baseline


def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE3KIT_")}
    out.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    return out


def cli(*args: str | Path, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prewarmed.argv(), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env(),
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    from transformers import AutoTokenizer

    from eagle3kit.tiny import make_target, make_tokenizer, stdlib_docstrings

    root = tmp_path_factory.mktemp("plot")
    docs = stdlib_docstrings(40_000)
    make_tokenizer(root / "tok", vocab_size=400, corpus=docs)
    target = make_target(root / "target", root / "tok", hidden_size=32, seed=1)
    tok = AutoTokenizer.from_pretrained(str(target))
    seqs = [s for s in (tok(d)["input_ids"][:48] for d in docs[:40]) if len(s) >= 12]
    with DatasetWriter(root / "tokens", config={"stage": "test"}) as writer:
        for i, ids in enumerate(seqs):
            writer.add(TokenSample(f"s{i}", ids[:4], ids[4:]))
    result = cli(
        "train",
        root / "tokens",
        root / "run",
        "--target",
        target,
        "--online",
        "--max-steps",
        STEPS,
        "--batch-tokens",
        256,
        "--draft-vocab",
        200,
        "--eval-split",
        4,
        "--eval-every",
        EVAL_EVERY,
        "--device",
        "cpu",
        "--quiet",
    )
    assert result.returncode == 0, result.stderr
    return root / "run"


def logged(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_plot_draws_loss_accuracy_and_acceptance_against_steps(run: Path, tmp_path: Path):
    import matplotlib.image

    out = tmp_path / "curves.png"
    result = cli("info", run, "--plot", out, "--json")
    assert result.returncode == 0, result.stderr
    assert f"figure: {out}" in result.stderr

    image = matplotlib.image.imread(out)
    assert image.shape[:2] == (400, 1500)  # figsize (15, 4) at matplotlib's 100 dpi
    pixels = image[..., :3].reshape(-1, 3)
    assert len(np.unique(pixels, axis=0)) > 50  # lines, labels and ticks, not a blank sheet
    assert (pixels < 0.5).any()

    lines = logged(run)
    steps = [m for m in lines if "loss" in m]
    evals = [m for m in lines if "eval" in m]
    assert len(steps) == STEPS and len(evals) == EVALS
    ttt = len(steps[0]["acc_k"])
    plot = json.loads(result.stdout)["plot"]
    assert plot == {
        "file": str(out),
        "axes": [
            {"title": "loss", "series": {"loss": STEPS}},
            {
                "title": "accuracy per TTT step",
                "series": {f"step {k + 1}": STEPS for k in range(ttt)},
            },
            {"title": "predicted acceptance length (held out)", "series": {"overall": EVALS}},
        ],
    }


def test_plot_on_a_dataset_is_one_line_naming_the_flag(run: Path, tmp_path: Path):
    tokens = run.parent / "tokens"
    out = tmp_path / "x.png"
    result = cli("info", tokens, "--plot", out)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: --plot: {tokens} is not a training run (--plot draws a run's metrics.jsonl)"
    ]
    assert not out.exists()


def test_plot_to_a_file_matplotlib_cannot_write_is_refused_by_flag(run: Path, tmp_path: Path):
    result = cli("info", run, "--plot", tmp_path / "curves.txt")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: --plot {tmp_path / 'curves.txt'}: give a .png, .svg or .pdf file name"
    )


# Lines eagle3kit did not write (issue 38, item 10) -------------------------------------------
CRAFTED = {
    "text for an accuracy": b'{"step": 3, "loss": 0.5, "acc_k": ["high", 0.5]}',
    "a null accuracy": b'{"step": 3, "loss": 0.5, "acc_k": [null]}',
    "a 400-digit loss": b'{"step": 3, "loss": ' + b"9" * 400 + b"}",
    "a bare list": b"[null]",
    "a string step": b'{"step": "3", "loss": 0.5}',
    "a byte that is not UTF-8": b'{"step": 3, "loss": 0.5, "note": "\xff"}',
    "15,000 TTT accuracies": json.dumps({"step": 3, "loss": 0.5, "acc_k": [0.5] * 15_000}).encode(),
}


@pytest.fixture(scope="module")
def clean_axes(run: Path, tmp_path_factory) -> list[dict]:
    drawn = cli("info", run, "--plot", tmp_path_factory.mktemp("clean") / "c.png", "--json")
    assert drawn.returncode == 0, drawn.stderr
    return json.loads(drawn.stdout)["plot"]["axes"]


def crafted_copy(run: Path, where: Path, *lines: bytes) -> Path:
    import shutil

    copy = shutil.copytree(run, where)
    with open(copy / "metrics.jsonl", "ab") as f:
        f.write(b"".join(line + b"\n" for line in lines))
    return copy


@pytest.mark.parametrize("line", CRAFTED.values(), ids=CRAFTED.keys())
def test_a_line_eagle3kit_did_not_write_is_passed_over(
    run: Path, tmp_path: Path, line: bytes, clean_axes: list[dict]
):
    """`info --plot` draws the run's own lines alone (the accuracies no more series than the
    run's TTT steps: 15,000 of them took 95 s and 800 MB); resuming drops the line."""
    from eagle3kit.checkpoints.rundir import RunDir

    copy = crafted_copy(run, tmp_path / "run", line)
    drawn = cli("info", copy, "--plot", tmp_path / "curves.png", "--json")
    assert drawn.returncode == 0, drawn.stderr
    assert "Traceback" not in drawn.stderr
    assert json.loads(drawn.stdout)["plot"]["axes"] == clean_axes
    # What a resumed train does first: keep the lines up to its checkpoint.
    RunDir(copy).cut_metrics(STEPS)
    assert (copy / "metrics.jsonl").read_bytes() == (run / "metrics.jsonl").read_bytes()


def test_train_resumes_past_lines_it_did_not_write(run: Path, tmp_path: Path):
    copy = crafted_copy(run, tmp_path / "run", *CRAFTED.values())
    target = run.parent / "target"
    result = cli(
        "train",
        run.parent / "tokens",
        copy,
        "--target",
        target,
        "--online",
        "--max-steps",
        STEPS,
        "--batch-tokens",
        256,
        "--draft-vocab",
        200,
        "--eval-split",
        4,
        "--eval-every",
        EVAL_EVERY,
        "--device",
        "cpu",
        "--quiet",
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert logged(copy) == logged(run)

"""A run directory copied from elsewhere (issue 38, items 4 and 5): a link where the run keeps
its own files, or something odd where it keeps its owner and lock files, ends `eagle3kit
train` in one line naming the path, exit 2, before anything is read, written or deleted
through it; the other run a link points into is left byte for byte as it was.

One real run (a tiny target, hidden states extracted from it, four steps with checkpoints at
2 and 4) is trained once; each case copies it, plants one thing, and runs the real command.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eagle3kit._ui import OutputOptions
from eagle3kit.cli import app
from eagle3kit.format import DatasetWriter, TokenSample

pytestmark = pytest.mark.usefixtures("one_torch_thread")

REPO = Path(__file__).resolve().parent.parent
QUIET = OutputOptions(quiet=True)
TIMEOUT_S = 120
TRAIN = (
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
    "--lr",
    "3e-3",
    "--warmup",
    "1",
)


def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE3KIT_")}
    out.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    return out


def eagle3kit(*args: object, memory: int | None = None) -> subprocess.CompletedProcess[str]:
    def capped() -> None:  # a read of /dev/zero ends in MemoryError, not in a swapping machine
        if memory is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    return subprocess.run(
        [sys.executable, "-m", "eagle3kit", *map(str, args)],
        capture_output=True,
        text=True,
        env=env(),
        timeout=TIMEOUT_S,
        preexec_fn=capped,
    )


def refused(done: subprocess.CompletedProcess[str] | tuple[int, str], named: Path) -> str:
    """Exit 2 and one `error:` line naming `named`, no traceback; the line."""
    status, err = (
        (done.returncode, done.stderr) if isinstance(done, subprocess.CompletedProcess) else done
    )
    assert status == 2, err[-3000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-3000:]
    assert str(named) in lines[0], lines[0]
    return lines[0]


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Every file and link under `root` (links not followed): what it holds or points to."""
    out: dict[str, bytes | str] = {}
    for folder, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            p = Path(folder) / name
            if p.is_symlink():
                out[str(p.relative_to(root))] = f"-> {os.readlink(p)}"
            elif p.is_file():
                out[str(p.relative_to(root))] = p.read_bytes()
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Path]:
    """A tiny target, hidden states from it and a four-step run with two checkpoints."""
    from transformers import AutoTokenizer

    from eagle3kit import extract
    from eagle3kit.tiny import make_target, make_tokenizer, stdlib_docstrings
    from eagle3kit.train import DataSpec, TrainConfig
    from eagle3kit.train import run as train

    root = tmp_path_factory.mktemp("copied")
    docs = stdlib_docstrings(40_000)
    make_tokenizer(root / "tok", vocab_size=400, corpus=docs)
    target = make_target(root / "target", root / "tok", hidden_size=32, seed=1)
    tok = AutoTokenizer.from_pretrained(str(target))
    seqs = [s for s in (tok(d)["input_ids"][:48] for d in docs[:40]) if len(s) >= 12]
    with DatasetWriter(root / "tokens", config={"stage": "test"}) as w:
        for i, ids in enumerate(seqs):
            w.add(TokenSample(f"s{i}", ids[:4], ids[4:]))
    extract.run(
        extract.ExtractConfig(
            root / "tokens", root / "hidden", target=target, device="cpu", output=QUIET
        )
    )
    train(
        TrainConfig(
            [DataSpec.parse(root / "hidden")],
            root / "run",
            target,
            max_steps=4,
            batch_tokens=256,
            draft_vocab=200,
            eval_split=4,
            eval_every=2,
            checkpoint_every=2,
            lr=3e-3,
            warmup=1,
            device="cpu",
            output=QUIET,
        )
    )
    assert sorted(p.name for p in (root / "run" / "checkpoints").iterdir()) == [
        "step-00000002",
        "step-00000004",
    ]
    return {"root": root, "target": target, "hidden": root / "hidden", "run": root / "run"}


def copy_of(trained: dict[str, Path], where: Path) -> Path:
    shutil.copytree(trained["run"], where, symlinks=True)
    for lock in (".run.lock", ".gate.lock", ".owner.json"):
        (where / lock).unlink(missing_ok=True)
    return where


def continue_train(
    trained: dict[str, Path],
    run: Path,
    *extra: object,
    memory: int | None = None,
) -> tuple[int, str]:
    """The run continued to step 8 keeping one checkpoint (resume, write, rotate): through
    the typer runner, or, given a `memory` cap, in a process of its own (where a hang or a
    read without end is contained); its exit status and what it printed."""
    args = [
        "train",
        trained["hidden"],
        run,
        "--target",
        trained["target"],
        *TRAIN,
        "--max-steps",
        8,
        "--keep",
        1,
        "--force",
        "--no-progress",
        *extra,
    ]
    if memory is not None:
        done = eagle3kit(*args, memory=memory)
        return done.returncode, done.stderr
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.output


# Item 4: links where a run keeps its own files -----------------------------------------------
LINKED = {
    "checkpoints": ("checkpoints", ()),
    "a step folder": ("checkpoints/step-00000004", ()),
    "drafter": ("drafter", ()),
    "metrics.jsonl": ("metrics.jsonl", ()),
    "run.json": ("run.json", ()),
    "tensorboard": ("tensorboard", ("--report-to", "tensorboard")),
}


@pytest.mark.parametrize("what", list(LINKED))
def test_a_link_in_a_copied_run_is_refused_and_what_it_points_to_is_untouched(
    what: str, trained: dict[str, Path], tmp_path: Path
) -> None:
    """The copy's `what` links into another run (the original): train refuses it before it
    resumes from, writes into or rotates away anything there, in the default mode."""
    name, extra = LINKED[what]
    other = copy_of(trained, tmp_path / "other")
    (other / "tensorboard").mkdir()
    copy = copy_of(trained, tmp_path / "copy")
    planted = copy / name
    if planted.is_dir():
        shutil.rmtree(planted)
    else:
        planted.unlink(missing_ok=True)  # tensorboard/ is made by the first --report-to
    planted.symlink_to(other / name, target_is_directory=(other / name).is_dir())
    before, copied = snapshot(other), snapshot(copy)
    line = refused(continue_train(trained, copy, *extra), planted)
    assert line == (
        f"error: {planted}: a symbolic link (to {other / name}) where a run keeps "
        "its own files; eagle3kit reads and writes a run only inside its "
        "directory: remove it, or give a new directory"
    )
    assert snapshot(other) == before  # nothing resumed, written or rotated away through it
    assert snapshot(copy) == copied


def test_export_refuses_a_run_whose_drafter_links_elsewhere(
    trained: dict[str, Path], tmp_path: Path
) -> None:
    copy = copy_of(trained, tmp_path / "copy")
    shutil.rmtree(copy / "drafter")
    (copy / "drafter").symlink_to(trained["run"] / "drafter", target_is_directory=True)
    refused(eagle3kit("export", copy, tmp_path / "out", "--quiet"), copy / "drafter")
    assert not (tmp_path / "out").exists()


def test_an_unlinked_copy_continues(trained: dict[str, Path], tmp_path: Path) -> None:
    """The check refuses links only: a plain copy of a run resumes, and rotates its own."""
    copy = copy_of(trained, tmp_path / "copy")
    status, err = continue_train(trained, copy, "--quiet")
    assert status == 0, err[-3000:]
    assert [p.name for p in (copy / "checkpoints").iterdir()] == ["step-00000008"]
    assert sorted(p.name for p in (trained["run"] / "checkpoints").iterdir()) == [
        "step-00000002",
        "step-00000004",
    ]


# Item 5: owner and lock files ---------------------------------------------------------------
def _fifo(path: Path, _: Path) -> None:
    os.mkfifo(path)


def _directory(path: Path, _: Path) -> None:
    path.mkdir()
    (path / "x").write_text("x")


def _zero(path: Path, _: Path) -> None:
    path.symlink_to("/dev/zero")


def _dangling(path: Path, outside: Path) -> None:
    path.symlink_to(outside / "made-here")


PLANTED = {
    ".owner.json a directory": (".owner.json", _directory, "a directory"),
    ".owner.json a FIFO": (".owner.json", _fifo, "a FIFO"),
    ".owner.json a link to /dev/zero": (".owner.json", _zero, "a symbolic link"),
    ".gate.lock a dangling link": (".gate.lock", _dangling, "a symbolic link"),
    ".run.lock a directory": (".run.lock", _directory, "a directory"),
}


@pytest.mark.parametrize("what", list(PLANTED))
def test_an_odd_owner_or_lock_file_in_a_copied_run_is_one_line(
    what: str, trained: dict[str, Path], tmp_path: Path
) -> None:
    """No hang on a FIFO, no read of /dev/zero, no traceback on a directory, and no file made
    where a dangling link points: refused in a second, before torch loads."""
    name, plant, kind = PLANTED[what]
    outside = tmp_path / "outside"
    outside.mkdir()
    copy = copy_of(trained, tmp_path / "copy")
    plant(copy / name, outside)
    steps = sorted(p.name for p in (copy / "checkpoints").iterdir())
    line = refused(continue_train(trained, copy, memory=3 << 30), copy / name)
    assert line.startswith(f"error: {copy / name}: {kind} where eagle3kit keeps"), line
    assert list(outside.iterdir()) == []
    assert sorted(p.name for p in (copy / "checkpoints").iterdir()) == steps


def test_a_dataset_whose_owner_file_links_to_dev_zero_is_one_line(tmp_path: Path) -> None:
    """convert into a copied dataset: one line in well under a second, under a 1 GiB cap."""
    src = tmp_path / "a.jsonl"
    src.write_text('{"sample_id": "a", "prompt_ids": [5, 6], "completion_ids": [7, 8]}\n')
    ds = tmp_path / "ds"
    assert eagle3kit("convert", src, ds, "-q").returncode == 0
    (ds / ".owner.json").unlink()
    (ds / ".owner.json").symlink_to("/dev/zero")
    more = tmp_path / "b.jsonl"
    more.write_text('{"sample_id": "b", "prompt_ids": [5, 6], "completion_ids": [7, 9]}\n')
    refused(eagle3kit("convert", more, ds, "-q", memory=1 << 30), ds / ".owner.json")

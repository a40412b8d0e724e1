"""`_durable.publish_dir`: the one way a finished directory (an export, a training checkpoint)
is put in place, and the run directory's checkpoints that use it."""

from __future__ import annotations

from pathlib import Path

from eagle3kit._durable import publish_dir
from eagle3kit.checkpoints.rundir import RunDir


def _filled(path: Path, text: str) -> Path:
    (path / "sub").mkdir(parents=True)
    (path / "a.txt").write_text(text)
    (path / "sub" / "b.txt").write_text(text + "!")
    return path


def test_publish_dir_puts_a_new_directory_in_place(tmp_path):
    tmp = _filled(tmp_path / ".out.tmp-1", "new")
    publish_dir(tmp, tmp_path / "out")
    assert not tmp.exists()
    assert (tmp_path / "out" / "a.txt").read_text() == "new"
    assert (tmp_path / "out" / "sub" / "b.txt").read_text() == "new!"


def test_publish_dir_replaces_the_old_directory_whole_and_leaves_nothing_aside(tmp_path):
    _filled(tmp_path / "out", "old")
    (tmp_path / "out" / "only-in-old.txt").write_text("stale")
    publish_dir(_filled(tmp_path / ".out.tmp-2", "new"), tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["a.txt", "sub"]
    assert (tmp_path / "out" / "a.txt").read_text() == "new"


def test_a_checkpoint_replaces_a_damaged_one_of_its_step(tmp_path):
    run = RunDir(tmp_path / "run")
    damaged = run.step_dir(5)
    damaged.mkdir(parents=True)
    (damaged / "model.safetensors").write_text("cut short")  # no state.json: never committed
    tmp = run.begin_checkpoint(5)
    (tmp / "state.json").write_text("{}")
    run.commit_checkpoint(5, keep=2)
    assert run.steps() == [5]
    assert sorted(p.name for p in run.step_dir(5).iterdir()) == ["state.json"]
    assert sorted(p.name for p in run.checkpoints.iterdir()) == ["step-00000005"]


def test_a_new_checkpoint_clears_what_a_crash_left_in_checkpoints(tmp_path):
    run = RunDir(tmp_path / "run")
    for leftover in (".step-00000003.tmp", ".step-00000004.tmp-old-4242"):
        (run.checkpoints / leftover).mkdir(parents=True)
    tmp = run.begin_checkpoint(6)
    assert sorted(p.name for p in run.checkpoints.iterdir()) == [tmp.name]

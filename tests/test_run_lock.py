"""One run owns a dataset: other runs are refused clearly, dead runs free it at once, and
processes sharing a run id (torchrun ranks) join it.

Real processes and real SIGKILL: the lock is an flock, so what matters is what the kernel does
when a holder dies, which no mock can show.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from eagle3kit.errors import UserError
from eagle3kit.format import Dataset, DatasetWriter, TokenSample

TIMEOUT_S = 60.0

# A writer in a process of its own: commits `n` samples, queues one more that it never commits,
# says "ready <pid> <run id>", then holds the dataset until a line arrives on stdin.
HOLDER = """
import os, sys
from eagle3kit.format import DatasetWriter, TokenSample

ds, first, n, rank = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
writer = DatasetWriter(ds, commit_every=1000, rank=rank)
for i in range(first, first + n):
    writer.add(TokenSample(f"held-{i}", [1, 2, 3], [i, i + 1]))
writer.commit()
writer.add(TokenSample(f"pending-{rank}", [1], [2]))
print("ready", os.getpid(), writer.run_id, flush=True)
sys.stdin.readline()
writer.close()
"""


def env(run_id: str | None = None) -> dict[str, str]:
    """The environment with exactly the run id wanted (none: each process is its own run)."""
    out = dict(os.environ)
    out.pop("EAGLE3KIT_RUN_ID", None)
    if run_id is not None:
        out["EAGLE3KIT_RUN_ID"] = run_id
    return out


class Holder:
    """A writer process holding a dataset; `pid` and `run_id` are what it reported."""

    def __init__(self, ds: Path, first: int, n: int, rank: int = 0, run_id: str | None = None):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(ds), str(first), str(n), str(rank)],
            env=env(run_id),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        if not line or line[0] != "ready":
            self.proc.kill()
            _, err = self.proc.communicate(timeout=TIMEOUT_S)
            pytest.fail(f"holder did not open the dataset: {err}")
        self.pid, self.run_id = int(line[1]), line[2]

    def release(self) -> None:
        """Let the holder commit its pending sample and exit cleanly."""
        _, err = self.proc.communicate("go\n", timeout=TIMEOUT_S)
        assert self.proc.returncode == 0, err

    def sigkill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.communicate(timeout=TIMEOUT_S)
        assert self.proc.returncode == -signal.SIGKILL


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    """Holders a test starts; any still alive at the end are killed so none outlives it."""
    started: list[Holder] = []
    yield started
    for holder in started:
        if holder.proc.poll() is None:
            holder.proc.kill()
            holder.proc.communicate(timeout=TIMEOUT_S)


def write_jsonl(path: Path, ids: list[str]) -> Path:
    with open(path, "wb") as f:
        for sid in ids:
            f.write(
                orjson.dumps({"sample_id": sid, "prompt_ids": [5, 6], "completion_ids": [7, 8, 9]})
                + b"\n"
            )
    return path


def convert(
    src: Path, ds: Path, *flags: str, run_id: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "eagle3kit", "convert", str(src), str(ds), "-q", *flags],
        env=env(run_id),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def snapshot(ds: Path) -> dict[str, bytes]:
    """Every file of the dataset and its bytes, lock files aside (they are empty)."""
    return {
        str(p.relative_to(ds)): p.read_bytes()
        for p in sorted(ds.rglob("*"))
        if p.is_file() and not p.name.endswith(".lock")
    }


def assert_refused(
    result: subprocess.CompletedProcess[str], ds: Path, pid: int, run_id: str
) -> None:
    """Exit 2 and one `error:` line naming the dataset and the holder; no traceback."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert str(ds) in lines[0]
    assert f"pid {pid}" in lines[0]
    assert run_id in lines[0]


# (a) another run is refused ----------------------------------------------------------------
@pytest.mark.parametrize("flags", [(), ("--overwrite",)], ids=["auto", "overwrite"])
def test_other_run_refused_while_this_process_writes(
    tmp_path: Path, flags: tuple[str, ...]
) -> None:
    ds = tmp_path / "ds"
    src = write_jsonl(tmp_path / "src.jsonl", ["new-0", "new-1", "new-2"])
    writer = DatasetWriter(ds, commit_every=1000, run_id=uuid.uuid4().hex)
    try:
        for i in range(5):
            writer.add(TokenSample(f"held-{i}", [1, 2, 3], [i]))
        writer.commit()
        writer.add(TokenSample("pending", [1], [2]))
        before = snapshot(ds)

        result = convert(src, ds, *flags)
        assert_refused(result, ds, os.getpid(), writer.run_id)
        # Refused before touching anything: --overwrite wiped nothing, nothing was added.
        assert snapshot(ds) == before
        assert sorted(Dataset(ds).sample_ids()) == [f"held-{i}" for i in range(5)]
    finally:
        writer.close()
    # The refused run costs the holder nothing: its queued sample still commits on close.
    assert len(Dataset(ds)) == 6
    # And once the holder is gone the command goes through (--force: the dataset was started
    # by a writer with other settings than convert's).
    assert convert(src, ds, "--force").returncode == 0
    assert len(Dataset(ds)) == 9


def test_other_run_refused_while_a_process_writes(tmp_path: Path, holders: list[Holder]) -> None:
    ds = tmp_path / "ds"
    src = write_jsonl(tmp_path / "src.jsonl", ["new-0"])
    holder = Holder(ds, first=0, n=4)
    holders.append(holder)
    before = snapshot(ds)

    assert_refused(convert(src, ds), ds, holder.pid, holder.run_id)
    assert snapshot(ds) == before
    assert sorted(Dataset(ds).sample_ids()) == [f"held-{i}" for i in range(4)]
    holder.release()
    assert sorted(Dataset(ds).sample_ids()) == [*(f"held-{i}" for i in range(4)), "pending-0"]


# (b) a dead run leaves no stale lock ----------------------------------------------------------
def test_sigkilled_writer_leaves_no_stale_lock(tmp_path: Path, holders: list[Holder]) -> None:
    ds = tmp_path / "ds"
    holder = Holder(ds, first=0, n=3)
    holders.append(holder)
    holder.sigkill()

    # The kernel dropped the dead process's flock: a new run opens without waiting or --force.
    start = time.monotonic()
    with DatasetWriter(ds, run_id=uuid.uuid4().hex) as writer:
        opened_s = time.monotonic() - start
        # Committed samples survived the kill; the queued one was lost, as documented.
        assert writer.done_ids == {"held-0", "held-1", "held-2"}
        writer.add(TokenSample("after-kill", [1], [2]))
    assert opened_s < 5.0

    # Through the CLI as well, right after a second kill.
    holder = Holder(ds, first=10, n=2)
    holders.append(holder)
    holder.sigkill()
    result = convert(write_jsonl(tmp_path / "src.jsonl", ["cli-0"]), ds, "--force")
    assert result.returncode == 0, result.stderr
    ids = list(Dataset(ds).sample_ids())
    assert sorted(ids) == sorted(
        ["held-0", "held-1", "held-2", "after-kill", "held-10", "held-11", "cli-0"]
    )
    assert Dataset(ds).verify() == []


# (c) processes of one run join it ---------------------------------------------------------------
def test_same_run_id_joins_and_other_runs_stay_out(tmp_path: Path, holders: list[Holder]) -> None:
    ds = tmp_path / "ds"
    run_id = f"job-{uuid.uuid4().hex[:8]}"
    rank0 = Holder(ds, first=0, n=3, rank=0, run_id=run_id)
    holders.append(rank0)
    rank1 = Holder(ds, first=100, n=3, rank=1, run_id=run_id)  # opens while rank 0 holds
    holders.append(rank1)
    assert rank0.run_id == rank1.run_id == run_id

    # A third process of another run is still refused, and named after the run that owns it.
    result = convert(write_jsonl(tmp_path / "src.jsonl", ["x"]), ds)
    assert_refused(result, ds, rank0.pid, run_id)

    rank1.release()
    rank0.release()
    ds_read = Dataset(ds)
    assert ds_read.verify() == []
    assert sorted(ds_read.sample_ids()) == sorted(
        [*(f"held-{i}" for i in (0, 1, 2, 100, 101, 102)), "pending-0", "pending-1"]
    )
    assert {s["rank"] for s in ds_read.shards} == {0, 1}
    # Both processes are one run: the manifest records a single run start.
    assert [r["run_id"] for r in ds_read.manifest["runs"]] == [run_id]


def test_a_rank_finds_the_run_dir_empty_while_the_first_rank_writes_the_owner_file(
    tmp_path: Path,
) -> None:
    """CI, slow tier: under torchrun, rank 1 looked whether the new run directory was empty at
    the moment rank 0 was writing `.owner.json` through its temp file, took the temp for a
    stranger's file and refused the directory ("exists and is not a training run")."""
    from eagle3kit._durable import temp_beside
    from eagle3kit.checkpoints.rundir import LOCK_FILES, RunDir

    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    for name in LOCK_FILES[:2]:
        (run.path / name).touch()
    temp_beside(run.path / LOCK_FILES[2]).write_text("{")  # rank 0, mid-write
    assert run.check_usable("new") is False
    assert run.check_usable("overwrite") is False
    # Anything else there is still somebody else's.
    (run.path / "notes.tmp").write_text("mine")
    with pytest.raises(UserError, match="exists and is not a training run"):
        run.check_usable("new")

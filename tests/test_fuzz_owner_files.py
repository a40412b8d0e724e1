"""Fuzzing the owner and lock files (issue 38, item 5): whatever a copied directory holds where
eagle3kit keeps `.owner.json`, `.gate.lock` and `.run.lock`, taking the directory ends in the
lock or in one named problem (a UserError naming the file), within TIME_LIMIT_S and with
bounded memory, and nothing is created where a link points.

Each case crafts one of the three files in a real directory of each kind that uses them (a
dataset, a training run directory, export's lock folder) and takes the directory the way the
writers do (`format` through DatasetWriter, `RunDir.hold`, export's `hold_out`). Half of the
cases first let another run hold the directory, so the refusal that names the holder reads
the crafted owner file too. An alarm turns a hang (a FIFO opened for reading) into a failure.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from eagle3kit._lock import Owned, RunLock, acquire
from eagle3kit.checkpoints.rundir import LOCK_FILES, RunDir
from eagle3kit.errors import UserError
from eagle3kit.export.run import hold_out
from eagle3kit.format import DatasetWriter, TokenSample

TIME_LIMIT_S = 5.0
MEMORY_LIMIT = 8 << 20
HOSTILE = [
    None,
    True,
    -1,
    0,
    2**63,
    2**64,
    1e308,
    float("nan"),
    float("inf"),
    "x",
    "",
    [],
    [1, 2],
    {},
    {"a": 1},
    "\x1b[2J" * 1000,
]
FIELDS = ("run_id", "pid", "host", "started", "command")


# The crafted files -----------------------------------------------------------------------------
def _json(obj: object) -> Callable[[Path, Path], None]:
    return lambda path, _: path.write_text(json.dumps(obj))


def _bytes(data: bytes) -> Callable[[Path, Path], None]:
    return lambda path, _: path.write_bytes(data)


def _sparse(path: Path, _: Path) -> None:
    with open(path, "wb") as f:
        f.truncate(4 << 30)  # 4 GiB of zeros that take no disk


def _socket(path: Path, _: Path) -> None:
    # Bound by a name relative to its folder: a socket's path is limited to 107 bytes, which
    # a deep temporary folder (xdist's worker folders, an export's lock folder) outgrows.
    here = os.getcwd()
    os.chdir(path.parent)
    try:
        s = socket.socket(socket.AF_UNIX)
        s.bind(path.name)
        s.close()
    finally:
        os.chdir(here)


CRAFTED: dict[str, Callable[[Path, Path], None]] = {
    "empty": _bytes(b""),
    "not JSON": _bytes(b"\xff\xfe{{{" * 100),
    "a JSON list": _json([1, 2, 3]),
    "a JSON string": _json("run"),
    "4 GiB sparse": _sparse,
    "64 KiB of JSON": _json({"run_id": "x" * (64 << 10)}),
    "a link to /dev/zero": lambda path, _: path.symlink_to("/dev/zero"),
    "a link to a file outside": lambda path, outside: (
        (outside / "theirs.json").write_text('{"run_id": "theirs"}'),
        path.symlink_to(outside / "theirs.json"),
    ),
    "a dangling link outside": lambda path, outside: path.symlink_to(outside / "made"),
    "a dangling link to itself": lambda path, _: path.symlink_to(path.name),
    "a FIFO": lambda path, _: os.mkfifo(path),
    "a directory": lambda path, _: path.mkdir(),
    "a directory with files": lambda path, _: (path.mkdir(), (path / "x").write_text("x")),
    "a socket": _socket,
}
OWNER_RECORDS: dict[str, Callable[[Path, Path], None]] = {
    **{
        k: CRAFTED[k]
        for k in ("empty", "not JSON", "a JSON list", "a JSON string", "64 KiB of JSON")
    },
    **{
        f"{field} = {value!r:.20}": _json(
            {"run_id": "holder", "pid": 1, "host": "h", "started": 0, "command": "c", field: value}
        )
        for field in FIELDS
        for value in HOSTILE
    },
}
"""What the owner file of a directory another run holds may say: its refusal names it."""


# The places --------------------------------------------------------------------------------------
def _dataset(root: Path) -> tuple[Path, Path, Callable[[], object]]:
    ds = root / "ds"
    with DatasetWriter(ds, config={"stage": "test"}) as w:
        w.add(TokenSample("s0", [1, 2], [3, 4]))

    def take() -> None:
        with DatasetWriter(ds, config={"stage": "test"}) as w:
            w.add(TokenSample("s1", [1, 2], [3, 5]))

    return ds, ds, take


def _run_dir(root: Path) -> tuple[Path, Path, Callable[[], object]]:
    run = RunDir(root / "run")
    run.path.mkdir()
    return run.path, run.path, lambda: run.hold("this-run")


def _export(root: Path) -> tuple[Path, Path, Callable[[], object]]:
    out = root / "export"
    where = root / ".export.export-lock"
    where.mkdir()
    return where, out, lambda: hold_out(out)


PLACES: dict[
    str, tuple[Callable[[Path], tuple[Path, Path, Callable[[], object]]], tuple[str, ...]]
] = {
    "dataset": (_dataset, LOCK_FILES),
    "run directory": (_run_dir, LOCK_FILES),
    "export": (_export, ("run.lock", "gate.lock", "owner.json")),
}


@contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    def hung(*_: object) -> None:
        raise TimeoutError(f"no answer within {seconds} s")

    before = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


def _held_by_another(where: Path, names: tuple[str, ...]) -> RunLock:
    """Another run holding the directory (the refusal then reads and names its owner)."""
    lock, gate, owner = (where / n for n in names)
    return acquire(Owned(where, "a directory", lock, gate, owner), "holder")


def _case(
    place: str, name: str, crafted: Callable[[Path, Path], None], held: bool, tmp: Path
) -> None:
    make, names = PLACES[place]
    outside, root = tmp / "outside", tmp / "place"
    outside.mkdir(parents=True)
    root.mkdir()
    where, named, take = make(root)
    holder = _held_by_another(where, names) if held else None
    target = where / name
    if target.exists() or target.is_symlink():
        target.unlink()
    crafted(target, outside)
    before = sorted(p.name for p in outside.iterdir())
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with _deadline(TIME_LIMIT_S):
            try:
                lock = take()
            except UserError as exc:
                message = str(exc)
                assert "\n" not in message, message
                assert str(named) in message or str(target) in message, message
            else:
                assert not held, "taken while another run holds it"
                if isinstance(lock, RunLock):
                    lock.release()
        elapsed = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        if holder is not None:
            holder.release()
    assert elapsed < TIME_LIMIT_S, f"{elapsed:.1f} s"
    assert peak < MEMORY_LIMIT, f"{peak / 2**20:.1f} MiB"
    assert sorted(p.name for p in outside.iterdir()) == before  # nothing made through a link


@pytest.mark.parametrize("crafted", list(CRAFTED), ids=lambda v: v.replace(" ", "-"))
@pytest.mark.parametrize("which", [0, 1, 2], ids=["run-lock", "gate-lock", "owner"])
@pytest.mark.parametrize("place", list(PLACES))
def test_a_crafted_owner_or_lock_file_ends_in_the_lock_or_one_named_problem(
    place: str, which: int, crafted: str, tmp_path: Path
) -> None:
    _case(place, PLACES[place][1][which], CRAFTED[crafted], False, tmp_path)


@pytest.mark.parametrize("place", list(PLACES))
def test_the_owner_file_of_a_held_directory_is_named_whatever_it_says(
    place: str, tmp_path: Path
) -> None:
    records = list(OWNER_RECORDS.items())
    if place == "dataset":  # a dataset costs ~0.1 s to make: the kinds, and every start
        records = [(k, v) for k, v in records if "=" not in k or k.startswith("started")]
    for n, (what, crafted) in enumerate(records):
        try:
            _case(place, PLACES[place][1][2], crafted, True, tmp_path / str(n))
        except AssertionError as exc:
            raise AssertionError(f"{what}: {exc}") from None


def test_the_refusals_name_the_file_and_what_stands_there(tmp_path: Path) -> None:
    """The lines a person sees: the path and what is there, not a traceback or a hang."""
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    (run.path / ".owner.json").symlink_to("/dev/zero")
    with pytest.raises(UserError) as refused:
        run.hold("r")
    assert str(refused.value) == (
        f"{run.path / '.owner.json'}: a symbolic link where eagle3kit keeps the file naming a "
        "directory's owner; refused (remove it: eagle3kit makes it again)"
    )
    (run.path / ".owner.json").unlink()
    (run.path / ".gate.lock").unlink()  # made by the first try, before the owner was read
    (run.path / ".gate.lock").symlink_to(tmp_path / "made-outside")
    with pytest.raises(
        UserError,
        match=r"\.gate\.lock: a symbolic link where eagle3kit keeps "
        "a lock file of its own",
    ):
        run.hold("r")
    assert not (tmp_path / "made-outside").exists()

"""The trust boundary of the two commands that read files a server names
(`extract --engine vllm`, `train --online --server`): real `eagle3kit` subprocesses against
the loopback stand-in (testkit/fake_vllm_hidden.py) answering as a hostile or broken server
would. Nothing outside --hidden-states-dir is read or deleted, no answer hangs a run or
ends in a traceback, a repeated name is refused at once, and --api-key reaches a server
started with one (and is stored nowhere).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import prewarmed
import pytest
from fake_vllm_hidden import FakeVllmHidden
from tiny_train import env

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SERVED_IDS = [2, 4, 5, 8]
STAGES = ("extract", "train")
WITHIN_S = 120
"""Every refused answer ends the command well within this (the old code hung on a FIFO and
waited 120 s for a file named twice)."""


def command(stage: str, train_world: dict, out: Path, url: str, *extra: str) -> list[str]:
    """The command line, through the pre-warmed interpreter (no test here signals it)."""
    if stage == "extract":
        args = ["extract", str(train_world["tokens"]), str(out), "--engine", "vllm"]
    else:
        args = [
            "train",
            str(train_world["tokens"]),
            str(out),
            "--online",
            "--device",
            "cpu",
            "--batch-tokens",
            "128",
            "--draft-vocab",
            "200",
            "--eval-split",
            "0",
            "--max-steps",
            "2",
        ]
    return [
        *prewarmed.argv(),
        *args,
        "--server",
        url,
        "--target",
        str(train_world["target"]),
        "--concurrency",
        "2",
        "--no-progress",
        "-q",
        *extra,
    ]


def run(
    stage: str,
    train_world: dict,
    tmp_path: Path,
    server: FakeVllmHidden,
    *extra: str,
    storage: Path | None = None,
    out: str = "out",
) -> subprocess.CompletedProcess[str]:
    """The command against `server`, with --hidden-states-dir `storage` (default: the
    server's own folder). One request in flight: a server that names one bad file for every
    request is otherwise refused for naming it twice as often as for the file itself."""
    flags = ["--hidden-states-dir", str(storage or server.storage), "--concurrency", "1", *extra]
    return subprocess.run(
        command(stage, train_world, tmp_path / out, server.url, *flags),
        capture_output=True,
        text=True,
        env=env(),
        timeout=WITHIN_S,
    )


def one_error_line(proc: subprocess.CompletedProcess[str], url: str | None) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    if url is not None:
        assert f"--server {url}" in lines[0]
    return lines[0]


@pytest.fixture()
def server(train_world, tmp_path):
    served = FakeVllmHidden(train_world["target"], tmp_path / "storage", SERVED_IDS).start()
    yield served
    served.stop()


@pytest.fixture()
def victim(tmp_path) -> Path:
    """A user's file outside the storage folder, with a lock file beside it."""
    notes = tmp_path / "home" / "notes.safetensors"
    notes.parent.mkdir()
    notes.write_text("the user's notes")
    Path(f"{notes}.lock").write_text("")
    return notes


def untouched(victim: Path) -> None:
    assert victim.read_text() == "the user's notes"
    assert Path(f"{victim}.lock").is_file()


@pytest.mark.parametrize("stage", STAGES)
def test_a_file_outside_the_folder_is_neither_read_nor_deleted(
    stage, train_world, tmp_path, server, victim
):
    server.names = lambda _path: str(victim)
    line = one_error_line(run(stage, train_world, tmp_path, server), server.url)
    assert f"names {str(victim)!r}, outside --hidden-states-dir {server.storage}" in line
    untouched(victim)
    # Relative to this process's working directory: resolved there, refused the same way.
    server.names = lambda _path: os.path.relpath(victim)
    line = one_error_line(run(stage, train_world, tmp_path, server), server.url)
    assert "outside --hidden-states-dir" in line
    untouched(victim)


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("how", ["file", "folder"])
def test_a_symlink_inside_the_folder_pointing_out_is_refused(
    stage, how, train_world, tmp_path, server, victim
):
    if how == "file":
        link = server.storage / "link.safetensors"
        link.symlink_to(victim)
        named, why = link, f"{link} is a symlink, not a regular file"
    else:
        (server.storage / "sub").symlink_to(victim.parent, target_is_directory=True)
        named, why = server.storage / "sub" / victim.name, "outside --hidden-states-dir"
    server.names = lambda _path: str(named)
    assert why in one_error_line(run(stage, train_world, tmp_path, server), server.url)
    untouched(victim)


@pytest.mark.parametrize("stage", STAGES)
def test_a_fifo_is_refused_without_opening_it(stage, train_world, tmp_path, server):
    fifo = server.storage / "fifo.safetensors"
    os.mkfifo(fifo)
    server.names = lambda _path: str(fifo)
    began = time.monotonic()
    line = one_error_line(run(stage, train_world, tmp_path, server), server.url)
    assert f"{fifo} is a FIFO, not a regular file" in line
    assert time.monotonic() - began < WITHIN_S
    assert fifo.exists()


def _directory(storage: Path) -> str:
    (storage / "dir.safetensors").mkdir()
    return str(storage / "dir.safetensors")


def _huge(storage: Path) -> str:
    """A sparse 8 GiB file: far more than a sample's states take, refused before reading."""
    with open(storage / "huge.safetensors", "wb") as f:
        f.truncate(8 << 30)
    return str(storage / "huge.safetensors")


MALFORMED: list[tuple[str, Callable[[Path], object] | None, bytes | None, str]] = [
    ("directory", _directory, None, "dir.safetensors is a directory, not a regular file"),
    ("number", lambda _storage: 42, None, "the answer's hidden_states_path is 42, not a file path"),
    ("too big", _huge, None, "bytes, more than the"),
    ("other suffix", lambda storage: str(storage / "x.txt"), None, "not a .safetensors file"),
    ("json list", None, b"[1, 2]", "HTTP 200 with a JSON list, not an object"),
    ("not json", None, b"<html>ok</html>", "HTTP 200 with a body that is not JSON"),
]


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize(
    ("what", "names", "raw", "message"), MALFORMED, ids=[m[0] for m in MALFORMED]
)
def test_a_malformed_answer_is_one_line_naming_the_server(
    stage, what, names, raw, message, train_world, tmp_path, server
):
    if names is not None:
        named = names(server.storage)
        server.names = lambda _path: named
    server.raw_answer = raw
    assert message in one_error_line(run(stage, train_world, tmp_path, server), server.url)
    if what == "directory":
        assert (server.storage / "dir.safetensors").is_dir()


@pytest.mark.parametrize("stage", STAGES)
def test_the_same_path_named_twice_is_refused_at_once(stage, train_world, tmp_path, server):
    first: list[str] = []
    server.write_delay_s = 0.5  # both answers are out before the first file is read

    def same(path: Path) -> str:
        first.append(str(path))
        return first[0]

    server.names = same
    began = time.monotonic()
    line = one_error_line(run(stage, train_world, tmp_path, server), server.url)
    assert "a file it already named for another request" in line
    assert time.monotonic() - began < 60  # not the 120 s wait for a file read and deleted


@pytest.mark.parametrize("stage", STAGES)
def test_the_folder_is_required_and_checked_against_the_servers_config(
    stage, train_world, tmp_path, server
):
    proc = subprocess.run(
        command(stage, train_world, tmp_path / "out", server.url),
        capture_output=True,
        text=True,
        env=env(),
        timeout=WITHIN_S,
    )
    line = one_error_line(proc, None)
    needs = "--engine vllm" if stage == "extract" else "--server"
    assert f"{needs} needs --hidden-states-dir DIR" in line
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    server.reported_storage = str(server.storage)  # as vLLM with VLLM_SERVER_DEV_MODE=1
    line = one_error_line(run(stage, train_world, tmp_path, server, storage=elsewhere), server.url)
    assert (
        f"writes its hidden-state files to {server.storage} (its /server_info: "
        f"shared_storage_path), outside --hidden-states-dir {elsewhere}" in line
    )
    assert server.requests == []  # refused before any request


@pytest.mark.parametrize("stage", STAGES)
def test_the_api_key_is_sent_and_stored_nowhere(stage, train_world, tmp_path, server):
    key = "sk-eagle3kit-TEST-0a1b2c3d"
    server.api_key = key
    server.reported_storage = str(server.storage)  # read with the key too
    line = one_error_line(run(stage, train_world, tmp_path, server), server.url)
    assert "HTTP 401: the server refused the API key (--api-key, EAGLE3KIT_API_KEY)" in line
    done = run(stage, train_world, tmp_path, server, "--api-key", key, out="keyed")
    assert done.returncode == 0, done.stderr[-3000:]
    assert server.requests and key not in done.stderr + done.stdout
    assert list(server.storage.iterdir()) == []  # every file read, then deleted
    for path in (tmp_path / "keyed").rglob("*"):
        if path.is_file():
            assert key.encode() not in path.read_bytes(), path

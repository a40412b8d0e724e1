"""SIGTERM stops every long stage as Ctrl-C does: what is held is committed, a server's files
already read are deleted, one line says how to continue, and the status is 143.

Real `eagle3kit` subprocesses get a real SIGTERM once their output has a commit. To be sure
the signal lands mid-run on a shared machine, the process is stopped (SIGSTOP) the moment
the first commit shows, signalled, then continued: the SIGTERM is handled where the process
stood, with the rest of the work still to do. Rerunning the line it printed then completes
the work, each sample once.
"""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from extract_world import Tiny, build_tiny, cli_env, write_tokens
from fake_vllm_hidden import FakeVllmHidden

from eagle3kit.format import Dataset, HiddenDataset

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    return build_tiny(tmp_path_factory)


def committed(out: Path) -> int:
    """Shards the dataset at `out` lists (0 while it has none)."""
    manifest = out / "manifest.json"
    try:
        return len(orjson.loads(manifest.read_bytes())["shards"])
    except (FileNotFoundError, orjson.JSONDecodeError):
        return 0


def _sigint_as_from_a_shell() -> None:
    """In the child before it runs: SIGINT at its default, as a shell hands it over.

    A child inherits the signals its parent ignores, and Python keeps an inherited SIGINT
    ignored. The pytest worker now and then had it ignored at the moment of the fork (by
    one of the threads earlier tests leave in it: the child caught SIGTERM and SIGUSR1 but
    not SIGINT, ignored the test's Ctrl-C and exited 0)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def signal_mid_run(
    args: list[str], ready: Callable[[], bool], sig: signal.Signals = signal.SIGTERM
) -> subprocess.CompletedProcess:
    """Run `eagle3kit *args`; once `ready()`, send it `sig` (stopped around the signal, so it
    is handled before the run can end by itself). Returns the finished process."""
    cmd = [sys.executable, "-m", "eagle3kit", *args]
    proc = subprocess.Popen(
        cmd, env=cli_env(), stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_as_from_a_shell
    )
    deadline = time.monotonic() + 240
    while proc.poll() is None and not ready() and time.monotonic() < deadline:
        time.sleep(0.002)
    proc.send_signal(signal.SIGSTOP)
    assert proc.poll() is None, "the run ended before it could be signalled"
    proc.send_signal(sig)
    proc.send_signal(signal.SIGCONT)
    _, stderr = proc.communicate(timeout=240)
    return subprocess.CompletedProcess(cmd, proc.returncode, "", stderr)


def assert_stopped_by_sigterm(done: subprocess.CompletedProcess) -> list[str]:
    """Exit 143, no traceback, and the last line says how to continue: returns that command."""
    assert done.returncode == 143, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "error: stopped by SIGTERM; what was committed is safe. Continue with: eagle3kit "
    ), done.stderr[-3000:]
    command = shlex.split(last.split("Continue with: ", 1)[1])
    assert command[1:] == done.args[3:]  # the same command (`eagle3kit` for `-m eagle3kit`)
    return command[1:]


def rerun(args: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "eagle3kit", *args],
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]


def test_sigterm_mid_extract_commits_and_the_line_continues(tiny: Tiny, tmp_path: Path) -> None:
    tokens = write_tokens(tmp_path / "tokens", tiny.tokenizer, n=120)
    out = tmp_path / "hidden"
    args = [
        "extract",
        str(tokens),
        str(out),
        "--target",
        str(tiny.llama),
        "--batch-tokens",
        "1",
        "--commit-every",
        "2",
        "--dtype",
        "float32",
        "-q",
    ]
    done = signal_mid_run(args, lambda: committed(out) >= 1)
    again = assert_stopped_by_sigterm(done)
    held = list(HiddenDataset(out).sample_ids())
    assert 0 < len(held) < 120

    rerun(again)
    ds = HiddenDataset(out)
    ids = list(ds.sample_ids())
    assert ds.verify() == [] and len(ids) == len(set(ids)) == 120 and set(held) <= set(ids)


def test_sigterm_mid_server_extract_commits_what_came_and_deletes_its_files(
    tiny: Tiny, tmp_path: Path
) -> None:
    """The samples received are committed and every file the server wrote is deleted: the
    answers being read when the signal came are read (then deleted) before the exit."""
    tokens = write_tokens(tmp_path / "tokens", tiny.tokenizer, n=60)
    storage, out = tmp_path / "shared", tmp_path / "served"
    server = FakeVllmHidden(tiny.llama, storage, [2, 4, 5, 8], write_delay_s=0.1).start()
    try:
        args = [
            "extract",
            str(tokens),
            str(out),
            "--target",
            str(tiny.llama),
            "--engine",
            "vllm",
            "--server",
            server.url,
            "--hidden-states-dir",
            str(storage),
            "--concurrency",
            "2",
            "--commit-every",
            "2",
            "-q",
        ]
        done = signal_mid_run(args, lambda: committed(out) >= 1)
        again = assert_stopped_by_sigterm(done)
        held = list(HiddenDataset(out).sample_ids())
        assert 0 < len(held) < 60
        assert sorted(p.name for p in storage.iterdir()) == []  # nothing left on the server
        asked = len(server.requests)
        assert len(held) <= asked < 60

        rerun(again)
    finally:
        server.stop()
    ds = HiddenDataset(out)
    ids = list(ds.sample_ids())
    assert ds.verify() == [] and len(ids) == len(set(ids)) == 60 and set(held) <= set(ids)
    assert list(storage.iterdir()) == []


def jsonl(path: Path, n: int) -> Path:
    with open(path, "wb") as f:
        for i in range(n):
            f.write(
                orjson.dumps(
                    {
                        "sample_id": f"s{i:06d}",
                        "prompt_ids": [1, 2, 3, i % 50],
                        "completion_ids": [4, 5, 6, 7, 8],
                    }
                )
                + b"\n"
            )
    return path


def test_sigterm_mid_convert_import_commits_and_the_line_continues(tmp_path: Path) -> None:
    n = 60_000
    src, out = jsonl(tmp_path / "in.jsonl", n), tmp_path / "tokens"
    args = ["convert", str(src), str(out), "--commit-every", "500", "-q"]
    done = signal_mid_run(args, lambda: committed(out) >= 1)
    again = assert_stopped_by_sigterm(done)
    held = len(Dataset(out))
    assert 0 < held < n

    rerun(again)
    ds = Dataset(out)
    ids = list(ds.sample_ids())
    assert ds.verify() == [] and len(ids) == len(set(ids)) == n


def test_sigterm_mid_validate_write_clean_commits_and_the_line_continues(tmp_path: Path) -> None:
    n = 30_000
    tokens = tmp_path / "tokens"
    rerun(["convert", str(jsonl(tmp_path / "in.jsonl", n)), str(tokens), "-q"])
    clean = tmp_path / "clean"
    args = ["validate", str(tokens), "--write-clean", str(clean), "-q"]
    done = signal_mid_run(args, lambda: committed(clean) >= 1)
    again = assert_stopped_by_sigterm(done)
    held = len(Dataset(clean))
    assert 0 < held < n

    rerun(again)
    ids = list(Dataset(clean).sample_ids())
    assert len(ids) == len(set(ids)) == n


def test_sigint_keeps_its_status_and_names_itself(tmp_path: Path) -> None:
    out = tmp_path / "tokens"
    args = [
        "convert",
        str(jsonl(tmp_path / "in.jsonl", 60_000)),
        str(out),
        "--commit-every",
        "500",
        "-q",
    ]
    done = signal_mid_run(args, lambda: committed(out) >= 1, signal.SIGINT)
    assert done.returncode == 130 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "error: stopped by SIGINT; what was committed is safe. Continue with: " in done.stderr

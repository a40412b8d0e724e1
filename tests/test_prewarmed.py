"""testkit/prewarmed.py: a command forked from the pre-warmed interpreter behaves as the same
command started fresh (its output, its exit status, the caller's working directory,
environment and arguments), and dies with its caller."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import prewarmed
from real_tokenizers import qwen3_tokenizer_dir


def both(*args: str, cwd: Path, env: dict[str, str]) -> list[subprocess.CompletedProcess[str]]:
    return [
        subprocess.run(
            [*start, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
        )
        for start in (prewarmed.argv(), [sys.executable, "-m", "eagle3kit"])
    ]


def test_a_forked_command_answers_as_a_fresh_one(tmp_path: Path) -> None:
    env = {**os.environ, "COLUMNS": "100"}
    warm, fresh = both("--version", cwd=tmp_path, env=env)
    assert (warm.returncode, warm.stdout, warm.stderr) == (0, fresh.stdout, fresh.stderr)
    # a refusal and its status
    warm, fresh = both("info", "no-such-run", cwd=tmp_path, env=env)
    assert warm.returncode == fresh.returncode != 0
    assert warm.stderr == fresh.stderr and "no-such-run" in warm.stderr


def test_a_script_sees_the_callers_directory_environment_and_arguments(tmp_path: Path) -> None:
    script = tmp_path / "tools" / "show.py"
    script.parent.mkdir()
    script.write_text(
        "import json, os, sys\n"
        "print(json.dumps([os.getcwd(), os.environ['E3K_PROBE'], sys.argv[1:], sys.path[0]]))\n"
        "sys.exit(3)\n"
    )
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "E3K_PROBE": "from the caller"}
    warm, fresh = (
        subprocess.run(
            [*start, "a b", "--flag"], cwd=work, env=env, capture_output=True, text=True, timeout=60
        )
        for start in (prewarmed.script_argv(script), [sys.executable, str(script)])
    )
    assert warm.returncode == fresh.returncode == 3, warm.stderr
    assert (
        json.loads(warm.stdout)
        == json.loads(fresh.stdout)
        == [
            str(work),
            "from the caller",
            ["a b", "--flag"],
            str(script.parent),
        ]
    )


def test_the_command_ends_with_its_caller(tmp_path: Path) -> None:
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "hi"}\n')
    tokenizer = qwen3_tokenizer_dir(tmp_path / "tokenizer")
    with socket.socket() as silent:  # listens, never answers: gen waits ~30 s for its health
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        caller = subprocess.Popen(
            [
                *prewarmed.argv(),
                *("gen", "prompts.jsonl", "ds", "--server", url, "--no-progress"),
                *("--tokenizer", str(tokenizer)),
            ],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while len(working_in(tmp_path)) < 2:  # the caller and the command it forwarded
            assert caller.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        caller.kill()
        caller.wait()
        deadline = time.monotonic() + 5  # well before gen would give up by itself
        while working_in(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not working_in(tmp_path)


def working_in(folder: Path) -> list[int]:
    """The processes whose working directory is `folder`."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "cwd").resolve() == folder.resolve():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_kill_returns_once_the_command_is_gone(tmp_path: Path) -> None:
    """`prewarmed.kill` SIGKILLs the caller and returns only after the command it let start
    has died (of SIGKILL: its own cleanup never runs), so a test that inspects what the
    command wrote sees nothing change after it."""
    script = tmp_path / "writes.py"
    script.write_text(
        "import atexit, os, pathlib, time\n"
        "atexit.register(lambda: pathlib.Path('cleaned').write_text('x'))\n"
        "pathlib.Path('pid').write_text(str(os.getpid()))\n"
        "n = 0\n"
        "while True:\n"
        "    n += 1\n"
        "    pathlib.Path('count').write_text(str(n))\n"
    )
    caller = subprocess.Popen(
        prewarmed.script_argv(script), cwd=tmp_path, stdout=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 30
    while not (tmp_path / "count").exists():
        assert caller.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    prewarmed.kill(caller)
    assert caller.returncode == -9
    command = int((tmp_path / "pid").read_text())
    assert command != caller.pid
    assert not Path(f"/proc/{command}").exists()
    count = (tmp_path / "count").read_text()
    time.sleep(0.2)
    assert (tmp_path / "count").read_text() == count
    assert not (tmp_path / "cleaned").exists()

"""docs/vllm-cpu.md runs against the real engine: its console commands in order, in a fresh
work directory, and its ```vllm-launch line started as written (the port replaced by a free
one, in the commands that use it too).

The launch line must be the one testkit/launch.py starts (the module, the environment
variable, --dtype float32, --max-model-len 2048), so the page shows what the tier runs.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import launch
import pytest

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "vllm-cpu.md"
FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
DOC_PORT = "127.0.0.1:8000"

pytestmark = pytest.mark.vllm


def blocks() -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(DOC.read_text())]


def launch_args(line: str) -> tuple[str, list[str]]:
    """(model, the flags launch.VllmServer does not add itself) of the page's launch line."""
    words = shlex.split(line)
    assert words[0] == "VLLM_CPU_KVCACHE_SPACE=1", line
    assert words[1] == ".venv-vllm/bin/python" and words[2:4] == ["-m", launch.MODULE], line
    flags = words[4:]
    fixed = {"--dtype": "float32", "--max-model-len": "2048", "--port": "8000"}
    model, rest, i = None, [], 0
    while i < len(flags):
        if flags[i] == "--model":
            model = flags[i + 1]
        elif flags[i] in fixed:
            assert flags[i + 1] == fixed[flags[i]], (flags[i], flags[i + 1])
        else:
            rest.append(flags[i])
            i -= 1
        i += 2
    assert model is not None
    return model, rest


def test_the_page_runs(servers, vllm_env: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "scripts").symlink_to(REPO / "scripts")
    (work / ".venv-vllm").symlink_to(vllm_env.parent.parent)  # reused, not built again
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
        "EAGLE3KIT_VLLM_PYTHON": str(vllm_env),
    }
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "eagle3kit"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m eagle3kit "$@"\n')
    shim.chmod(0o755)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    url, ran, launched = None, [], 0
    for lang, body in blocks():
        if lang == "vllm-launch":
            model, args = launch_args(body.strip())
            server = servers.get("docs", Path(model), args, cwd=work)
            url, launched = f"127.0.0.1:{server.port}", launched + 1
        if lang != "console":
            continue
        for line in body.splitlines():
            if not line.startswith("$ "):
                continue
            command = line[2:]
            if url:
                command = command.replace(DOC_PORT, url)
            proc = subprocess.run(
                command, shell=True, cwd=work, env=env, capture_output=True, text=True, timeout=1200
            )
            assert proc.returncode == 0, f"{command}\n{proc.stderr[-3000:]}"
            ran.append((command, proc))
    assert launched == 1 and len(ran) == 4
    bench = ran[-2][1].stderr
    assert "acceptance length" in bench and "vllm" in bench
    gate = ran[-1][1].stderr  # exit 0 was asserted above: agreement within 0.05, no cause
    assert "bench parity" in ran[-1][0] and "passed" in gate and "warning:" not in gate, gate


def test_the_quickstart_page_shows_the_same_commands() -> None:
    """docs/quickstart.md's vLLM section (text blocks: its own doc test runs without the
    engine) shows the lines this tier runs from docs/vllm-cpu.md: the launch line, bench
    server and the parity gate."""
    page = (REPO / "docs" / "quickstart.md").read_text()
    section = page[page.index("## Serve it in vLLM's CPU build") : page.index("## From Python")]
    shown = [body.strip() for lang, body in FENCE.findall(section) if lang == "text"]
    launch_line = next(body.strip() for lang, body in blocks() if lang == "vllm-launch")
    bench_lines = [
        line[2:]
        for lang, body in blocks()
        if lang == "console"
        for line in body.splitlines()
        if line.startswith("$ eagle3kit bench")
    ]
    assert [b.split()[2] for b in bench_lines] == ["server", "parity"]
    assert shown == [launch_line, *bench_lines]

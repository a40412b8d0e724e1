"""docs/bench.md runs: every command it shows, in order, in a fresh directory.

`console` blocks run as in tests/test_docs.py (lines starting with "$ "; `# exits N` sets
the expected status). The `bench server` and `bench parity` examples sit in `text` blocks,
which test_docs.py does not run (its stand-in servers do not speculate); here they run against
tests/fake_spec_server.py stand-ins on the documented loopback ports.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import prewarmed
import pytest
from doc_runner import code_blocks, split_command
from fake_spec_server import SpecServer

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "bench.md"
STAND_INS = {
    30100: ("sglang", True),
    8100: ("vllm", True),
    8101: ("vllm", False),
}
"""Documented port -> (api, speculating)."""
LOOPBACK = re.compile(r"\b127\.0\.0\.1:(\d+)\b")


def doc_commands() -> list[tuple[int, str, int]]:
    """(line, command, expected status) of every runnable command, in order."""
    found = []
    for lang, first, body in code_blocks(DOC):
        if lang not in ("console", "text"):
            continue
        for offset, raw in enumerate(body.splitlines()):
            line = raw.strip()
            if not line.startswith("$ "):
                continue
            line = line[2:]
            if lang == "text" and not line.startswith(
                ("eagle3kit bench server", "eagle3kit bench parity")
            ):
                continue
            found += [(first + offset, part, status) for part, status in split_command(line)]
    return found


def argv(command: str) -> list[str]:
    words = shlex.split(command)
    if words[0] == "eagle3kit":
        return [*prewarmed.argv(), *words[1:]]
    if words[0] == "python":
        return [sys.executable, *words[1:]]
    raise AssertionError(f"docs/bench.md runs only eagle3kit and python, not {words[0]}")


def test_every_documented_port_has_a_stand_in():
    ports = {int(p) for p in LOOPBACK.findall(DOC.read_text())}
    assert ports <= set(STAND_INS), ports - set(STAND_INS)


@pytest.mark.slow
def test_docs_bench_runs(tmp_path):
    work = tmp_path / "work"
    shutil.copytree(REPO / "tests" / "data" / "prompts", work / "tests" / "data" / "prompts")
    env = {**os.environ, "EAGLE3KIT_NO_PROGRESS": "1", "COLUMNS": "120"}
    servers: dict[int, SpecServer] = {}
    try:
        for line, command, status in doc_commands():

            def real_port(match: re.Match) -> str:
                port = int(match[1])
                if port not in servers:
                    api, spec = STAND_INS[port]
                    servers[port] = SpecServer(
                        api, speculative=spec, step_s=0.001, tokenizer=str(work / "tiny-target")
                    ).start()
                return f"127.0.0.1:{servers[port].port}"

            result = subprocess.run(
                argv(LOOPBACK.sub(real_port, command)),
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            out = result.stdout + result.stderr
            assert result.returncode == status, f"docs/bench.md:{line}: {command}\n{out}"
            assert "Traceback" not in out, f"docs/bench.md:{line}: {command}\n{out}"
            if "--json" in command:
                assert '"acceptance_length"' in result.stdout, out
            if "bench parity" in command:  # it fails, naming both reasons it shows
                assert "[served-target]" in out and "differ by more than 0.05" in out, out
            if "bench accept" in command and status == 0 and "--json" not in command:
                assert "acceptance length" in out and "chain k=3, temperature 0" in out, out
                assert "configuration error" in out  # an untrained drafter is flagged
    finally:
        for server in servers.values():
            server.stop()


@pytest.mark.parametrize(
    "option",
    [
        "--target",
        "--drafter",
        "--k",
        "--tree",
        "--temperature",
        "--max-new-tokens",
        "--max-samples",
        "--max-turns",
        "--format",
        "--tokenizer",
        "--chat-template",
        "--device",
        "--dtype",
        "--tie-epsilon",
        "--seed",
        "--plot",
        "--server",
        "--baseline",
        "--api",
        "--concurrency",
        "--api-key",
        "--request-timeout",
        "--speculative-config",
        "--tolerance",
        "--depth-buckets",
        "--context-from",
        "--context-tokens",
    ],
)
def test_every_option_is_documented(option):
    assert f"`{option}" in DOC.read_text()

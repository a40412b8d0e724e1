"""Running the shell commands a doc page shows: its code blocks split into commands, a
checkout-like folder to run them in, the environment and shims they see, the stand-in
servers for the pages that talk to one, and `prewarmed` (a fixture: one process that has
imported torch, forked for each command; testkit/prewarmed.py). test_docs.py and the
per-page doc tests use it; not a test module."""

from __future__ import annotations

import os
import random
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import prewarmed as prewarmed_server
import pytest
from finished_quickstart import FinishedQuickstart
from prewarmed import Server

REPO = Path(__file__).resolve().parent.parent
RUN_LANGS = {"console", "bash", "sh", "shell"}
FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
EXPECT = re.compile(r"\s+#\s*exits\s+(\d+)\s*$")
SKIPPED = ("pip install ", "python -m pytest")
LOOPBACK = re.compile(r"\b127\.0\.0\.1:(\d+)\b")
BACKGROUND = re.compile(r"\s+&\s*$")
QUICKSTART_DIR = "eagle3kit-quickstart"
"""Where `eagle3kit quickstart` writes when it names no directory (the README's and
docs/quickstart.md's first command)."""
"""A command the docs start in the background: a server the later commands talk to."""
PORT_FLAG = re.compile(r"--port (\d+)\b")


@dataclass(frozen=True)
class StandIn:
    api: str | None
    """sglang or vllm; None: nothing listens there (a server that is down)."""
    what: str
    options: dict = field(default_factory=dict)
    """FakeServer keyword arguments."""


SHARED = {"faults": {"latency_s": 0.02}}
"""The two SGLang stand-ins answer after 20 ms, so that gen spreads a run over both."""


DOC_SERVERS = {
    30000: StandIn("sglang", "an SGLang server", SHARED),
    30001: StandIn("sglang", "a second SGLang server", SHARED),
    30005: StandIn("sglang", "an SGLang server behind an API key", {"api_key": "sk-docs-example"}),
    8000: StandIn("vllm", "a vLLM server"),
    8001: StandIn(
        "vllm",
        "a vLLM server that reports one completion token more than it returns",
        {"faults": {"count_delta": 1}},
    ),
    30999: StandIn(None, "nothing: a server that is down"),
}
"""Loopback port written in the docs -> what the test starts in its place."""


@dataclass
class Command:
    line: int
    text: str
    status: int


def code_blocks(path: Path) -> list[tuple[str, int, str]]:
    """(language, first line number, body) of each fenced block."""
    text = path.read_text()
    return [
        (m.group(1).lower(), text.count("\n", 0, m.start(2)) + 1, m.group(2))
        for m in FENCE.finditer(text)
    ]


def block_commands(lang: str, body: str) -> list[tuple[int, str]]:
    out = []
    for i, raw in enumerate(body.splitlines()):
        line = raw.strip()
        if lang == "console":
            if not line.startswith("$ "):
                continue
            line = line[2:].strip()
        elif not line or line.startswith("#"):
            continue
        out.append((i, line))
    return out


def split_command(line: str) -> list[tuple[str, int]]:
    """One command line as (part, expected status) pairs: && split, set-up parts dropped."""
    m = EXPECT.search(line)
    status = int(m.group(1)) if m else 0
    parts = [p.strip() for p in EXPECT.sub("", line).split("&&")]
    parts = [p for p in parts if not p.startswith(SKIPPED)]
    return [(part, status if k == len(parts) - 1 else 0) for k, part in enumerate(parts)]


def commands(path: Path) -> list[Command]:
    """Every command of the runnable blocks in `path`, && chains split, set-up parts dropped."""
    found = []
    for lang, first, body in code_blocks(path):
        if lang not in RUN_LANGS:
            continue
        for offset, line in block_commands(lang, body):
            found += [Command(first + offset, part, status) for part, status in split_command(line)]
    return found


class DocServers:
    """Starts the stand-in for a documented port on first use; maps documented ports to real."""

    def __init__(self, tokenizer_dir: Path) -> None:
        self.tokenizer_dir = tokenizer_dir
        self._tokenizer = None
        self.ports: dict[int, int] = {}
        self._running: list = []
        self.launched: dict[int, int] = {}
        """Documented port -> the real one of a server the page started itself (`... &`)."""
        self._processes: list[subprocess.Popen] = []

    def port(self, documented: int) -> int:
        if documented in self.launched:
            return self.launched[documented]
        if documented not in self.ports:
            if documented not in DOC_SERVERS:
                raise KeyError(documented)
            self.ports[documented] = self._start(DOC_SERVERS[documented], len(str(documented)))
        return self.ports[documented]

    def substitute(self, text: str) -> str:
        return LOOPBACK.sub(lambda m: f"127.0.0.1:{self.port(int(m.group(1)))}", text)

    def restore(self, text: str) -> str:
        """Output as it reads with the servers on their documented ports."""
        back = {real: doc for doc, real in {**self.ports, **self.launched}.items()}
        return LOOPBACK.sub(lambda m: f"127.0.0.1:{back.get(int(m.group(1)), m.group(1))}", text)

    def _start(self, spec: StandIn, digits: int) -> int:
        port = free_port(digits)
        if spec.api is None:
            return port  # nothing listens: connections are refused
        from fakeserver import FakeServer, HFTokenizer

        if self._tokenizer is None:
            from tokenizers import Tokenizer

            self._tokenizer = HFTokenizer(
                Tokenizer.from_file(str(self.tokenizer_dir / "tokenizer.json"))
            )
        server = FakeServer(
            spec.api, port=port, tokenizer=self._tokenizer, record_bodies=False, **spec.options
        ).start()
        self._running.append(server)
        return server.port

    def launch(self, command: str, cwd: Path, env: dict[str, str], timeout: float = 120) -> str:
        """Start a documented `SERVER --port N ... &` on a free port; return what it prints
        once it listens, as it reads with the documented port."""
        documented = [int(p) for p in PORT_FLAG.findall(command)]
        assert documented, f"a background command names no --port: {command}"
        for port in documented:
            self.launched[port] = free_port(len(str(port)))
        text = PORT_FLAG.sub(
            lambda m: f"--port {self.launched[int(m.group(1))]}", BACKGROUND.sub("", command)
        )
        log = Path(tempfile.mkdtemp(prefix="e3k-doc-server-")) / "log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                ["bash", "-c", f"exec {self.substitute(text)}"],
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self._processes.append(proc)
        deadline = time.monotonic() + timeout
        while " on http://" not in (said := log.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, (
                f"`{command}` did not say where it listens:\n{said}"
            )
            time.sleep(0.05)
        shutil.rmtree(log.parent, ignore_errors=True)
        return self.restore(said.strip())

    def stop_launched(self) -> None:
        for proc in self._processes:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._processes.clear()
        self.launched.clear()

    def stop(self) -> None:
        self.stop_launched()
        for server in self._running:
            server.stop()
        self._running.clear()


def free_port(digits: int) -> int:
    """A free port with as many digits as the documented one, so outputs keep their widths."""
    low, high = max(1024, 10 ** (digits - 1)), min(65535, 10**digits - 1)
    rng = random.Random()
    for _ in range(200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", rng.randint(low, high)))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError(f"no free {digits}-digit port")


def shims(bin_dir: Path, prewarmed: Server | None = None) -> None:
    """`eagle3kit` and `python` as the interpreter running the tests; `eagle3kit` through the
    pre-warmed interpreter when there is one."""
    bin_dir.mkdir()
    eagle3kit = f'exec "{sys.executable}" -m eagle3kit'
    if prewarmed is not None:
        eagle3kit = "exec " + " ".join(shlex.quote(word) for word in prewarmed.argv())
    for name, line in (("eagle3kit", eagle3kit), ("python", f'exec "{sys.executable}"')):
        shim = bin_dir / name
        shim.write_text(f'#!/bin/sh\n{line} "$@"\n')
        shim.chmod(0o755)


@pytest.fixture(scope="session")
def prewarmed() -> Server | None:
    """The worker's pre-warmed interpreter, the one every other test's commands go through
    (None with EAGLE3KIT_DOCS_FRESH=1 or EAGLE3KIT_TESTS_FRESH=1: each command fresh)."""
    if os.environ.get("EAGLE3KIT_DOCS_FRESH", "") not in ("", "0"):
        return None
    return prewarmed_server.shared()


def checkout_like(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    shutil.copytree(
        REPO / "examples", work / "examples", ignore=shutil.ignore_patterns("__pycache__")
    )
    (work / "tests").mkdir()
    (work / "tests" / "data").symlink_to(REPO / "tests" / "data")
    (work / "testkit").mkdir()
    (work / "testkit" / "fakeserver.py").symlink_to(REPO / "testkit" / "fakeserver.py")
    return work


def doc_env(bin_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE3KIT_")}
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        COLUMNS="100",
        PYTHONPATH=str(REPO),
    )
    return env


def run_page(
    doc: Path,
    tmp_path: Path,
    prewarmed: Path | None,
    timeout: int = 600,
    finished: FinishedQuickstart | None = None,
) -> tuple[Path, list[tuple[Command, subprocess.CompletedProcess]]]:
    """Run every command of `doc` in order, one torch thread, in a checkout-like directory.

    Each must end with the status the page gives; a refused input with one message and no
    traceback. With `finished`, the session's full quickstart is copied in first as
    ./eagle3kit-quickstart (the page's `eagle3kit quickstart` then finds it done: the full
    run is the session's one). Returns the work directory and each command with its
    finished process, for the page's own checks.
    """
    work = checkout_like(tmp_path)
    if finished is not None:
        finished.copy_to(work / QUICKSTART_DIR)
    shims(tmp_path / "bin", prewarmed)
    env = {**doc_env(tmp_path / "bin"), "OMP_NUM_THREADS": "1"}
    ran = []
    for cmd in commands(doc):
        proc = subprocess.run(
            ["bash", "-c", cmd.text],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        # A torchrun rank's own message sits far above the other ranks' tracebacks.
        errors = "\n".join(line for line in proc.stderr.splitlines() if "error: " in line)
        assert proc.returncode == cmd.status, (
            f"{doc.name}:{cmd.line}: `{cmd.text}` exited {proc.returncode}, the doc says "
            f"{cmd.status}\n--- error lines\n{errors[-3000:]}\n--- stdout\n"
            f"{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
        )
        if cmd.status == 2:
            assert "Traceback" not in proc.stderr and proc.stderr.count("error: ") == 1
        ran.append((cmd, proc))
    return work, ran


def refresh(doc: Path, servers: DocServers, root: Path = Path("/tmp/eagle3kit")) -> str:
    """The doc with every `console` block's output lines replaced by what its commands print
    (stdout and stderr as a terminal interleaves them), run in `root` like the test does."""
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    for name in ("examples",):
        shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "tests").mkdir()
    (root / "tests" / "data").symlink_to(REPO / "tests" / "data")
    (root / "testkit").mkdir()
    (root / "testkit" / "fakeserver.py").symlink_to(REPO / "testkit" / "fakeserver.py")
    bin_dir = root.parent / f"{root.name}-bin"
    shutil.rmtree(bin_dir, ignore_errors=True)
    shims(bin_dir)
    env = {**doc_env(bin_dir), "PYTHONUNBUFFERED": "1"}
    text = doc.read_text()
    pieces, end = [], 0
    for m in FENCE.finditer(text):
        lang, body = m.group(1).lower(), m.group(2)
        if lang not in RUN_LANGS:
            continue
        lines = []
        for line in body.splitlines():
            stripped = line.strip()
            if lang == "console" and not stripped.startswith("$ "):
                continue  # old output
            lines.append(line)
            if lang != "console" and (not stripped or stripped.startswith("#")):
                continue
            command = stripped[2:] if lang == "console" else stripped
            if BACKGROUND.search(command):
                said = servers.launch(command, root, env)
                lines += [said] if lang == "console" else []
                continue
            for part, status in split_command(command):
                proc = subprocess.run(
                    ["bash", "-c", servers.substitute(part)],
                    cwd=root,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    timeout=600,
                )
                if proc.returncode != status:
                    print(
                        f"{doc.name}: `{part}` exited {proc.returncode}, not {status}",
                        file=sys.stderr,
                    )
                if lang == "console":
                    output = servers.restore(proc.stdout).rstrip("\n").splitlines()
                    lines += [line.rstrip() for line in output]
        new_body = "".join(f"{line}\n" for line in lines)
        pieces += [text[end : m.start(2)], new_body]
        end = m.end(2)
    servers.stop_launched()
    return "".join(pieces) + text[end:]

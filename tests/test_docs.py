"""The documentation runs: every command it shows, and the example data it ships.

Each Markdown file's `console`, `bash`, `sh` and `shell` code blocks are run in order, in a
fresh temp directory laid out like a checkout (a copy of examples/, and tests/data/), because
later commands use what earlier ones wrote. In `console` blocks the commands are the lines
starting with "$ " (the rest is output, not checked); in the others every line that is not a
comment is a command. `&&` chains are split and run one by one; `pip install` and
`python -m pytest` parts are skipped (the first is the set-up, the second is this test suite).

A command must exit 0 unless its line ends with a comment such as `# exits 2`. `eagle3kit`
and `python` resolve to the interpreter running the tests. Text blocks (```text) are
transcripts that cannot run here (an interrupted run, a full disk) and are not executed;
```launch blocks hold the SGLang and vLLM launch lines, checked by test_launch_lines.py.

Servers. The docs point `eagle3kit gen` at servers on fixed loopback addresses, the ones a
user would type: `http://127.0.0.1:PORT` with PORT a key of DOC_SERVERS. For each such port a
doc uses, the test starts a stand-in server (tests/fakeserver.py, with the Qwen3 tokenizer)
on a free port it picks, and substitutes that port for the documented one in the command
before running it; a loopback port the table does not know fails the test. So the docs show
the usual SGLang (30000) and vLLM (8000) ports, and two test runs never collide. A doc may also
start the stand-in itself, as a user would, with a command ending in `&` (the README's
`python tests/fakeserver.py ... --port 30000 ... &`): the test runs it in the background on a
free port of its own, waits for the line the server prints once it listens (that line is the
command's output), points the page's later commands at it, and stops it after the page.

Speed. `eagle3kit` runs in a process forked from a pre-warmed interpreter that has already
imported eagle3kit and transformers (the import is most of a short command's time); each
command still gets a fresh process, its own argv, environment, working directory and stdio.
Signals sent to the `eagle3kit` process do not reach such a command (the docs send none).
EAGLE3KIT_DOCS_FRESH=1 runs a new interpreter per command instead. A set-up command of
CACHED_SETUP (deterministic and offline, e.g. rebuilding the Qwen3 tokenizer) runs once per
session; later docs get a copy of what it made.

Outputs shown in `console` blocks are real: `python tests/test_docs.py FILE...` runs each
file's commands the same way (in /tmp/eagle3kit, fresh processes) and rewrites the output
lines of its `console` blocks with what they print, the documented ports put back.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Pages whose commands need their own set-up (tiny models, trained runs, stand-in servers)
# run in their own modules, each of which checks that every command of its page ran.
OWN_DOC_TESTS = {
    "extract.md": "test_docs_extract.py",
    "train.md": "test_docs_train.py",
    "export.md": "test_docs_export.py",
    "info-checkpoints.md": "test_docs_export.py",
    "bench.md": "test_docs_bench.py",
    "plan.md": "test_docs_plan.py",
    "quickstart.md": "test_docs_quickstart.py",
    "vllm-cpu.md": "vllm/test_vllm_docs.py",  # the `vllm` tier: against the real engine
}
DOCS = [REPO / "README.md", *(p for p in sorted((REPO / "docs").glob("*.md"))
                              if p.name not in OWN_DOC_TESTS)]
RUN_LANGS = {"console", "bash", "sh", "shell"}
FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
EXPECT = re.compile(r"\s+#\s*exits\s+(\d+)\s*$")
SKIPPED = ("pip install ", "python -m pytest")
TEST_COMMAND = "pip install torch==2.13.0 && pip install -e '.[test,trackers]' && python -m pytest"
MAIN_COMMAND = "pip install torch==2.13.0 && pip install -e . && eagle3kit quickstart"
LOOPBACK = re.compile(r"\b127\.0\.0\.1:(\d+)\b")
BACKGROUND = re.compile(r"\s+&\s*$")
"""A command the docs start in the background: a server the later commands talk to."""
PORT_FLAG = re.compile(r"--port (\d+)\b")
CACHED_SETUP = {
    "python examples/make_tiny.py --save-tokenizer qwen3-tokenizer": ("qwen3-tokenizer",),
}
"""Set-up command -> the paths (relative to the work directory) it makes."""


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
    30005: StandIn("sglang", "an SGLang server behind an API key",
                   {"api_key": "sk-docs-example"}),
    8000: StandIn("vllm", "a vLLM server"),
    8001: StandIn("vllm", "a vLLM server that reports one completion token more than it returns",
                  {"faults": {"count_delta": 1}}),
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
            found += [Command(first + offset, part, status)
                      for part, status in split_command(line)]
    return found


def doc_ports(text: str) -> set[int]:
    return {int(port) for port in LOOPBACK.findall(text)}


# Stand-in servers ----------------------------------------------------------------------------
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
            self.ports[documented] = self._start(DOC_SERVERS[documented],
                                                 len(str(documented)))
        return self.ports[documented]

    def substitute(self, text: str) -> str:
        return LOOPBACK.sub(lambda m: f"127.0.0.1:{self.port(int(m.group(1)))}", text)

    def restore(self, text: str) -> str:
        """Output as it reads with the servers on their documented ports."""
        back = {real: doc for doc, real in {**self.ports, **self.launched}.items()}
        return LOOPBACK.sub(lambda m: f"127.0.0.1:{back.get(int(m.group(1)), m.group(1))}",
                            text)

    def _start(self, spec: StandIn, digits: int) -> int:
        port = _free_port(digits)
        if spec.api is None:
            return port  # nothing listens: connections are refused
        from fakeserver import FakeServer, HFTokenizer

        if self._tokenizer is None:
            from tokenizers import Tokenizer

            self._tokenizer = HFTokenizer(
                Tokenizer.from_file(str(self.tokenizer_dir / "tokenizer.json")))
        server = FakeServer(spec.api, port=port, tokenizer=self._tokenizer,
                            record_bodies=False, **spec.options).start()
        self._running.append(server)
        return server.port

    def launch(self, command: str, cwd: Path, env: dict[str, str], timeout: float = 120
               ) -> str:
        """Start a documented `SERVER --port N ... &` on a free port; return what it prints
        once it listens, as it reads with the documented port."""
        documented = [int(p) for p in PORT_FLAG.findall(command)]
        assert documented, f"a background command names no --port: {command}"
        for port in documented:
            self.launched[port] = _free_port(len(str(port)))
        text = PORT_FLAG.sub(lambda m: f"--port {self.launched[int(m.group(1))]}",
                             BACKGROUND.sub("", command))
        log = Path(tempfile.mkdtemp(prefix="e3k-doc-server-")) / "log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(["bash", "-c", f"exec {self.substitute(text)}"], cwd=cwd,
                                    env=env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT)
        self._processes.append(proc)
        deadline = time.monotonic() + timeout
        while " on http://" not in (said := log.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, (
                f"`{command}` did not say where it listens:\n{said}")
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


def _free_port(digits: int) -> int:
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


# Running commands ------------------------------------------------------------------------------
class SetupCache:
    """CACHED_SETUP commands run once; later runs get a copy of what they made."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.done: set[str] = set()

    def replay(self, command: str, work: Path) -> bool:
        if command not in self.done:
            return False
        for name in CACHED_SETUP[command]:
            shutil.copytree(self.root / name, work / name, dirs_exist_ok=True)
        return True

    def record(self, command: str, work: Path) -> None:
        if command in CACHED_SETUP:
            for name in CACHED_SETUP[command]:
                shutil.copytree(work / name, self.root / name, dirs_exist_ok=True)
            self.done.add(command)


PREWARM_CLIENT = """\
import json, os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["EAGLE3KIT_DOCS_PREWARMED"])
body = json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
socket.send_fds(s, [len(body).to_bytes(8, "big")], [0, 1, 2])
s.sendall(body)
code = b""
while len(code) < 4:
    chunk = s.recv(4 - len(code))
    if not chunk:
        sys.exit(1)
    code += chunk
sys.exit(int.from_bytes(code, "big", signed=True))
"""


def _shims(bin_dir: Path, prewarmed: Path | None = None) -> None:
    """`eagle3kit` and `python` as the interpreter running the tests; `eagle3kit` through the
    pre-warmed interpreter when there is one."""
    bin_dir.mkdir()
    eagle3kit = f'exec "{sys.executable}" -m eagle3kit'
    if prewarmed is not None:
        client = bin_dir / "prewarmed_client.py"
        client.write_text(PREWARM_CLIENT)
        eagle3kit = (f'EAGLE3KIT_DOCS_PREWARMED="{prewarmed}" exec "{sys.executable}" -S '
                     f'"{client}"')
    for name, line in (("eagle3kit", eagle3kit), ("python", f'exec "{sys.executable}"')):
        shim = bin_dir / name
        shim.write_text(f'#!/bin/sh\n{line} "$@"\n')
        shim.chmod(0o755)


def serve_prewarmed(path: str) -> None:
    """The pre-warmed interpreter: import what `eagle3kit` commands import, then fork one
    child per connection to run one command with the caller's stdio, argv, cwd and env."""
    import jinja2  # noqa: F401
    import torch  # noqa: F401
    from transformers import AutoTokenizer  # noqa: F401  (transformers imports lazily)

    import eagle3kit.cli
    import eagle3kit.gen
    import eagle3kit.gen.scheduler
    import eagle3kit.gen.servers

    server = socket.socket(socket.AF_UNIX)
    server.bind(path + ".tmp")
    server.listen(64)
    os.rename(path + ".tmp", path)  # the path appears only once connections are accepted
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    sys.stdout.flush()
    sys.stderr.flush()
    while True:
        conn, _ = server.accept()
        if os.fork() == 0:
            server.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _run_forwarded(conn, eagle3kit.cli.main)
        conn.close()


def _run_forwarded(conn: socket.socket, main) -> None:
    head, fds, _, _ = socket.recv_fds(conn, 8, 3)
    size, body = int.from_bytes(head, "big"), b""
    while len(body) < size:
        body += conn.recv(size - len(body))
    request = json.loads(body)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = ["eagle3kit", *request["argv"]]
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # a traceback is what the user would see: show it, exit 1
        import traceback

        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError):
            stream.flush()
    conn.sendall(code.to_bytes(4, "big", signed=True))
    os._exit(code)


@pytest.fixture(scope="session")
def qwen3_dir(tmp_path_factory) -> Path:
    from real_tokenizers import qwen3_tokenizer_dir

    return qwen3_tokenizer_dir(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session")
def doc_servers(qwen3_dir) -> Iterator[DocServers]:
    servers = DocServers(qwen3_dir)
    yield servers
    servers.stop()


@pytest.fixture(scope="session")
def setup_cache(tmp_path_factory) -> SetupCache:
    return SetupCache(tmp_path_factory.mktemp("setup-cache"))


@pytest.fixture(scope="session")
def prewarmed(tmp_path_factory) -> Iterator[Path | None]:
    if os.environ.get("EAGLE3KIT_DOCS_FRESH", "") not in ("", "0"):
        yield None
        return
    sock = Path(tempfile.mkdtemp(prefix="e3k-docs-")) / "prewarmed.sock"  # short: AF_UNIX
    log = tmp_path_factory.mktemp("prewarmed") / "log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE3KIT_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "tests")])
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, __file__, "--serve-prewarmed", str(sock)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env)
    deadline = time.monotonic() + 120
    while not sock.exists():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    yield sock
    proc.kill()
    proc.wait()
    shutil.rmtree(sock.parent, ignore_errors=True)


def _checkout_like(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    shutil.copytree(
        REPO / "examples", work / "examples", ignore=shutil.ignore_patterns("__pycache__")
    )
    (work / "tests").mkdir()
    (work / "tests" / "data").symlink_to(REPO / "tests" / "data")
    (work / "tests" / "fakeserver.py").symlink_to(REPO / "tests" / "fakeserver.py")
    return work


def _doc_env(bin_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE3KIT_")}
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        COLUMNS="100",
        PYTHONPATH=str(REPO),
    )
    return env


def run_page(doc: Path, tmp_path: Path, prewarmed: Path | None, timeout: int = 600
             ) -> tuple[Path, list[tuple[Command, subprocess.CompletedProcess]]]:
    """Run every command of `doc` in order, one torch thread, in a checkout-like directory.

    Each must end with the status the page gives; a refused input with one message and no
    traceback. Returns the work directory and each command with its finished process, for
    the page's own checks.
    """
    work = _checkout_like(tmp_path)
    _shims(tmp_path / "bin", prewarmed)
    env = {**_doc_env(tmp_path / "bin"), "OMP_NUM_THREADS": "1"}
    ran = []
    for cmd in commands(doc):
        proc = subprocess.run(["bash", "-c", cmd.text], cwd=work, env=env, capture_output=True,
                              text=True, timeout=timeout)
        # A torchrun rank's own message sits far above the other ranks' tracebacks.
        errors = "\n".join(line for line in proc.stderr.splitlines() if "error: " in line)
        assert proc.returncode == cmd.status, (
            f"{doc.name}:{cmd.line}: `{cmd.text}` exited {proc.returncode}, the doc says "
            f"{cmd.status}\n--- error lines\n{errors[-3000:]}\n--- stdout\n"
            f"{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}")
        if cmd.status == 2:
            assert "Traceback" not in proc.stderr and proc.stderr.count("error: ") == 1
        ran.append((cmd, proc))
    return work, ran


# These pages run many tokenizer-loading commands (a minute or more each on 2 cores), and the
# README the whole quickstart (tests/test_quickstart.py runs a reduced one by default): they run
# in the slow suite (`pytest -m slow`), so the default run stays within its time budget.
SLOW_DOCS = {"README.md", "docs/convert.md", "docs/gen.md", "docs/running-at-scale.md",
             "docs/troubleshooting.md"}


def _doc_param(doc: Path):
    name = str(doc.relative_to(REPO))
    marks = [pytest.mark.slow] if name in SLOW_DOCS else []
    if name == "README.md":  # its quickstart alone takes 4-5 minutes on a busy 2-core machine
        marks.append(pytest.mark.timeout(1800))
    return pytest.param(doc, id=name, marks=marks)


@pytest.mark.parametrize("doc", [_doc_param(d) for d in DOCS])
def test_doc_commands_run(doc: Path, tmp_path: Path, request) -> None:
    cmds = commands(doc)
    if doc.name == "index.md":  # a map of the other pages
        assert not cmds
        return
    assert cmds, f"{doc.name}: no runnable commands found"
    unknown = doc_ports(" ".join(c.text for c in cmds)) - DOC_SERVERS.keys()
    assert not unknown, f"{doc.name}: loopback ports {sorted(unknown)} are not in DOC_SERVERS"
    work = _run_commands(doc, cmds, tmp_path, request)
    if doc.name == "README.md":
        assert not_ignored(work) == [], "the README's commands leave files git would list"


def _run_commands(doc: Path, cmds: list[Command], tmp_path: Path, request) -> Path:
    """Run `cmds` of `doc` in order in a checkout-like directory; return that directory."""
    servers = request.getfixturevalue("doc_servers") if doc_ports(
        " ".join(c.text for c in cmds)) else None
    cache: SetupCache = request.getfixturevalue("setup_cache")
    work = _checkout_like(tmp_path)
    _shims(tmp_path / "bin", request.getfixturevalue("prewarmed"))
    env = _doc_env(tmp_path / "bin")
    try:
        for cmd in cmds:
            if BACKGROUND.search(cmd.text):
                assert servers is not None, f"{doc.name}:{cmd.line}: a server for no command"
                servers.launch(cmd.text, work, env)
                continue
            text = servers.substitute(cmd.text) if servers else cmd.text
            if cache.replay(text, work):
                continue
            proc = subprocess.run(["bash", "-c", text], cwd=work, env=env, capture_output=True,
                                  text=True, timeout=1200)
            assert proc.returncode == cmd.status, (
                f"{doc.name}:{cmd.line}: `{text}` exited {proc.returncode}, the doc says "
                f"{cmd.status}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n"
                f"{proc.stderr[-3000:]}")
            cache.record(text, work)
    finally:
        if servers is not None:
            servers.stop_launched()
    return work


def not_ignored(work: Path) -> list[str]:
    """What the commands left in the work directory that .gitignore does not cover: in a
    checkout, `git status` would list it (the README's tour runs in one)."""
    made = sorted(p.name + ("/" if p.is_dir() else "") for p in work.iterdir()
                  if p.name not in ("examples", "tests"))
    if not made:
        return []
    proc = subprocess.run(["git", "-C", str(REPO), "check-ignore", "--no-index", "--stdin"],
                          input="\n".join(made), capture_output=True, text=True)
    ignored = set(proc.stdout.split())
    return [name for name in made if name not in ignored]


@pytest.mark.slow  # ~40 s on a busy 2-core machine; the fast check is the next test
def test_readme_gen_example_runs_against_the_server_line_it_shows(tmp_path, request):
    """The README's gen example as a newcomer runs it: the tokenizer set-up, the stand-in
    server started with the very line the README shows (it must say where it listens), and
    gen against it. What they write is git-ignored (the whole README: its slow doc test)."""
    cmds = commands(REPO / "README.md")
    server = [c for c in cmds if BACKGROUND.search(c.text)]
    assert [c.text for c in server] == [
        "python tests/fakeserver.py --api sglang --port 30000 --tokenizer qwen3-tokenizer &"]
    gen = [c for c in cmds if c.text.startswith("eagle3kit gen ")]
    assert len(gen) == 1 and "--server http://127.0.0.1:30000" in gen[0].text
    setup = [c for c in cmds if c.text in CACHED_SETUP]
    assert setup and cmds.index(setup[0]) < cmds.index(server[0]) < cmds.index(gen[0])
    work = _run_commands(REPO / "README.md", [setup[0], server[0], gen[0]], tmp_path, request)
    assert (work / "mt-bench" / "manifest.json").is_file()
    assert not_ignored(work) == []


def test_the_readmes_server_line_prints_what_the_readme_shows(tmp_path, doc_servers, qwen3_dir):
    """The README's own command starts the stand-in, which says where it listens in the very
    words the README shows under it, then answers; on a port already taken it says so."""
    body = next(body for lang, _, body in code_blocks(REPO / "README.md")
                if lang == "console" and "tests/fakeserver.py" in body)
    lines = body.splitlines()
    at = next(i for i, line in enumerate(lines) if "tests/fakeserver.py" in line)
    command, shown = lines[at][2:], lines[at + 1]
    work = _checkout_like(tmp_path)
    (work / "qwen3-tokenizer").symlink_to(qwen3_dir)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    try:
        assert doc_servers.launch(command, work, env) == shown
        import httpx

        health = f"http://127.0.0.1:{doc_servers.launched[30000]}/health"
        assert httpx.get(health, timeout=10).status_code == 200
    finally:
        doc_servers.stop_launched()
    taken = subprocess.run([sys.executable, str(REPO / "tests" / "fakeserver.py"), "--port",
                            str(doc_servers.port(30000))], capture_output=True, text=True,
                           timeout=60, env=env)
    assert taken.returncode == 1 and taken.stderr.strip().startswith(
        "fakeserver: cannot listen on 127.0.0.1:"), taken.stderr


def test_every_doc_is_checked() -> None:
    for page in (REPO / "docs").glob("*.md"):
        if page.name in OWN_DOC_TESTS:
            assert (REPO / "tests" / OWN_DOC_TESTS[page.name]).is_file(), page.name
    names = {p.name for p in DOCS}
    assert {
        "README.md",
        "format.md",
        "cli.md",
        "info.md",
        "convert.md",
        "gen.md",
        "running-at-scale.md",
        "troubleshooting.md",
        "index.md",
    } <= names


def test_readme_has_exactly_two_setup_commands() -> None:
    setup = [
        body.strip()
        for lang, _, body in code_blocks(REPO / "README.md")
        if lang in RUN_LANGS and "pip install" in body
    ]
    assert setup == [MAIN_COMMAND, TEST_COMMAND]


def test_ci_runs_the_readme_test_command() -> None:
    lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert TEST_COMMAND in lines


def test_every_gen_option_is_documented() -> None:
    """docs/gen.md has a section for each option `eagle3kit gen --help` lists."""
    from typer.main import get_command

    from eagle3kit.cli import app

    gen = get_command(app).commands["gen"]
    flags = {opt for param in gen.params for opt in param.opts if opt.startswith("--")}
    page = (REPO / "docs" / "gen.md").read_text()
    missing = sorted(f for f in flags - {"--help"} if f"`{f}" not in page)
    assert not missing, f"docs/gen.md does not describe {missing}"


def test_make_tiny_regenerates_tiny_jsonl(tmp_path: Path) -> None:
    out = tmp_path / "tiny.jsonl"
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples" / "make_tiny.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == (REPO / "examples" / "tiny.jsonl").read_bytes()


def test_tiny_jsonl_stays_small() -> None:
    data = (REPO / "examples" / "tiny.jsonl").read_bytes()
    assert len(data) < 100_000
    assert 10 <= data.count(b"\n") <= 16


def test_extraction_rules() -> None:
    body = "$ a && pip install x && b  # exits 2\noutput line\n$ c\n"
    assert block_commands("console", body) == [(0, "a && pip install x && b  # exits 2"), (2, "c")]
    assert block_commands("bash", "# comment\n\nx y\n") == [(2, "x y")]
    assert split_command("a && pip install x && b  # exits 2") == [("a", 0), ("b", 2)]


def test_documented_ports_are_substituted() -> None:
    servers = DocServers(Path("unused"))
    servers.ports = {30000: 41234, 8000: 41235}
    text = "eagle3kit gen p.jsonl out --server http://127.0.0.1:30000@64 --server 127.0.0.1:8000"
    moved = servers.substitute(text)
    assert moved.endswith("http://127.0.0.1:41234@64 --server 127.0.0.1:41235")
    assert servers.restore(moved) == text
    assert doc_ports(text) == {30000, 8000}


# Refreshing the outputs shown in the docs ---------------------------------------------------------
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
    (root / "tests" / "fakeserver.py").symlink_to(REPO / "tests" / "fakeserver.py")
    bin_dir = root.parent / f"{root.name}-bin"
    shutil.rmtree(bin_dir, ignore_errors=True)
    _shims(bin_dir)
    env = {**_doc_env(bin_dir), "PYTHONUNBUFFERED": "1"}
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
                proc = subprocess.run(["bash", "-c", servers.substitute(part)], cwd=root, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      timeout=600)
                if proc.returncode != status:
                    print(f"{doc.name}: `{part}` exited {proc.returncode}, not {status}",
                          file=sys.stderr)
                if lang == "console":
                    output = servers.restore(proc.stdout).rstrip("\n").splitlines()
                    lines += [line.rstrip() for line in output]
        new_body = "".join(f"{line}\n" for line in lines)
        pieces += [text[end:m.start(2)], new_body]
        end = m.end(2)
    servers.stop_launched()
    return "".join(pieces) + text[end:]


def main(argv: list[str]) -> None:
    if argv[:1] == ["--serve-prewarmed"]:
        serve_prewarmed(argv[1])
        return
    sys.path.insert(0, str(REPO / "tests"))
    from real_tokenizers import qwen3_tokenizer_dir

    tok_root = Path(tempfile.mkdtemp(prefix="e3k-tok-"))
    servers = DocServers(qwen3_tokenizer_dir(tok_root))
    try:
        for name in argv:
            doc = Path(name).resolve()
            doc.write_text(refresh(doc, servers))
            print(f"refreshed {name}", file=sys.stderr)
    finally:
        servers.stop()
        shutil.rmtree(tok_root, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])

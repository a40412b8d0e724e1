"""`eagle3kit` commands forked from a pre-warmed interpreter: one process per test worker
imports torch, transformers and eagle3kit once, then forks a child for each command.

Importing torch and transformers costs a fresh `python -m eagle3kit` ~2.5 s of CPU; the tests
run a few hundred such commands, so the default tier spent about a third of its time
importing. A forked child is still a process of its own, with the caller's argv, working
directory, environment and stdio (passed over a Unix socket), its own exit status, and no
state shared with the test; it ends when its caller does (a test's timeout kills the caller,
and the child follows within milliseconds).

`script_argv(path)` runs a Python script the same way (the benchmarks' `--help`).

What it is not: the caller's pid is the client's, not the command's, so a test that sends
the command a signal it handles (SIGTERM, SIGINT) or limits its resources starts
`python -m eagle3kit` itself. SIGKILL is the exception: `kill(proc)` SIGKILLs the client,
the command dies of SIGKILL a few milliseconds later (no handler of its own can run), and
`kill` returns once it is gone (its pid is in a file the client writes before the command
may start). `argv()` is how the other tests start a command:

    subprocess.run([*prewarmed.argv(), "validate", str(path)], capture_output=True, text=True)

Set EAGLE3KIT_TESTS_FRESH=1 to start every command fresh instead (the same tests, slower).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import runpy
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CLIENT = """\
import json, os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
body = json.dumps({"argv": sys.argv[2:], "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
socket.send_fds(s, [len(body).to_bytes(8, "big")], [0, 1, 2])
s.sendall(body)
def receive(n):
    got = b""
    while len(got) < n:
        chunk = s.recv(n - len(got))
        if not chunk:
            sys.exit(1)
        got += chunk
    return got
pids = os.path.join(os.path.dirname(sys.argv[1]), "pids")
mine = os.path.join(pids, str(os.getpid()))
with open(mine + ".tmp", "w") as f:
    f.write(str(int.from_bytes(receive(4), "big")))
os.rename(mine + ".tmp", mine)
s.sendall(b"g")
code = int.from_bytes(receive(4), "big", signed=True)
os.unlink(mine)
sys.exit(code)
"""
"""The caller: sends its argv, cwd, environment and stdio; writes the command's pid to
pids/<its own pid> before letting the command start; exits with the command's status."""


class Server:
    """A running pre-warmed interpreter and the client that talks to it."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="e3k-prewarmed-"))  # short: AF_UNIX paths
        self.sock = self.dir / "sock"
        self.client = self.dir / "client.py"
        self.client.write_text(CLIENT)
        (self.dir / "pids").mkdir()
        log = self.dir / "log"
        server_env = dict(os.environ if env is None else env)
        server_env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(REPO), str(REPO / "testkit"), server_env.get("PYTHONPATH")])
        )
        with open(log, "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, __file__, str(self.sock)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                env=server_env,
            )
        deadline = time.monotonic() + 120
        while not self.sock.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the pre-warmed interpreter did not start:\n{log.read_text()}")
            time.sleep(0.05)

    def argv(self) -> list[str]:
        return [sys.executable, "-S", str(self.client), str(self.sock)]

    def command_pid(self, client_pid: int) -> int | None:
        """The pid of the command a client started; None if it never let one start."""
        try:
            return int((self.dir / "pids" / str(client_pid)).read_text())
        except FileNotFoundError:
            return None

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


_server: Server | None = None


SCRIPT = "--prewarmed-script"
"""Marks a request to run a Python script (`script_argv`) rather than `eagle3kit`."""


def argv() -> list[str]:
    """The command line that starts `eagle3kit` (append its arguments): through this
    process's pre-warmed interpreter, started on first use."""
    server = shared()
    return [sys.executable, "-m", "eagle3kit"] if server is None else server.argv()


def script_argv(script: Path) -> list[str]:
    """The command line that runs `python SCRIPT` (append its arguments), the same way."""
    server = shared()
    return (
        [sys.executable, str(script)] if server is None else [*server.argv(), SCRIPT, str(script)]
    )


def kill(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """SIGKILL the command `proc` started (through `argv()` or fresh) and wait until it is
    gone. Through the pre-warmed interpreter, the client is killed and its command kills
    itself with SIGKILL when the connection drops (milliseconds later); a client killed
    before it wrote its command's pid never let the command start."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    server = _server
    command = server.command_pid(proc.pid) if server is not None else None
    if server is None or command is None:
        return
    (server.dir / "pids" / str(proc.pid)).unlink()
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.kill(command, 0)  # the server's children are reaped by the kernel: no zombie
        except ProcessLookupError:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the command of client {proc.pid} (pid {command}) outlived it")
        time.sleep(0.001)


def shared() -> Server | None:
    """This process's pre-warmed interpreter, started on first use; None where
    EAGLE3KIT_TESTS_FRESH=1 asks for fresh commands."""
    global _server
    if os.environ.get("EAGLE3KIT_TESTS_FRESH", "") not in ("", "0"):
        return None
    if _server is None or _server.process.poll() is not None:
        _server = Server({k: v for k, v in os.environ.items() if not k.startswith("EAGLE3KIT_")})
        atexit.register(_server.stop)
    return _server


# The server side ----------------------------------------------------------------------------


def serve(path: str) -> None:
    """Import what `eagle3kit` commands import, then fork one child per connection to run one
    command with the caller's stdio, argv, cwd and environment."""
    import jinja2  # noqa: F401
    import torch  # noqa: F401
    from transformers import AutoTokenizer, LlamaForCausalLM  # noqa: F401  (lazy otherwise)

    import eagle3kit.cli
    import eagle3kit.gen
    import eagle3kit.gen.scheduler
    import eagle3kit.gen.servers

    threading.Thread(target=_end_with_the_parent, args=(os.getppid(),), daemon=True).start()
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


def _end_with_the_parent(parent: int) -> None:
    """A test worker that ends without stopping its server (xdist need not run atexit) leaves
    no interpreter behind: the server goes once its parent has."""
    while os.getppid() == parent:
        time.sleep(1)
    os._exit(0)


def _end_with_the_caller(conn: socket.socket) -> None:
    """The caller sends nothing after its request: the connection closing means it is gone
    (a test's timeout killed it), and the command goes with it."""
    with contextlib.suppress(OSError):
        conn.recv(1)
    os.kill(os.getpid(), signal.SIGKILL)


def _run_forwarded(conn: socket.socket, eagle3kit_main: Callable[[], object]) -> None:
    head, fds, _, _ = socket.recv_fds(conn, 8, 3)
    size, body = int.from_bytes(head, "big"), b""
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            os._exit(1)  # the caller is gone before it asked for anything
        body += chunk
    request = json.loads(body)
    # The caller writes this pid where `kill` finds it, then says go: a caller killed before
    # that never has a command running behind it.
    conn.sendall(os.getpid().to_bytes(4, "big"))
    if conn.recv(1) != b"g":
        os._exit(1)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:  # read by OpenMP when torch loaded, not now
        import torch

        torch.set_num_threads(int(threads))
    args = request["argv"]
    main = eagle3kit_main
    if args[:1] == [SCRIPT]:  # `python SCRIPT ...`: its folder first on the path, as python does
        sys.argv = args[1:]
        sys.path.insert(0, str(Path(args[1]).resolve().parent))
        main = partial(runpy.run_path, args[1], run_name="__main__")
    else:
        sys.argv = ["eagle3kit", *args]
    threading.Thread(target=_end_with_the_caller, args=(conn,), daemon=True).start()
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


if __name__ == "__main__":
    serve(sys.argv[1])

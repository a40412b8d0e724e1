"""A loopback stand-in for vLLM serving `extract_hidden_states` (SERVER_APIS.md §7).

It answers `GET /v1/models` and `POST /v1/completions` as vLLM does with the method
`extract_hidden_states` and a hidden-states connector: the prompt's states at the configured
`eagle_aux_hidden_state_layer_ids` (boundary ids; id N is the last layer's output before the
final norm) go to `<storage>/<request id>.safetensors` (`hidden_states [T, L, H]`,
`token_ids [T]`), written while the connector holds an flock on `<path>.lock`; the answer's
`kv_transfer_params.hidden_states_path` names the file. The states come from a real
transformers model, one prompt per forward pass, in its own dtype. `GET /health` answers
200; a restart is `stop()`, then a new instance on the same `port`; a stall is
`stall_until`.

A hostile or broken server, for the client's trust boundary: `names(path)` replaces the
path the answer names (any JSON value: another file, a number, the same path again),
`raw_answer` is a 200 body sent as is (not JSON, a JSON list), `api_key` is required as a
bearer token on every endpoint but /health (as `vllm serve --api-key`), and
`reported_storage` is served as the connector's shared_storage_path on
`/server_info?config_format=json` (vLLM with VLLM_SERVER_DEV_MODE=1; 404 otherwise).

    server = FakeVllmHidden(model_dir, storage, layer_ids=[2, 4, 5, 8]).start()
    ... server.url ...
    server.stop()
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch


class FakeVllmHidden:
    def __init__(
        self,
        model_dir: Path,
        storage: Path,
        layer_ids: list[int],
        name: str = "tiny-target",
        write_delay_s: float = 0.0,
        port: int = 0,
    ) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
        self.storage, self.layer_ids, self.name = Path(storage), layer_ids, name
        self.write_delay_s = write_delay_s
        self.storage.mkdir(parents=True, exist_ok=True)
        self.names: Callable[[Path], object] | None = None
        self.raw_answer: bytes | None = None
        self.api_key: str | None = None
        self.reported_storage: str | None = None
        self.requests: list[dict] = []
        self.seen: list[tuple[str, str, str | None]] = []
        """Every request (GET and POST): its method, path and Authorization header."""
        self.stall_until = 0.0
        """Until this time.monotonic(), a request hangs and is dropped unanswered with no file
        written (a stalled engine; vLLM aborts a request whose client went away)."""
        self._forward = threading.Lock()  # one forward pass at a time, as one engine step
        self._server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FakeVllmHidden:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def states(self, ids: list[int]) -> torch.Tensor:
        """[T, L, H]: id k < N from output_hidden_states[k], id N hooked before the norm."""
        base = self.model.model
        captured: dict = {}
        with self._forward, torch.no_grad():
            hook = base.layers[-1].register_forward_hook(
                lambda _m, _i, out: captured.setdefault(
                    "last", out[0] if isinstance(out, tuple) else out
                )
            )
            try:
                out = base(torch.tensor([ids]), output_hidden_states=True)
            finally:
                hook.remove()
        n = len(base.layers)
        layers = [
            captured["last"][0] if k == n else out.hidden_states[k][0] for k in self.layer_ids
        ]
        return torch.stack(layers, dim=1)

    def _write(self, ids: list[int]) -> Path:
        from safetensors.torch import save_file

        path = self.storage / f"{uuid.uuid4().hex}.safetensors"
        lock = Path(f"{path}.lock")
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)

        # The answer goes out while the file is still being written, as with vLLM's async
        # connector: the client must wait on the lock.
        def write() -> None:
            try:
                if self.write_delay_s:
                    threading.Event().wait(self.write_delay_s)
                save_file(
                    {
                        "hidden_states": self.states(ids).contiguous(),
                        "token_ids": torch.tensor(ids),
                    },
                    str(path),
                )
            finally:
                os.close(fd)

        threading.Thread(target=write, daemon=True).start()
        return path

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(
                self, code: int, body: dict | list | None = None, raw: bytes | None = None
            ) -> None:
                data = raw if raw is not None else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _refused(self) -> bool:
                """No or another bearer token where one is required: 401, as vLLM."""
                server.seen.append((self.command, self.path, self.headers.get("Authorization")))
                if (
                    server.api_key is None
                    or self.path == "/health"
                    or self.headers.get("Authorization") == f"Bearer {server.api_key}"
                ):
                    return False
                self._send(401, {"error": "Unauthorized"})
                return True

            def do_GET(self) -> None:
                if self._refused():
                    return
                if self.path == "/health":
                    self._send(200, {})
                elif self.path == "/server_info?config_format=json" and server.reported_storage:
                    self._send(
                        200,
                        {
                            "vllm_config": {
                                "kv_transfer_config": {
                                    "kv_connector": "ExampleHiddenStatesConnector",
                                    "kv_connector_extra_config": {
                                        "shared_storage_path": server.reported_storage
                                    },
                                }
                            }
                        },
                    )
                elif self.path == "/v1/models":
                    self._send(
                        200,
                        {
                            "object": "list",
                            "data": [{"id": server.name, "object": "model", "max_model_len": 2048}],
                        },
                    )
                else:
                    self._send(404, {"error": "not found"})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self._refused():
                    return
                server.requests.append(body)
                stalled = server.stall_until - time.monotonic()
                if stalled > 0:
                    time.sleep(stalled)
                    self.close_connection = True
                    return
                if self.path != "/v1/completions" or body.get("model") != server.name:
                    self._send(404, {"error": {"message": "The model does not exist."}})
                    return
                if server.raw_answer is not None:
                    self._send(200, raw=server.raw_answer)
                    return
                ids = body["prompt"]
                path = server._write(ids)
                named = server.names(path) if server.names else str(path)
                self._send(
                    200,
                    {
                        "id": f"cmpl-{uuid.uuid4().hex}",
                        "object": "text_completion",
                        "model": server.name,
                        "choices": [
                            {
                                "index": 0,
                                "text": "x",
                                "finish_reason": "length",
                                "token_ids": [0],
                                "prompt_token_ids": ids,
                            }
                        ],
                        "usage": {
                            "prompt_tokens": len(ids),
                            "completion_tokens": 1,
                            "total_tokens": len(ids) + 1,
                        },
                        "kv_transfer_params": {"hidden_states_path": named},
                    },
                )

        return Handler

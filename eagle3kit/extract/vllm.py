"""`extract --engine vllm`: hidden states from a vLLM server, for targets transformers
cannot host in one process (a 1T MoE on 8 GPUs).

The server runs the `extract_hidden_states` speculative method with
`eagle_aux_hidden_state_layer_ids` set to the aux ids followed by N (the last layer's
pre-norm output) and a hidden-states connector writing to a filesystem this process also
sees (SERVER_APIS.md §7). For each sample we send its ids as the prompt with
`max_tokens: 1`; the response's `kv_transfer_params.hidden_states_path` names a
safetensors file (`hidden_states [T, L, H]`, `token_ids [T]`) that is complete once its
`<path>.lock` can be locked. We read it, check it, and delete it; the path is checked
first, against the storage folder the user names (eagle3kit._served_files).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from eagle3kit._served_files import FLAG, StorageDir
from eagle3kit._urls import bearer_header
from eagle3kit.errors import UserError

ATTEMPTS = 4
"""Tries per request: connection errors and 5xx answers are retried, with backoff."""
FILE_WAIT_S = 120.0
"""How long the file (and its lock) may take to appear on a shared filesystem."""


class ServerError(UserError):
    """The server cannot give what extract needs: one message naming the server and the fix."""


class ServerUnreachable(ServerError):
    """Connection errors or 5xx answers on every attempt: the server is down, restarting or
    stalled. extract stops on it; `train --online --server` pauses that server instead."""


class BadFile(ServerError):
    """The named file is not a readable hidden-state file: written by a server that died
    mid-write, or not vLLM's format."""


@dataclass
class VllmEngine:
    url: str
    model: str
    layers: list[int]
    hidden_size: int
    client: Any
    pool: ThreadPoolExecutor
    timeout: float
    storage: StorageDir
    """The folder the server's files must be in (--hidden-states-dir)."""
    attempts: int = ATTEMPTS
    """Tries per request before ServerUnreachable (train pauses the server at the first)."""

    @classmethod
    def connect(cls, cfg: Any, target: Any, layers: list[int]) -> VllmEngine:
        return cls.open(
            str(cfg.server),
            cfg.model,
            layers,
            target.hidden_size,
            cfg.concurrency,
            cfg.request_timeout,
            StorageDir(cfg.hidden_states_dir),
            api_key=cfg.api_key,
        )

    @classmethod
    def open(
        cls,
        url: str,
        model: str | None,
        layers: list[int],
        hidden_size: int,
        concurrency: int,
        timeout: float,
        storage: StorageDir,
        attempts: int = ATTEMPTS,
        api_key: str | None = None,
    ) -> VllmEngine:
        """Connect to one server: its model named (or asked for), prefix caching refused,
        its storage folder (where it says) the one given."""
        import httpx

        url = url.rstrip("/")
        headers = bearer_header(api_key)
        client = httpx.Client(timeout=timeout, headers=headers)
        try:
            model = model or _served_model(client, url)
            _refuse_prefix_caching(client, url)
            _check_storage(client, url, storage)
        except BaseException:
            client.close()
            raise
        return cls(
            url,
            model,
            layers,
            hidden_size,
            client,
            ThreadPoolExecutor(concurrency, thread_name_prefix="eagle3kit-vllm"),
            timeout,
            storage,
            attempts,
        )

    def states(self, ids: list[np.ndarray]) -> Iterator[tuple[np.ndarray, np.ndarray] | None]:
        """Per sample (aux [T, n*H], last [T, H]) as float32, in order; None when not finite."""
        yield from self.pool.map(self.fetch, ids)

    def healthy(self) -> bool:
        """GET /health answers 200 (vLLM: 503 once the engine is dead)."""
        import httpx

        try:
            return self.client.get(f"{self.url}/health", timeout=5.0).status_code == 200
        except httpx.HTTPError:
            return False

    def recheck(self) -> None:
        """After a restart: the same model is served, prefix caching is still off, and the
        storage folder (where it says) is still the one given (a ServerError saying what
        changed, else nothing)."""
        now = _served_model(self.client, self.url)
        if now != self.model:
            raise ServerError(
                f"--server {self.url}: now serves {now!r}, not {self.model!r} "
                "(the model this run started with)"
            )
        _refuse_prefix_caching(self.client, self.url)
        _check_storage(self.client, self.url, self.storage)

    def fetch(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """One sample's (aux [T, n*H], last [T, H]) float32; None when not finite. The file
        is deleted once read, whatever happens."""
        body = {"model": self.model, "prompt": ids.tolist(), "max_tokens": 1, "temperature": 0.0}
        who = f"--server {self.url}"
        path = self.storage.claim(_named_file(self._post(body), who), who)
        self.storage.wait(path, time.monotonic() + FILE_WAIT_S, who, FILE_WAIT_S)
        # Deleted once read, whatever happens: the server's storage would fill up otherwise.
        with self.storage.reading(path, who, self._most_bytes(len(ids))) as readable:
            return self._read(readable, path, ids)

    def _most_bytes(self, tokens: int) -> int:
        """The largest file a sample of `tokens` can make: float32 states, int64 ids and a
        generous header; anything bigger is refused before it is read into memory."""
        return tokens * ((len(self.layers) + 1) * self.hidden_size * 4 + 8) + (1 << 20)

    def _read(
        self, readable: str, path: str, ids: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray] | None:
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            tensors = load_file(readable)
            states, echoed = tensors["hidden_states"], tensors["token_ids"]
        except (SafetensorError, KeyError, OSError) as exc:
            raise BadFile(f"{path}: not a vLLM hidden-state file ({exc})") from None
        n, want = len(ids), len(self.layers) + 1
        if states.ndim != 3 or states.shape[1] != want or states.shape[2] != self.hidden_size:
            raise ServerError(
                f"--server {self.url}: the file holds states of shape {list(states.shape)}, "
                f"expected [T, {want}, {self.hidden_size}]: launch the server with "
                f"eagle_aux_hidden_state_layer_ids = {[*self.layers, '<N>']} (the aux ids, "
                "then the number of layers, for the last pre-norm state)"
            )
        if states.shape[0] != n or not np.array_equal(echoed.numpy(), ids):
            raise ServerError(
                f"--server {self.url}: the file's token ids are not the ones "
                "sent; turn off prefix caching and chunked prefill on the server"
            )
        states = states.float()
        if not bool(states.isfinite().all()):
            return None
        aux = states[:, :-1].reshape(n, -1).numpy()
        return aux, states[:, -1].numpy()

    def _post(self, body: dict) -> dict:
        import httpx

        for attempt in range(self.attempts):
            try:
                response = self.client.post(f"{self.url}/v1/completions", json=body)
            except httpx.TransportError as exc:
                failure = f"cannot reach it ({exc})"
            else:
                if response.status_code < 400:
                    return _json_object(response, f"--server {self.url}")
                failure = _http_failure(response)
                if response.status_code < 500:
                    break
            if attempt + 1 < self.attempts:
                time.sleep(min(2.0**attempt * 0.5, 10.0))
        else:
            raise ServerUnreachable(f"--server {self.url}: {failure}")
        raise ServerError(f"--server {self.url}: {failure}")

    def close(self) -> None:
        self.pool.shutdown()
        self.client.close()


def _named_file(answer: dict, who: str) -> object:
    """The answer's kv_transfer_params.hidden_states_path, as sent (StorageDir.claim checks
    it); an answer without one is a server launched without the method."""
    params = answer.get("kv_transfer_params")
    if params is not None and not isinstance(params, dict):
        raise ServerError(
            f"{who}: the answer's kv_transfer_params is {type(params).__name__}, not an object"
        )
    where = (params or {}).get("hidden_states_path")
    if where is None or where == "":
        raise ServerError(
            f"{who}: the answer names no hidden-state file "
            "(kv_transfer_params.hidden_states_path); launch vLLM with the "
            "extract_hidden_states method and a hidden-states connector "
            "(docs/extract.md)"
        )
    return where


def _json_object(response: Any, who: str) -> dict:
    """A 2xx answer's body, which must be a JSON object."""
    try:
        body = response.json()
    except ValueError:
        raise ServerError(
            f"{who}: HTTP {response.status_code} with a body that is not JSON "
            f"({response.text[:80]!r})"
        ) from None
    if not isinstance(body, dict):
        raise ServerError(
            f"{who}: HTTP {response.status_code} with a JSON {type(body).__name__}, not an object"
        ) from None
    return body


def _http_failure(response: Any) -> str:
    if response.status_code in (401, 403):
        return (
            f"HTTP {response.status_code}: the server refused the API key (--api-key, "
            "EAGLE3KIT_API_KEY)"
        )
    return f"HTTP {response.status_code}: {response.text[:300]}"


def _served_model(client: Any, url: str) -> str:
    import httpx

    try:
        response = client.get(f"{url}/v1/models")
        if response.status_code in (401, 403):
            raise ServerError(f"--server {url}: {_http_failure(response)}")
        models = response.json()["data"]
        return str(models[0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise ServerError(f"--server {url}: cannot list its models ({exc}); pass --model") from None


def _check_storage(client: Any, url: str, storage: StorageDir) -> None:
    """Where the server says where it writes, it must be the folder given. vLLM says so only
    with VLLM_SERVER_DEV_MODE=1 (`/server_info?config_format=json`, the connector's
    kv_connector_extra_config.shared_storage_path); elsewhere each named file is checked."""
    import httpx

    try:
        response = client.get(f"{url}/server_info", params={"config_format": "json"})
        info = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return
    reported = _dig(
        info,
        "vllm_config",
        "kv_transfer_config",
        "kv_connector_extra_config",
        "shared_storage_path",
    )
    if isinstance(reported, str) and reported and not storage.holds(reported):
        raise ServerError(
            f"--server {url}: it writes its hidden-state files to {reported} "
            f"(its /server_info: shared_storage_path), outside {FLAG} "
            f"{storage.given}"
        )


def _dig(value: Any, *keys: str) -> Any:
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _refuse_prefix_caching(client: Any, url: str) -> None:
    """vLLM publishes its cache settings as the labels of `vllm:cache_config_info` on
    /metrics; with prefix caching on, a prompt that shares a cached prefix with an earlier one
    is not recomputed, and the states of that prefix are not the ones this prompt's forward
    pass would give. A server without /metrics (or without the gauge) is checked later, by
    each file's token ids."""
    import httpx

    try:
        response = client.get(f"{url}/metrics")
    except httpx.HTTPError:
        return
    if response.status_code != 200:
        return
    for line in response.text.splitlines():
        if line.startswith("vllm:cache_config_info{") and 'enable_prefix_caching="True"' in line:
            raise ServerError(
                f"--server {url}: prefix caching is on (its /metrics: "
                'vllm:cache_config_info enable_prefix_caching="True"), so states '
                "of a cached prefix would come from another request: relaunch it "
                "with --no-enable-prefix-caching (docs/extract.md)"
            )

"""A CPU-safe ExampleHiddenStatesConnector, for vLLM's CPU build (loaded by the vLLM server,
never by the tests' own interpreter).

vLLM's ExampleHiddenStatesConnector copies the hidden states out of the KV cache on a CUDA
stream into pinned host memory and waits on CUDA events: on the CPU build the first extract
request kills the engine. This subclass does the same copy synchronously (the cache already
is host memory) and writes the same file (`hidden_states [T, L, H]`, `token_ids [T]`) under
the same `.lock` protocol, so a client cannot tell the two apart. site-packages stays as
installed; the server loads this module through the KV transfer config:

    --kv-transfer-config '{"kv_connector": "CpuHiddenStatesConnector",
      "kv_connector_module_path": "cpu_hidden_states_connector", "kv_role": "kv_producer",
      "kv_connector_extra_config": {"shared_storage_path": "/tmp/hs"}}'

with this directory on the server's PYTHONPATH.
"""

from __future__ import annotations

import fcntl
import os

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)


class _Copied:
    """Stands where the CUDA event of the copy would: the copy is done when it exists."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):
    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(self._block_size, dtype=torch.long)
        slots = (offsets.reshape(1, -1) + blocks.reshape(-1, 1) * self._block_size).flatten()
        states = extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0])
        tensors = {
            "hidden_states": states.clone().contiguous(),
            "token_ids": pending.token_ids.clone(),
        }
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(
                pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644
            )
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        try:
            save_file(tensors, pending.filename)
        finally:
            if lock_fd is not None:
                os.close(lock_fd)  # releases the lock a client waits on
        self._req_copy_events[pending.req_id] = _Copied()  # type: ignore[assignment]

"""Loaded by the Kimi-shaped EAGLE-3 servers of tests/vllm/test_vllm_kimi.py (this folder
leads their PYTHONPATH): lets vLLM 0.32.0's CPU build serve a dense EAGLE-3 drafter beside
an MLA target on a CPU without AMX.

There the target's attention is the reference `CPU_MLA` backend, whose decode kernel takes
blocks of 16 tokens only (vllm/platforms/cpu.py forces `block_size` 16), while the drafter's
`CPU_ATTN` backend declares `MultipleOf(32)`, so the engine stops at start-up: "No common
block size for 16 (CPU_MLA: [16]; CPU_ATTN: [MultipleOf(32)])". CPU_ATTN's own kernels take
16 as well: `_get_attn_isa` picks its `vec16` kernel for a block size that is not a multiple
of 32 (vllm/v1/attention/backends/cpu_attn.py). This declares 16 beside the multiples of 32,
so the drafter runs on that kernel. With AMX (the `AMX_MLA` backend, blocks of 128) nothing
changes and this leaves vLLM as it is."""

from __future__ import annotations

try:
    import torch
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
except Exception:  # not a vLLM CPU process: nothing to change
    pass
else:
    if not torch.cpu._is_amx_tile_supported():
        _declared = CPUAttentionBackend.get_supported_kernel_block_sizes

        def _with_16(kv_cache_spec=None):  # the backend's own signature
            return [16, *_declared(kv_cache_spec)]

        CPUAttentionBackend.get_supported_kernel_block_sizes = staticmethod(_with_16)

"""Loaded by a vLLM CPU server that has this folder first on its PYTHONPATH (a user's, and
those of tests/vllm/test_vllm_sampled.py): a correct CPU override of vLLM 0.32.0's
`expand_kernel` (vllm#55005).

The CPU build replaces the Triton kernel with `vllm.utils.cpu_triton_utils.
_expand_kernel_impl`, which passes the float per-request temperatures through
`_ensure_int64` (an int64 copy) and never copies the result back: `expand_batch_to_tokens`
returns uninitialised memory, so at temperature > 0 the rejection sampler divides the
target's logits by garbage and verifies drafts against a garbage distribution (acceptance
near 1, and tokens the target gives no probability). The GPU build's Triton kernel is
right; this restores its behaviour. Greedy requests batched with sampled ones are verified
with the same garbage, so a server that mixes them needs it too."""

from __future__ import annotations

from typing import Any


def _expand(
    output: Any,
    input_val: Any,
    cu_num_tokens: Any,
    replace_from: Any,
    replace_to: Any,
    MAX_NUM_TOKENS: Any = None,
) -> None:  # the kernel's own names
    import torch

    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    values = torch.where(
        input_val == replace_from, torch.full_like(input_val, replace_to), input_val
    )
    output.copy_(values.repeat_interleave(counts)[: output.shape[0]].to(output.dtype))


try:
    import vllm.utils.cpu_triton_utils as _cpu_tl  # type: ignore[import-not-found]
except Exception:  # not a vLLM CPU process: nothing to fix
    pass
else:
    _cpu_tl._expand_kernel_impl = _expand

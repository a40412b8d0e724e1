"""Loaded by the vLLM servers of tests/vllm/test_vllm_sampled.py (this folder leads their
PYTHONPATH): a correct CPU override of vLLM 0.32.0's `expand_kernel`.

The CPU build replaces the Triton kernel with `vllm.utils.cpu_triton_utils.
_expand_kernel_impl`, which passes the float per-request temperatures through
`_ensure_int64` (an int64 copy) and never copies the result back: `expand_batch_to_tokens`
returns uninitialised memory, so at temperature > 0 the rejection sampler divides the
target's logits by garbage and verifies drafts against a garbage distribution (acceptance
near 1, and tokens the target gives no probability). The GPU build's Triton kernel is
right; this restores its behaviour, so the tier measures the rule and not the bug."""

from __future__ import annotations


def _expand(output, input_val, cu_num_tokens, replace_from, replace_to,
            MAX_NUM_TOKENS=None):  # the kernel's own argument names
    import torch

    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    values = torch.where(input_val == replace_from,
                         torch.full_like(input_val, replace_to), input_val)
    output.copy_(values.repeat_interleave(counts)[:output.shape[0]].to(output.dtype))


try:
    import vllm.utils.cpu_triton_utils as _cpu_tl
except Exception:  # not a vLLM CPU process: nothing to fix
    pass
else:
    _cpu_tl._expand_kernel_impl = _expand

"""Training-time-test attention without a T x T matrix.

Step k's query at index t sees the step-0 keys up to t (causal) and, for each step j in
1..k, only step j's key at t (EAGLE3.md §2). The softmax over that union splits in two:
a causal attention over step 0, done by a fused kernel that also returns its
log-sum-exp, and k diagonal scores per position, cheap vectors. The two are merged
through the log-sum-exp, as ring attention merges key blocks. The backward pass uses the
same trick the other way round: the kernel's own backward, handed the *merged* output and
log-sum-exp, gives the step-0 part of the gradients of the whole softmax (its
P = exp(s - lse) and D = rowsum(dO * O) are those of the union), and the diagonal terms
add theirs in closed form. Memory is linear in T; nothing of size T x T is kept.

Kernels, by device and dtype:
- CPU: aten's flash attention for CPU (exact in fp32), the kernel behind
  `F.scaled_dot_product_attention` on CPU;
- CUDA: flash attention for bf16/fp16, memory-efficient attention for fp32;
- anything else, or a fused kernel that fails its first-use check: `chunked`, a plain
  torch implementation over blocks of queries (each block sees its keys in one matmul);
- a sliding window shorter than the sequence: `chunked` over the window (`windowed`), each
  block of queries against only the keys its window reaches.

Each fused kernel is checked once per process, device and dtype against `chunked` on a
small problem (forward and gradients); a kernel that errs or disagrees is replaced by
`chunked` with a warning, so a torch version with other private signatures degrades to
slower, never to wrong.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import torch

CHUNK_BYTES = 64 << 20
"""Largest [B, heads, block, T] fp32 score block of the `chunked` implementation."""
WINDOW_BLOCK = 128
"""Fewest queries per block of the windowed `chunked` attention (fewer Python loops)."""


@dataclass(frozen=True)
class Kernel:
    """A causal attention kernel that returns its log-sum-exp, and its backward.

    forward(q, k, v, scale) -> (out, lse [B, h, T] fp32, saved): `saved` is whatever the
    backward needs besides the inputs (raw log-sum-exp layout, rng state).
    backward(dout, q, k, v, out, lse, saved, scale) -> (dq, dk, dv), where out and lse may
    be those of a larger softmax that contains this one.
    """

    name: str
    forward: Callable
    backward: Callable


# Kernels --------------------------------------------------------------------------------------
def _cpu_forward(q, k, v, scale):
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, True, scale=scale
    )
    return out, lse, ()


def _cpu_backward(dout, q, k, v, out, lse, saved, scale):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        dout, q, k, v, out, lse.contiguous(), 0.0, True, scale=scale
    )


def _flash_forward(q, k, v, scale):
    out, lse, cum_q, cum_k, max_q, max_k, seed, offset, _ = (
        torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True, False, scale=scale)
    )
    return out, lse, (lse, cum_q, cum_k, max_q, max_k, seed, offset)


def _flash_backward(dout, q, k, v, out, lse, saved, scale):
    raw, cum_q, cum_k, max_q, max_k, seed, offset = saved
    return torch.ops.aten._scaled_dot_product_flash_attention_backward(
        dout,
        q,
        k,
        v,
        out,
        _into(raw, lse),
        cum_q,
        cum_k,
        max_q,
        max_k,
        0.0,
        True,
        seed,
        offset,
        scale=scale,
    )


def _efficient_forward(q, k, v, scale):
    out, lse, seed, offset = torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, None, True, 0.0, True, scale=scale
    )
    return out, lse[..., : q.shape[2]], (lse, seed, offset)


def _efficient_backward(dout, q, k, v, out, lse, saved, scale):
    raw, seed, offset = saved
    dq, dk, dv, _ = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
        dout,
        q,
        k,
        v,
        torch.empty(0, device=q.device, dtype=q.dtype),
        out,
        _into(raw, lse),
        seed,
        offset,
        0.0,
        [True, True, True, False],
        True,
        scale=scale,
    )
    return dq, dk, dv


def _into(raw: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """`lse` in the layout the kernel returned (memory-efficient attention pads T)."""
    if raw.shape == lse.shape:
        return lse.contiguous()
    full = raw.clone()
    full[..., : lse.shape[-1]] = lse
    return full


def _blocks(q: torch.Tensor, window: int | None = None) -> int:
    """Queries per block: a [B, h, block, keys] fp32 score block within CHUNK_BYTES; with a
    window, blocks about as long as the window, so each sees ~2 x window keys and the work
    grows with T x window, not T^2."""
    b, h, t, _ = q.shape
    keys = t if window is None else min(t, 2 * max(window, WINDOW_BLOCK))
    rows = CHUNK_BYTES // max(1, 4 * b * h * keys)
    if window is not None:
        rows = min(rows, max(window, WINDOW_BLOCK))
    return max(1, min(t, rows))


def _block_scores(q, k, start, stop, scale, window=None):
    """Scores of queries start..stop-1 against the keys they may see, fp32, and the first
    key's index: keys 0..stop-1 causally, or with a `window` only the last `window` keys up
    to each query (keys before start-window+1 are seen by none and left out)."""
    first = 0 if window is None else max(0, start - window + 1)
    s = (
        torch.matmul(q[:, :, start:stop].float(), k[:, :, first:stop].float().transpose(-1, -2))
        * scale
    )
    rows = torch.arange(start, stop, device=q.device)[:, None]
    cols = torch.arange(first, stop, device=q.device)[None]
    hidden = cols > rows
    if window is not None:
        hidden = hidden | (cols <= rows - window)
    return s.masked_fill(hidden, float("-inf")), first


def _chunked_forward(q, k, v, scale, window=None):
    t = q.shape[2]
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    step = _blocks(q, window)
    for start in range(0, t, step):
        stop = min(t, start + step)
        s, first = _block_scores(q, k, start, stop, scale, window)
        block_lse = torch.logsumexp(s, -1)
        p = torch.exp(s - block_lse[..., None])
        out[:, :, start:stop] = torch.matmul(p, v[:, :, first:stop].float()).to(q.dtype)
        lse[:, :, start:stop] = block_lse
    return out, lse, ()


def _chunked_backward(dout, q, k, v, out, lse, saved, scale, window=None):
    t = q.shape[2]
    dq = torch.zeros_like(q, dtype=torch.float32)
    dk = torch.zeros_like(k, dtype=torch.float32)
    dv = torch.zeros_like(v, dtype=torch.float32)
    delta = (dout.float() * out.float()).sum(-1)
    step = _blocks(q, window)
    for start in range(0, t, step):
        stop = min(t, start + step)
        s, first = _block_scores(q, k, start, stop, scale, window)
        p = torch.exp(s - lse[:, :, start:stop, None])
        g = dout[:, :, start:stop].float()
        dv[:, :, first:stop] += torch.matmul(p.transpose(-1, -2), g)
        ds = p * (
            torch.matmul(g, v[:, :, first:stop].float().transpose(-1, -2))
            - delta[:, :, start:stop, None]
        )
        dq[:, :, start:stop] = torch.matmul(ds, k[:, :, first:stop].float()) * scale
        dk[:, :, first:stop] += (
            torch.matmul(ds.transpose(-1, -2), q[:, :, start:stop].float()) * scale
        )
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def windowed(window: int) -> Kernel:
    """`chunked` over a sliding window: each query sees its own key and the `window` - 1
    before it, so the work is linear in T for a fixed window (the fused kernels take no
    window here)."""
    return Kernel(
        f"chunked, window {window}",
        partial(_chunked_forward, window=window),
        partial(_chunked_backward, window=window),
    )


KERNELS = {
    "cpu-flash": Kernel("cpu-flash", _cpu_forward, _cpu_backward),
    "cuda-flash": Kernel("cuda-flash", _flash_forward, _flash_backward),
    "cuda-efficient": Kernel("cuda-efficient", _efficient_forward, _efficient_backward),
    "chunked": Kernel("chunked", _chunked_forward, _chunked_backward),
}
_checked: dict[tuple[str, str, torch.dtype], Kernel] = {}
forced: str | None = None
"""A kernel name to use everywhere (tests, benchmarks); None picks by device and dtype."""
_set_aside: list[str] = []
"""Why a kernel failed its self-check, until the caller takes it (model/ prints nothing)."""


def take_warnings() -> list[str]:
    """The kernels set aside since the last call, as warnings for the caller to show."""
    out = list(_set_aside)
    _set_aside.clear()
    return out


def kernel_for(q: torch.Tensor) -> Kernel:
    """The kernel for q's device and dtype, checked on first use."""
    if forced is not None:
        return KERNELS[forced]
    dev, dtype = q.device.type, q.dtype
    if dev == "cpu" and dtype in (torch.float32, torch.bfloat16, torch.float16):
        name = "cpu-flash"
    elif dev == "cuda" and dtype in (torch.bfloat16, torch.float16):
        name = "cuda-flash"
    elif dev == "cuda" and dtype == torch.float32:
        name = "cuda-efficient"
    else:
        return KERNELS["chunked"]
    key = (name, str(q.device), dtype)
    if key not in _checked:
        _checked[key] = _self_check(KERNELS[name], q.device, dtype, q.shape[-1])
    return _checked[key]


def _self_check(kernel: Kernel, device: torch.device, dtype: torch.dtype, head_dim: int) -> Kernel:
    """`kernel` if it agrees with `chunked` on a small two-step problem, else `chunked`."""
    gen = torch.Generator(device="cpu").manual_seed(0)  # leaves the global RNG alone

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device, dtype).requires_grad_(True)

    shape = (2, 2, 37, head_dim)
    with torch.inference_mode(False):
        inputs = [rand(*shape) for _ in range(5)]
        grad = torch.randn(*shape, generator=gen).to(device, dtype)
    results = []
    try:
        # First use may come under no_grad (the held-out evaluation) or autocast.
        with (
            torch.inference_mode(False),
            torch.enable_grad(),
            torch.autocast(device.type, enabled=False),
        ):
            for candidate in (kernel, KERNELS["chunked"]):
                out = _TTTAttention.apply(candidate, 1 / math.sqrt(head_dim), *inputs)
                results.append([out, *torch.autograd.grad(out, inputs, grad)])
        tol = 1e-4 if dtype == torch.float32 else 3e-2
        for a, b in zip(*results, strict=True):
            scale = b.abs().max().item() + 1e-6
            if not (a - b).abs().max().item() <= tol * scale:
                raise ValueError(f"differs from the reference by {(a - b).abs().max().item():.3g}")
    except (RuntimeError, ValueError, TypeError, NotImplementedError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        _set_aside.append(
            f"attention: the {kernel.name} kernel is unusable here ({reason}); "
            "training uses the slower chunked attention instead"
        )
        return KERNELS["chunked"]
    return kernel


# The training-time-test attention ------------------------------------------------------------
class _TTTAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        kernel: Kernel,
        scale: float,
        q: torch.Tensor,
        k0: torch.Tensor,
        v0: torch.Tensor,
        *diagonal: torch.Tensor,
    ) -> torch.Tensor:
        out, lse, saved = kernel.forward(q, k0, v0, scale)
        keys, values = diagonal[0::2], diagonal[1::2]
        if keys:
            lse0 = lse.float()[..., None]
            scores = torch.cat([_diagonal_scores(q, key, scale) for key in keys], -1)
            lse = torch.logsumexp(torch.cat([lse0, scores], -1), -1)  # [B, h, T]
            weights = torch.exp(scores - lse[..., None])
            merged = out.float() * torch.exp(lse0 - lse[..., None])
            for j, value in enumerate(values):
                merged = merged + weights[..., j : j + 1] * value.float()
            out = merged.to(q.dtype)
        ctx.kernel, ctx.scale, ctx.steps, ctx.n_saved = kernel, scale, len(keys), len(saved)
        ctx.save_for_backward(
            q, k0, v0, out, lse, *diagonal, *[s for s in saved if isinstance(s, torch.Tensor)]
        )
        ctx.extra = [s for s in saved if not isinstance(s, torch.Tensor)]
        ctx.layout = [isinstance(s, torch.Tensor) for s in saved]
        return out

    @staticmethod
    def backward(ctx, dout: torch.Tensor):
        q, k0, v0, out, lse, *rest = ctx.saved_tensors
        diagonal, tensors = rest[: 2 * ctx.steps], iter(rest[2 * ctx.steps :])
        extra = iter(ctx.extra)
        saved = tuple(next(tensors) if is_tensor else next(extra) for is_tensor in ctx.layout)
        dout = dout.contiguous()
        dq, dk0, dv0 = ctx.kernel.backward(dout, q, k0, v0, out, lse, saved, ctx.scale)
        grads: list[torch.Tensor] = []
        if ctx.steps:
            scale = ctx.scale
            g = dout.float()
            delta = (g * out.float()).sum(-1, keepdim=True)
            dq = dq.float()
            for key, value in zip(diagonal[0::2], diagonal[1::2], strict=True):
                p = torch.exp(_diagonal_scores(q, key, scale) - lse[..., None])
                ds = p * ((g * value.float()).sum(-1, keepdim=True) - delta)
                dq = dq + ds * key.float() * scale
                grads += [(ds * q.float() * scale).to(key.dtype), (p * g).to(value.dtype)]
            dq = dq.to(q.dtype)
        return None, None, dq, dk0, dv0, *grads


def _diagonal_scores(q: torch.Tensor, key: torch.Tensor, scale: float) -> torch.Tensor:
    """q_t . key_t per position, fp32: [B, h, T, 1]."""
    return (q.float() * key.float()).sum(-1, keepdim=True) * scale


def ttt_attention(
    q: torch.Tensor,
    keys: Sequence[torch.Tensor],
    values: Sequence[torch.Tensor],
    window: int | None = None,
) -> torch.Tensor:
    """Step len(keys)-1's attention: q [B, h, T, D] against the step-0 keys causally and
    against each later step's key at its own position. Rows are right-padded: causal
    attention keeps a real position from ever seeing the padding after it.

    With a sliding `window` (keys seen, the query's own included) step k's query at index t
    sits at position t+k, as it does in decoding: it sees the step-0 keys of positions
    t+k-window+1..t, and every later step's key (positions t+1..t+k) once window > k.
    """
    scale = 1.0 / math.sqrt(q.shape[-1])
    step = len(keys) - 1
    diagonal = [x for pair in zip(keys[1:], values[1:], strict=True) for x in pair]
    kernel = kernel_for(q)
    if window is not None:
        if window <= step:
            raise ValueError(
                f"a sliding window of {window} keys leaves training-time-test "
                f"step {step} no context; it must exceed the steps unrolled"
            )
        if window - step < q.shape[2]:  # else the window holds the whole sequence
            kernel = windowed(window - step)
    return _TTTAttention.apply(kernel, scale, q, keys[0], values[0], *diagonal)

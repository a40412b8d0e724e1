"""The EAGLE-3 draft model: decoder layers over the fused target states and the token
embedding (EAGLE3.md §1.2), with the variants vLLM's `llama_eagle3.py` and speculators serve.

The variants (DrafterConfig): `norm_before_fc` (one RMSNorm `input_norm` over the concatenated
aux states before `fc`), `fc_norm` (one RMSNorm per aux state), `norm_before_residual` (the
first layer's residual is the normed hidden input), `norm_output` (the hidden state fed to the
next step is the final norm's output, and the logits read it as is), `num_hidden_layers` > 1
(further plain Llama layers over H; only the first reads the embedding) and
`embed_requires_grad` (the drafter's own, trained embedding).

Parameter names are the speculators/vLLM names (`fc`, `layers.0.*`, `norm`, `lm_head`,
`embed_tokens`, buffers `d2t`/`t2d`), so a state dict is a vLLM checkpoint's weights.

Two ways to run the layer share all the code except attention:
- `ttt_attention` (model/attention.py): training-time test. Step k's query at index t sees
  the step-0 keys up to t (the real context) and, for each step j in 1..k, only the key of
  step j at index t; memory linear in T.
- `DraftCache`: decoding. New positions see every cached key and each other causally (or
  through an explicit mask, for trees).

A `sliding_window` W (DrafterConfig) limits both to the keys of the last W positions, the
query's own included, as vLLM's sliding-window attention serves the draft layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from eagle3kit.model.attention import ttt_attention
from eagle3kit.model.config import DrafterConfig


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_inv_freq(config: DrafterConfig) -> torch.Tensor:
    """Inverse frequencies for RoPE; linear, llama3 and YaRN scaling as transformers and
    vLLM apply them (other kinds are left unscaled)."""
    return _rope(config)[0]


def rope_attention_factor(config: DrafterConfig) -> float:
    """YaRN's scale on cos and sin (1 for every other kind)."""
    return _rope(config)[1]


def _rope(config: DrafterConfig) -> tuple[torch.Tensor, float]:
    dim = config.head_dim
    inv = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "linear":
        inv = inv / scaling["factor"]
    elif kind == "llama3":
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        smooth = (old_len / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > old_len / low, inv / factor, inv)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        is_mid = (wavelen <= old_len / low) & (wavelen >= old_len / high)
        inv = torch.where(is_mid, mid, scaled)
    elif kind == "yarn":
        return _yarn(config, scaling)
    return inv.float(), 1.0


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn(config: DrafterConfig, scaling: dict) -> tuple[torch.Tensor, float]:
    """YaRN (transformers' _compute_yarn_parameters, vLLM's YaRNScalingRotaryEmbedding): the
    fast dimensions keep their frequencies, the slow ones are divided by the factor, a ramp
    between; cos and sin are scaled by the attention factor. A drafter served for a YaRN
    target gets these from the engine whatever its training saw, so it trains with them."""
    dim, base = config.head_dim, config.rope_theta
    original = scaling.get("original_max_position_embeddings") or config.max_position_embeddings
    factor = scaling.get("factor") or config.max_position_embeddings / original
    attention = scaling.get("attention_factor")
    mscale, mscale_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
    if attention is None:
        attention = (
            _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all)
            if mscale and mscale_all
            else _yarn_mscale(factor)
        )

    def correction(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = (
        correction(scaling.get("beta_fast") or 32),
        correction(scaling.get("beta_slow") or 1),
    )
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as both do: no division by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: the dimension keeps its frequency (extrapolation)
    pos = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    inv = (1 / (factor * pos)) * (1 - keep) + (1 / pos) * keep
    return inv.float(), float(attention)


def apply_rope(
    x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, factor: float = 1.0
) -> torch.Tensor:
    """x: [B, heads, T, D]; positions: [B, T]; `factor` scales cos and sin (YaRN)."""
    angles = positions.to(inv_freq.device, torch.float32)[..., None] * inv_freq  # [B, T, D/2]
    angles = torch.cat([angles, angles], dim=-1)[:, None]  # [B, 1, T, D]
    cos, sin = (angles.cos() * factor).to(x.dtype), (angles.sin() * factor).to(x.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, config: DrafterConfig, width: int) -> None:
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.heads, self.kv_heads, self.head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            d,
        )
        self.q_proj = nn.Linear(width, self.heads * d, bias=False)
        self.k_proj = nn.Linear(width, self.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(width, self.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.heads * d, h, bias=False)

    def qkv(
        self, x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, factor: float = 1.0
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values as [B, heads, T, D], RoPE applied, keys/values expanded
        to the query heads."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = (
            apply_rope(q, positions, inv_freq, factor),
            apply_rope(k, positions, inv_freq, factor),
        )
        groups = self.heads // self.kv_heads
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        return q, k, v

    def out(self, attended: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = attended.shape
        return self.o_proj(attended.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        h, i = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """The first layer reads [input_layernorm(embedding), hidden_norm(hidden)] (2H); a later
    one is a plain Llama layer over H, as speculators builds it (no hidden_norm)."""

    def __init__(self, config: DrafterConfig, first: bool = True) -> None:
        super().__init__()
        h = config.hidden_size
        self.self_attn = Attention(config, 2 * h if first else h)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(h, config.rms_norm_eps)
        if first:
            self.hidden_norm = RMSNorm(h, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(h, config.rms_norm_eps)
        self.norm_before_residual = config.norm_before_residual


@dataclass
class TTTState:
    """Keys and values of the earlier training-time-test steps, of the first layer; those of
    layer i > 0 in `deeper[i - 1]`."""

    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)
    deeper: list[TTTState] = field(default_factory=list)

    def layer(self, index: int) -> TTTState:
        while len(self.deeper) < index:
            self.deeper.append(TTTState())
        return self if index == 0 else self.deeper[index - 1]


class DraftCache:
    """The drafter's key/value cache for decoding: [B, heads, L, D] each, and the position
    of each key [B, L], of the first layer; those of layer i > 0 in `deeper[i - 1]`."""

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.positions: torch.Tensor | None = None
        self.deeper: list[DraftCache] = []

    def __len__(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]

    def layer(self, index: int) -> DraftCache:
        while len(self.deeper) < index:
            self.deeper.append(DraftCache())
        return self if index == 0 else self.deeper[index - 1]

    def crop(self, length: int) -> None:
        if self.keys is not None:
            assert self.values is not None and self.positions is not None  # set together
            self.keys, self.values = self.keys[:, :, :length], self.values[:, :, :length]
            self.positions = self.positions[:, :length]
        for deeper in self.deeper:
            deeper.crop(length)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        positions: torch.Tensor,
        window: int | None = None,
    ) -> torch.Tensor:
        """New positions see all cached ones, and each other as `mask` [T, T] allows
        (default causal). A `mask` [T, cached + T] says what each sees of the cached ones
        too: a drafted tree's nodes see their own ancestors, not their cousins. A sliding
        `window` hides every key whose position is `window` or more before the query's
        (`positions` [B, T], the new keys'), as the engines' sliding-window attention does."""
        past = len(self)
        self.keys = k if self.keys is None else torch.cat([self.keys, k], dim=2)
        self.values = v if self.values is None else torch.cat([self.values, v], dim=2)
        positions = positions.to(k.device).expand(k.shape[0], -1)
        self.positions = (
            positions if self.positions is None else torch.cat([self.positions, positions], dim=1)
        )
        t = q.shape[2]
        if mask is not None and mask.shape[1] == past + t:
            allowed = mask
        else:
            new = (
                mask
                if mask is not None
                else torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
            )
            allowed = torch.cat([torch.ones(t, past, dtype=torch.bool, device=q.device), new], 1)
        if window is not None:
            near = self.positions[:, None, :] > positions[:, :, None] - window  # [B, T, L]
            allowed = allowed & near[:, None]
        return F.scaled_dot_product_attention(q, self.keys, self.values, attn_mask=allowed)


class Eagle3Drafter(nn.Module):
    # Registered as buffers, and modules the config may leave out: declared here so their
    # types are known (nn.Module's attribute lookup says only "Tensor or Module").
    d2t: torch.Tensor
    t2d: torch.Tensor
    inv_freq: torch.Tensor
    rope_factor: float
    """What cos and sin are multiplied by: YaRN's attention factor, else 1."""
    input_norm: RMSNorm
    fc_norm: nn.ModuleList

    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.embed_tokens.weight.requires_grad_(config.embed_requires_grad)
        if config.norm_before_fc:
            self.input_norm = RMSNorm(config.aux_width, config.rms_norm_eps)
        if config.fc_norm:
            width = config.target_hidden_size or config.hidden_size
            self.fc_norm = nn.ModuleList(
                [RMSNorm(width, config.rms_norm_eps) for _ in config.aux_layer_ids]
            )
        self.fc = nn.Linear(config.aux_width, config.hidden_size, bias=False)
        self.layers = nn.ModuleList(
            [DecoderLayer(config, first=i == 0) for i in range(config.num_hidden_layers)]
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer(
            "t2d",
            torch.ones(config.vocab_size, dtype=torch.bool)
            if config.draft_vocab_size == config.vocab_size
            else torch.zeros(config.vocab_size, dtype=torch.bool),
        )
        inv_freq, self.rope_factor = _rope(config)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def set_vocab(self, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        self.d2t.copy_(torch.as_tensor(d2t, dtype=torch.long))
        self.t2d.copy_(torch.as_tensor(t2d, dtype=torch.bool))

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def project(self, aux: torch.Tensor) -> torch.Tensor:
        """Fuse the concatenated [low, mid, high] target states into the drafter's width."""
        if self.config.norm_before_fc:
            aux = self.input_norm(aux)
        if self.config.fc_norm:
            chunks = aux.chunk(len(self.fc_norm), dim=-1)
            aux = torch.cat([norm(c) for norm, c in zip(self.fc_norm, chunks, strict=True)], dim=-1)
        return self.fc(aux)

    def layer(
        self, hidden: torch.Tensor, input_ids: torch.Tensor, positions: torch.Tensor, attend
    ) -> torch.Tensor:
        """One drafting step: the output fed back as the next step's hidden input (the
        pre-norm state, or with norm_output the final norm's output).

        `attend(layer, q, k, v) -> [B, heads, T, D]` decides what each position sees.
        """
        block = cast(DecoderLayer, self.layers[0])
        emb = block.input_layernorm(self.embed_tokens(input_ids).to(hidden.dtype))
        normed = block.hidden_norm(hidden)
        residual = normed if block.norm_before_residual else hidden
        q, k, v = block.self_attn.qkv(
            torch.cat([emb, normed], dim=-1), positions, self.inv_freq, self.rope_factor
        )
        h = residual + block.self_attn.out(attend(0, q, k, v))
        h = h + block.mlp(block.post_attention_layernorm(h))
        for index in range(1, len(self.layers)):
            block = cast(DecoderLayer, self.layers[index])
            q, k, v = block.self_attn.qkv(
                block.input_layernorm(h), positions, self.inv_freq, self.rope_factor
            )
            h = h + block.self_attn.out(attend(index, q, k, v))
            h = h + block.mlp(block.post_attention_layernorm(h))
        return self.norm(h) if self.config.norm_output else h

    def head_input(self, hidden: torch.Tensor) -> torch.Tensor:
        """What lm_head reads of a step's output: its final norm (norm_output: the output
        already is)."""
        return hidden if self.config.norm_output else self.norm(hidden)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary (index with `d2t` to get target ids)."""
        return self.lm_head(self.head_input(hidden))

    def top_draft(self, hidden: torch.Tensor, block_bytes: int = 32 << 20) -> torch.Tensor:
        """argmax of `logits(hidden)` [B, T] (draft ids), in blocks of positions so a
        [T, draft_vocab] tensor is never materialised whole."""
        b, t = hidden.shape[:2]
        rows = max(1, block_bytes // (4 * self.config.draft_vocab_size * max(b, 1)))
        return (
            torch.cat(
                [self.logits(hidden[:, i : i + rows]).argmax(-1) for i in range(0, t, rows)], dim=1
            )
            if t
            else hidden.new_zeros((b, 0), dtype=torch.long)
        )

    def ttt_step(
        self,
        hidden: torch.Tensor,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        state: TTTState,
    ) -> torch.Tensor:
        """Training-time-test step len(state.keys), over whole sequences [B, T], right-padded
        (causal attention keeps every real position from seeing the padding after it)."""

        def attend(index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            mine = state.layer(index)
            mine.keys.append(k)
            mine.values.append(v)
            return ttt_attention(q, mine.keys, mine.values, self.config.sliding_window)

        return self.layer(hidden, input_ids, positions, attend)

    def decode(
        self,
        hidden: torch.Tensor,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        cache: DraftCache,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Append positions to `cache` and return their pre-norm outputs."""
        window = self.config.sliding_window
        return self.layer(
            hidden,
            input_ids,
            positions,
            lambda index, q, k, v: cache.layer(index).attend(q, k, v, mask, positions, window),
        )

    @torch.no_grad()
    def load_target_embedding(self, weight: torch.Tensor) -> None:
        self.embed_tokens.weight.copy_(weight)

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

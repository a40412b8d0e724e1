"""The frozen target's side of training: its states and its distribution at every position.

Offline, the states come from a hidden-state dataset and only the target's embedding, final
norm and lm_head are loaded. Online, the whole target runs, with forward hooks keeping the
aux states and the last decoder layer's output, before the final norm, exactly what extract
stores. Either way the target logits are lm_head(final_norm(last)), computed here in chunks:
the full-vocabulary argmax (for the loss mask and for acceptance) and the draft-vocabulary
logits are all training needs, never a [tokens, V] tensor for a whole batch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from eagle3kit.errors import UserError

LOGIT_CHUNK_BYTES = 256 << 20
"""Largest [chunk, V] fp32 block of target logits materialised at once."""


@dataclass
class TargetBatch:
    """A padded micro-batch with everything the target says about it."""

    ids: torch.Tensor
    """[B, T] token ids (right-padded with 0)."""
    loss_mask: torch.Tensor
    """[B, T] bool: 1 where the data carries loss (never on padding)."""
    lengths: torch.Tensor
    """[B] real tokens per row."""
    aux: torch.Tensor
    """[B, T, n_aux*H] fused-to-be target states."""
    normed: torch.Tensor
    """[B, T, H] the target's last state after its final norm: the lm_head input."""
    argmax: torch.Tensor
    """[B, T] the target's greedy next token (full vocabulary) at every position."""

    @property
    def tokens(self) -> int:
        return int(self.lengths.sum())

    def to(self, device: torch.device) -> TargetBatch:
        return TargetBatch(*(t.to(device) for t in (self.ids, self.loss_mask, self.lengths,
                                                    self.aux, self.normed, self.argmax)))


HfModel = Any
"""A transformers model of any architecture (remote code included), used by its duck-typed
methods (get_decoder, get_input_embeddings, base_model_prefix, ...): nn.Module's typing knows
none of them."""


def _meta_model(config: Any, trust_remote_code: bool = False) -> HfModel:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)


def _param_name(model: nn.Module, param: object) -> str:
    for name, p in model.named_parameters(remove_duplicate=False):
        if p is param:
            return name
    raise KeyError("parameter not found")


def _final_norm(model: HfModel) -> nn.Module:
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    norm = getattr(decoder, "norm", None)
    if norm is None:
        raise UserError(f"--target: {type(model).__name__} has no final `norm`; train knows "
                        "Llama-, Qwen- and Mistral-style models")
    return norm


def _read_tensors(path: Path, names: list[str]) -> dict[str, torch.Tensor]:
    """Only the named tensors of a safetensors checkpoint (one file or an index)."""
    from safetensors import safe_open

    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
    elif (path / "model.safetensors").is_file():
        weight_map = dict.fromkeys(names, "model.safetensors")
    else:
        raise UserError(f"--target {path}: no model.safetensors (or index) there")
    out: dict[str, torch.Tensor] = {}
    for name in names:
        if name not in weight_map:
            continue
        with safe_open(str(path / weight_map[name]), framework="pt") as f:
            if name in f.keys():  # noqa: SIM118  (safe_open has no __contains__)
                out[name] = f.get_tensor(name)
    return out


class TargetHead(nn.Module):
    """The target's embedding, final norm and lm_head: all offline training needs of it."""

    def __init__(self, embedding: torch.Tensor, norm: nn.Module, lm_head: torch.Tensor) -> None:
        super().__init__()
        self.embedding = embedding
        self.norm = norm
        self.lm_head = lm_head
        self.requires_grad_(False)

    @classmethod
    def load(cls, path: Path, config: Any, trust_remote_code: bool = False) -> TargetHead:
        model = _meta_model(config, trust_remote_code)
        emb = model.get_input_embeddings().weight
        out = model.get_output_embeddings()
        norm = _final_norm(model)
        names = {"embedding": _param_name(model, emb),
                 "norm": _param_name(model, norm.weight)}
        tied = out is None or out.weight is emb or getattr(config, "tie_word_embeddings", False)
        if not tied:
            names["lm_head"] = _param_name(model, out.weight)
        found = _read_tensors(path, list(names.values()))
        missing = [n for n in names.values() if n not in found]
        if missing:
            raise UserError(f"--target {path}: weights {', '.join(missing)} not found; is it a "
                            "transformers checkpoint of this config?")
        norm.to_empty(device="cpu")
        norm.load_state_dict({"weight": found[names["norm"]]}, strict=False)
        embedding = found[names["embedding"]]
        lm_head = embedding if tied else found[names["lm_head"]]
        return cls(embedding, norm, lm_head)

    @classmethod
    def of(cls, model: HfModel) -> TargetHead:
        out = model.get_output_embeddings()
        emb = model.get_input_embeddings().weight
        return cls(emb, _final_norm(model), emb if out is None else out.weight)

    def to_device(self, device: torch.device, dtype: torch.dtype) -> TargetHead:
        self.embedding = self.embedding.to(device, dtype)
        self.lm_head = self.lm_head.to(device, dtype)
        self.norm.to(device, dtype)
        return self

    @torch.no_grad()
    def argmax(self, normed: torch.Tensor) -> torch.Tensor:
        """Greedy token over the full vocabulary at every position: [..., H] -> [...]."""
        flat = normed.reshape(-1, normed.shape[-1])
        rows = max(1, LOGIT_CHUNK_BYTES // (4 * self.lm_head.shape[0]))
        out = [torch.matmul(flat[i:i + rows].to(self.lm_head.dtype), self.lm_head.T)
               .float().argmax(-1) for i in range(0, flat.shape[0], rows)]
        return torch.cat(out).reshape(normed.shape[:-1]) if out else flat.new_zeros(
            normed.shape[:-1], dtype=torch.long)

    @torch.no_grad()
    def draft_probs(self, normed: torch.Tensor, draft_ids: torch.Tensor) -> torch.Tensor:
        """The target's distribution restricted to the draft vocabulary and renormalised,
        fp32: softmax over the t2d columns of its logits. [..., H] -> [..., Vd], one block of
        positions at a time, so only the result is ever whole."""
        head = self.lm_head[draft_ids]
        flat = normed.reshape(-1, normed.shape[-1])
        out = torch.empty(flat.shape[0], head.shape[0], dtype=torch.float32,
                          device=normed.device)
        rows = max(1, LOGIT_CHUNK_BYTES // (4 * head.shape[0]))
        for i in range(0, flat.shape[0], rows):
            logits = torch.matmul(flat[i:i + rows].to(head.dtype), head.T)
            out[i:i + rows] = torch.softmax(logits.float(), dim=-1)
        return out.reshape(*normed.shape[:-1], head.shape[0])


def _pad(rows: list[np.ndarray], dtype: torch.dtype, width: int | None = None) -> torch.Tensor:
    longest = max(len(r) for r in rows)
    shape = (len(rows), longest) if width is None else (len(rows), longest, width)
    out = torch.zeros(shape, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.from_numpy(np.array(r)).to(dtype)  # a copy: r may be mapped
    return out


class OfflineTarget:
    """States from a hidden-state dataset; the target's head for its distribution."""

    def __init__(self, head: TargetHead, last_state: str, device: torch.device) -> None:
        self.head, self.last_state, self.device = head, last_state, device

    @torch.no_grad()
    def batch(self, samples: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]
              ) -> TargetBatch:
        """samples: (input_ids, loss_mask, aux, last), already cut to their training length."""
        ids = _pad([s[0] for s in samples], torch.long).to(self.device)
        mask = _pad([s[1] for s in samples], torch.bool).to(self.device)
        lengths = torch.tensor([len(s[0]) for s in samples], device=self.device)
        aux = _pad([s[2] for s in samples], torch.float32, samples[0][2].shape[-1])
        last = _pad([s[3] for s in samples], torch.float32, samples[0][3].shape[-1])
        last = last.to(self.device)
        normed = self.head.norm(last.to(self.head.lm_head.dtype)) if (
            self.last_state == "pre_norm") else last
        return TargetBatch(ids, mask, lengths, aux.to(self.device), normed,
                           self.head.argmax(normed))


class OnlineTarget:
    """The whole target in the loop, frozen; hooks keep the aux and last states."""

    def __init__(self, model: HfModel, layers: list[int], device: torch.device) -> None:
        self.model, self.layers, self.device = model, layers, device
        # (cast: getattr with a default is typed as possibly None, which it never is here)
        self.base = cast(HfModel, getattr(model, model.base_model_prefix, model))
        blocks = getattr(self.base, "layers", None)
        if blocks is None:
            raise UserError(f"--target: {type(model).__name__} has no `layers` list of "
                            "decoder layers; --online knows Llama-, Qwen- and Mistral-style "
                            "models")
        self.n_layers = len(blocks)
        self.head = TargetHead.of(model)
        self.captured: dict[int, torch.Tensor] = {}
        # Aux id k is the output of decoder layer k-1 (0: the embeddings), what HF's
        # output_hidden_states[k] holds for k < N; hooks give id N before the final norm too.
        for k in {*layers, self.n_layers}:
            module = self.base.get_input_embeddings() if k == 0 else blocks[k - 1]
            module.register_forward_hook(self._keep(k))

    def _keep(self, k: int):
        def hook(_module: Any, _inputs: Any, output: Any) -> None:
            self.captured[k] = output[0] if isinstance(output, tuple) else output
        return hook

    @classmethod
    def load(cls, path: Path, layers: list[int], device: torch.device,
             trust_remote_code: bool = False) -> OnlineTarget:
        from eagle3kit import _hf

        dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
        model = _hf.load_causal_lm(path, trust_remote_code, dtype=dtype)
        model.to(device).eval().requires_grad_(False)
        return cls(model, layers, device)

    @torch.no_grad()
    def batch(self, samples: list[tuple[np.ndarray, np.ndarray]]) -> TargetBatch:
        """samples: (input_ids, loss_mask), already cut to their training length."""
        ids = _pad([s[0] for s in samples], torch.long).to(self.device)
        mask = _pad([s[1] for s in samples], torch.bool).to(self.device)
        lengths = torch.tensor([len(s[0]) for s in samples], device=self.device)
        valid = torch.arange(ids.shape[1], device=self.device)[None] < lengths[:, None]
        self.captured.clear()
        # Right padding under a causal mask leaves the real positions as they are alone.
        self.base(input_ids=ids, attention_mask=valid.long() if len(samples) > 1 else None,
                  use_cache=False)
        aux = torch.cat([self.captured[k] for k in self.layers], dim=-1).float()
        normed = self.head.norm(self.captured[self.n_layers])
        self.captured.clear()
        return TargetBatch(ids, mask, lengths, aux, normed, self.head.argmax(normed))

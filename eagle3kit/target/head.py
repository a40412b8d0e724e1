"""The target's head: its embedding, final norm and lm_head, and the full- and
draft-vocabulary distributions they give over a state after the last decoder layer.

Offline training and convert's hidden-state export load only these from a checkpoint
(`TargetHead.load`, a meta model names the tensors, only they are read); online training
takes them from the loaded model (`TargetHead.of`). Logits are computed in chunks: never a
[tokens, V] tensor for a whole batch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from eagle3kit.errors import UserError

LOGIT_CHUNK_BYTES = 256 << 20
"""Largest [chunk, V] fp32 block of target logits materialised at once."""


HfModel = Any
"""A transformers model of any architecture (remote code included), used by its duck-typed
methods (get_decoder, get_input_embeddings, ...): nn.Module's typing knows none of them."""


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
        raise UserError(
            f"--target: {type(model).__name__} has no final `norm`; train knows "
            "Llama-, Qwen- and Mistral-style models"
        )
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
        names = {"embedding": _param_name(model, emb), "norm": _param_name(model, norm.weight)}
        tied = out is None or out.weight is emb or getattr(config, "tie_word_embeddings", False)
        if not tied:
            names["lm_head"] = _param_name(model, out.weight)
        found = _read_tensors(path, list(names.values()))
        missing = [n for n in names.values() if n not in found]
        if missing:
            raise UserError(
                f"--target {path}: weights {', '.join(missing)} not found; is it a "
                "transformers checkpoint of this config?"
            )
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
        out = [
            torch.matmul(flat[i : i + rows].to(self.lm_head.dtype), self.lm_head.T)
            .float()
            .argmax(-1)
            for i in range(0, flat.shape[0], rows)
        ]
        return (
            torch.cat(out).reshape(normed.shape[:-1])
            if out
            else flat.new_zeros(normed.shape[:-1], dtype=torch.long)
        )

    @torch.no_grad()
    def draft_probs(
        self, normed: torch.Tensor, draft_ids: torch.Tensor, temperature: float = 1.0
    ) -> torch.Tensor:
        """The target's distribution at `temperature` restricted to the draft vocabulary and
        renormalised, fp32: softmax over the t2d columns of its logits / temperature.
        [..., H] -> [..., Vd], one block of positions at a time, so only the result is ever
        whole."""
        head = self.lm_head[draft_ids]
        flat = normed.reshape(-1, normed.shape[-1])
        out = torch.empty(flat.shape[0], head.shape[0], dtype=torch.float32, device=normed.device)
        rows = max(1, LOGIT_CHUNK_BYTES // (4 * head.shape[0]))
        for i in range(0, flat.shape[0], rows):
            logits = torch.matmul(flat[i : i + rows].to(head.dtype), head.T)
            out[i : i + rows] = torch.softmax(logits.float() / temperature, dim=-1)
        return out.reshape(*normed.shape[:-1], head.shape[0])

"""The frozen target's side of training: its states and its distribution at every position.

Offline, the states come from a hidden-state dataset and only the target's embedding, final
norm and lm_head are loaded. Online, the whole target runs, and `eagle3kit.target.Capture`,
the very hooks extract uses, keeps the aux states and the last decoder layer's output before
the final norm. Either way the target logits are lm_head(final_norm(last)), computed by
`eagle3kit.target.TargetHead` in chunks:
the full-vocabulary argmax (for the loss mask and for acceptance) and the draft-vocabulary
logits are all training needs, never a [tokens, V] tensor for a whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from eagle3kit.target.capture import Capture
from eagle3kit.target.device import resolve_dtype, to_device
from eagle3kit.target.head import TargetHead

__all__ = ["OfflineTarget", "OnlineTarget", "TargetBatch", "TargetHead"]


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
        return TargetBatch(
            *(
                t.to(device)
                for t in (
                    self.ids,
                    self.loss_mask,
                    self.lengths,
                    self.aux,
                    self.normed,
                    self.argmax,
                )
            )
        )


def _pad(rows: list[np.ndarray], dtype: torch.dtype, width: int | None = None) -> torch.Tensor:
    longest = max(len(r) for r in rows)
    shape = (len(rows), longest) if width is None else (len(rows), longest, width)
    out = torch.zeros(shape, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.from_numpy(np.array(r)).to(dtype)  # a copy: r may be mapped
    return out


class OfflineTarget:
    """States from a hidden-state dataset; the target's head for its distribution."""

    def __init__(self, head: TargetHead, last_state: str, device: torch.device) -> None:
        self.head, self.last_state, self.device = head, last_state, device

    @torch.no_grad()
    def batch(
        self, samples: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]
    ) -> TargetBatch:
        """samples: (input_ids, loss_mask, aux, last), already cut to their training length."""
        # Pinned and non-blocking on CUDA: the host reads on while the states are copied.
        ids = to_device(_pad([s[0] for s in samples], torch.long), self.device)
        mask = to_device(_pad([s[1] for s in samples], torch.bool), self.device)
        lengths = to_device(torch.tensor([len(s[0]) for s in samples]), self.device)
        aux = _pad([s[2] for s in samples], torch.float32, samples[0][2].shape[-1])
        last = _pad([s[3] for s in samples], torch.float32, samples[0][3].shape[-1])
        last = to_device(last, self.device)
        normed = (
            self.head.norm(last.to(self.head.lm_head.dtype))
            if (self.last_state == "pre_norm")
            else last
        )
        return TargetBatch(
            ids, mask, lengths, to_device(aux, self.device), normed, self.head.argmax(normed)
        )


class OnlineTarget:
    """The whole target in the loop, frozen; the one capture keeps the aux and last states."""

    def __init__(self, model: nn.Module, layers: list[int], device: torch.device) -> None:
        self.model, self.layers, self.device = model, layers, device
        self.capture = Capture(model, layers, who="--online")
        self.head = TargetHead.of(model)

    @classmethod
    def load(
        cls, path: Path, layers: list[int], device: torch.device, trust_remote_code: bool = False
    ) -> OnlineTarget:
        from eagle3kit import _hf

        model = _hf.load_causal_lm(path, trust_remote_code, dtype=resolve_dtype("auto", device))
        model.to(device).eval().requires_grad_(False)
        return cls(model, layers, device)

    @torch.no_grad()
    def batch(self, samples: list[tuple[np.ndarray, np.ndarray]]) -> TargetBatch:
        """samples: (input_ids, loss_mask), already cut to their training length."""
        ids = _pad([s[0] for s in samples], torch.long).to(self.device)
        mask = _pad([s[1] for s in samples], torch.bool).to(self.device)
        lengths = torch.tensor([len(s[0]) for s in samples], device=self.device)
        valid = torch.arange(ids.shape[1], device=self.device)[None] < lengths[:, None]
        aux, last = self.capture(ids, valid.long() if len(samples) > 1 else None)
        normed = self.head.norm(last)
        return TargetBatch(ids, mask, lengths, aux.float(), normed, self.head.argmax(normed))

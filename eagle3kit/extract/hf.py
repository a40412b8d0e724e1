"""`extract --engine hf`: hidden states from a transformers target in this process."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from eagle3kit import _hf
from eagle3kit._ranks import Ranks
from eagle3kit.extract.config import ExtractConfig
from eagle3kit.target import TargetInfo
from eagle3kit.target.capture import Capture
from eagle3kit.target.device import resolve_device, resolve_dtype


class HfEngine:
    """A transformers target whose hooked forward (the one `Capture`, online training's too)
    keeps only the states wanted: the aux ids and the last decoder layer's output, before
    the final norm."""

    def __init__(self, model: Any, layers: list[int]) -> None:
        self.model = model
        self.layers = layers
        self.capture = Capture(model, layers, who="extract")
        self.device = self.capture.device

    @classmethod
    def load(
        cls, cfg: ExtractConfig, target: TargetInfo, layers: list[int], ranks: Ranks
    ) -> HfEngine:
        device = resolve_device(cfg.device, ranks.local_rank)
        options: dict = {"dtype": resolve_dtype(cfg.dtype, device, bool(cfg.device_map))}
        if cfg.device_map:
            options["device_map"] = cfg.device_map
        model = _hf.load_causal_lm(target.path, bool(cfg.trust_remote_code), **options)
        if not cfg.device_map:
            model.to(device)
        model.eval()
        return cls(model, layers)

    def states(self, ids: list[Any]) -> Iterator[tuple[Any, Any] | None]:
        """Per sample (aux [T, 3H], last [T, H]) as float32 numpy, or None when not finite."""
        import torch

        longest = max(len(x) for x in ids)
        batch = torch.zeros((len(ids), longest), dtype=torch.long)
        mask = torch.zeros_like(batch)
        for row, x in enumerate(ids):
            batch[row, : len(x)] = torch.from_numpy(x.astype("int64"))
            mask[row, : len(x)] = 1
        with torch.inference_mode():
            aux, last = self.capture(
                batch.to(self.device), mask.to(self.device) if len(ids) > 1 else None
            )
            ok = (torch.isfinite(aux).all(-1) & torch.isfinite(last).all(-1)) | (mask == 0).to(
                aux.device
            )
            fine = ok.all(-1).tolist()
            aux, last = aux.float().cpu().numpy(), last.float().cpu().numpy()
        for row, x in enumerate(ids):
            yield (aux[row, : len(x)], last[row, : len(x)]) if fine[row] else None

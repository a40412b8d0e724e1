"""`--engine hf`: generation with transformers in this process, for small targets.

Requests run one at a time on a single worker thread, each seeded from its sample id, so
the output for a prompt does not depend on what else is in flight.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle3kit.gen.types import Completion, GenRequest


@dataclass
class HfBackend:
    model: Any
    name: str
    slots: int
    max_model_len: int | None
    _pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1))

    @classmethod
    def load(cls, target: Path, slots: int = 1, trust_remote_code: bool = False) -> HfBackend:
        import torch

        from eagle3kit import _hf

        model = _hf.load_causal_lm(target, trust_remote_code, dtype=torch.float32)
        model.eval()
        limit = getattr(model.config, "max_position_embeddings", None)
        return cls(model, f"hf:{target}", slots, limit)

    def _generate(self, request: GenRequest) -> Completion:
        import torch
        import transformers

        start = time.perf_counter()
        sample = request.temperature > 0
        if request.seed is not None:
            torch.manual_seed(request.seed)
        ids = torch.tensor([request.prompt_ids], dtype=torch.long)
        options: dict = {
            "do_sample": sample,
            "max_new_tokens": request.max_tokens,
            "eos_token_id": request.stop_token_ids,
            "pad_token_id": request.stop_token_ids[0],
        }
        if sample:
            options.update(
                temperature=request.temperature,
                top_p=request.top_p,
                top_k=request.top_k if request.top_k > 0 else 0,
            )
        with torch.no_grad():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), **options)
        output_ids = out[0, ids.shape[1] :].tolist()
        stopped = bool(output_ids) and output_ids[-1] in request.stop_token_ids
        return Completion(
            output_ids=output_ids,
            finish_reason="stop" if stopped else "length",
            prompt_tokens=len(request.prompt_ids),
            completion_tokens=len(output_ids),
            latency=time.perf_counter() - start,
            server={
                "url": self.name,
                "api": "hf",
                "model": self.name.removeprefix("hf:"),
                "version": f"transformers {transformers.__version__}",
            },
        )

    async def generate(self, request: GenRequest) -> Completion:
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._generate, request)

    async def healthy(self) -> bool:
        return True

    async def close(self) -> None:
        self._pool.shutdown(wait=False)

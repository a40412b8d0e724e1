"""The one hooked forward that takes a transformers target's states, for extract and for
online training alike: what online training sees is what extract stores.

Aux id k (boundary convention) is the output of decoder layer k-1 (id 0: the embeddings),
which is what HF's `output_hidden_states[k]` holds for k < N; hooking spares keeping all
N+1 states of a batch. The last state is the last decoder layer's output before the final
norm (HF's own `hidden_states[N]` is after it), the state vLLM's id N names.
"""

from __future__ import annotations

from typing import Any

from eagle3kit.errors import UserError


class Capture:
    """Forward hooks on a causal LM's decoder that keep the aux states and the last one."""

    def __init__(self, model: Any, layers: list[int], who: str = "eagle3kit") -> None:
        """`who` names the command in the message for a model without a decoder layer list."""
        self.layers = list(layers)
        self.base = getattr(model, getattr(model, "base_model_prefix", ""), model)
        blocks = getattr(self.base, "layers", None)
        if blocks is None:
            raise UserError(
                f"--target: {type(model).__name__} has no `layers` list of decoder "
                f"layers; {who} knows Llama-, Qwen- and Mistral-style models"
            )
        self.n_layers = len(blocks)
        self._captured: dict[int, Any] = {}
        for k in {*self.layers, self.n_layers}:
            module = self.base.get_input_embeddings() if k == 0 else blocks[k - 1]
            module.register_forward_hook(self._keep(k))

    def _keep(self, k: int) -> Any:
        def hook(_module: Any, _inputs: Any, output: Any) -> None:
            self._captured[k] = output[0] if isinstance(output, tuple) else output

        return hook

    @property
    def device(self) -> Any:
        """Where the input ids go: the embedding's device."""
        return self.base.get_input_embeddings().weight.device

    def __call__(self, ids: Any, attention_mask: Any = None) -> tuple[Any, Any]:
        """(aux [B, T, n_aux*H], last [B, T, H]) in the model's dtype for a batch of ids.

        Right padding under a causal mask leaves every real position's states as they are
        alone; a batch of one needs no mask at all."""
        import torch

        self._captured.clear()
        try:
            self.base(input_ids=ids, attention_mask=attention_mask, use_cache=False)
            aux = torch.cat([self._captured[k] for k in self.layers], dim=-1)
            return aux, self._captured[self.n_layers]
        finally:
            self._captured.clear()  # states are big: none outlive the batch

"""What `eagle3kit export` wrote: each checkpoint, and the whole export (`--json`'s shape)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Exported:
    """One written checkpoint."""

    format: str
    path: str
    layout: str
    tensors: int
    bytes: int
    dtype: str
    aux_layer_ids: list[int]
    """Boundary convention (vLLM's `eagle_aux_hidden_state_layer_ids`)."""
    aux_layer_ids_output: list[int]
    """Layer-output convention (SGLang's `eagle_config` ids)."""
    draft_vocab_size: int
    verifier: str | None
    has_embedding: bool
    checks: list[tuple[str, str]]
    """(name, what was checked), all passed: a failed check stops the export."""


@dataclass
class ExportResult:
    source: str
    source_layout: str
    out: str
    exports: list[Exported]
    warnings: list[str]

    def to_dict(self) -> dict:
        return {
            "source": self.source,
            "source_layout": self.source_layout,
            "out": self.out,
            "exports": [e.__dict__ for e in self.exports],
            "warnings": self.warnings,
        }

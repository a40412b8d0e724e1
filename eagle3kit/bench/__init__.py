"""bench: acceptance length before deployment (`accept`), on a live server (`server`), and the
gate between them (`parity`).

- `eagle3kit.bench.accept.run(AcceptConfig)`: real EAGLE-3 speculative decoding with the
  transformers target, checked against the target's own decoding.
- `eagle3kit.bench.server.run(ServerBenchConfig)`: acceptance, throughput and latency of a
  running SGLang or vLLM server that speculates.
- `eagle3kit.bench.parity.run(ParityConfig)`: the serving-parity gate, the server's
  acceptance against bench accept's on the same prompts, and why they differ.

Submodules import torch only inside functions where they can; importing this package is free.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from eagle3kit._lazy import attribute_loader
from eagle3kit.bench.stats import Acceptance, predicted_length

_HOMES = {"AcceptConfig": "accept", "AcceptReport": "result", "parse_tree": "accept"}

__all__ = [
    "AcceptConfig",
    "AcceptReport",
    "Acceptance",
    "parse_tree",
    "predicted_length",
    "run_accept",
]

if TYPE_CHECKING:
    from eagle3kit.bench.accept import AcceptConfig, parse_tree
    from eagle3kit.bench.result import AcceptReport

__getattr__ = attribute_loader(__name__, _HOMES)


def run_accept(cfg: AcceptConfig) -> AcceptReport:
    """`eagle3kit bench accept`: see eagle3kit.bench.accept.run."""
    from eagle3kit.bench.accept import run

    return run(cfg)

"""bench: acceptance length before deployment (`accept`) and on a live server (`server`).

- `eagle3kit.bench.accept.run(AcceptConfig)`: real EAGLE-3 speculative decoding with the
  transformers target, checked against the target's own decoding.
- `eagle3kit.bench.server.run(ServerBenchConfig)`: acceptance, throughput and latency of a
  running SGLang or vLLM server that speculates.

Submodules import torch only inside functions where they can; importing this package is free.
"""

from eagle3kit.bench.stats import Acceptance, predicted_length

__all__ = ["Acceptance", "predicted_length"]

"""The temperature-0 probe of `bench parity` at temperature > 0: where the engine keeps almost
no drafts while bench accept keeps some, are both sides in agreement at temperature 0? If so,
the drafter and what is served are sound and the engine's sampling is at fault (vLLM 0.32.0's
CPU build: vllm#55005), a cause inspection alone cannot name (diagnose.engine_sampling)."""

from __future__ import annotations

import dataclasses
from typing import Any

from eagle3kit import _ui
from eagle3kit.bench import diagnose
from eagle3kit.bench.stats import likely_misconfigured
from eagle3kit.errors import UserError


def engine_length(online: Any) -> float | None:
    """The engine's acceptance length as bench accept counts it (SGLang's without the
    prefill token)."""
    return (
        online.acceptance_length_without_prefill
        if online.api == "sglang"
        else online.acceptance_length
    )


def sampling_probe(
    cfg: Any, k: int, online: Any, offline: Any, agree: bool
) -> list[diagnose.Finding]:
    """bench parity at temperature > 0 (`cfg` a ParityConfig; `online` and `offline` its
    two sides' reports): where the engine keeps almost no drafts while bench accept keeps
    some, both sides measured again at temperature 0 on the first diagnose.PROBE_SAMPLES
    conversations. Agreeing there (and keeping drafts), the engine's sampling is at fault."""
    import eagle3kit.bench.accept as accept
    import eagle3kit.bench.server as server

    sampled = engine_length(online)
    if (
        cfg.temperature == 0
        or agree
        or offline is None
        or likely_misconfigured(offline.acceptance_length)
        or not diagnose.keeps_almost_nothing(sampled, online.per_position)
        or (sampled or 1.0) >= offline.acceptance_length
    ):
        return []
    zero = dataclasses.replace(
        cfg,
        temperature=0.0,
        max_samples=min(cfg.max_samples or diagnose.PROBE_SAMPLES, diagnose.PROBE_SAMPLES),
    )
    _ui.info(
        f"the engine keeps almost no drafts at temperature {cfg.temperature:g}: both "
        f"sides again at temperature 0 on {zero.max_samples} conversations",
        cfg.output,
    )
    try:
        engine_zero = engine_length(server.measure(zero.server_config()))
        offline_zero = accept.run(zero.accept_config(k)).acceptance_length
    except UserError:  # the probe is a diagnosis: a failure of its own leaves the gate's
        return []
    if (
        engine_zero is None
        or offline_zero is None
        or likely_misconfigured(engine_zero)
        or abs(engine_zero - offline_zero) > cfg.tolerance + 1e-9
    ):
        return []
    return [
        diagnose.engine_sampling(online.api, cfg.temperature, sampled, engine_zero, offline_zero)
    ]

"""The temperature-0 probe of `bench parity` at temperature > 0: where the engine's figures
disagree with bench accept's, are both sides in agreement at temperature 0? If so, the
drafter and what is served are sound and the engine's sampling is at fault (vLLM 0.32.0's CPU
build: vllm#55005), a cause inspection alone cannot name (diagnose.engine_sampling).

The broken build's signature varies from run to run, since it verifies against whatever the
memory held: mostly it keeps almost no drafts, but it has been seen keeping 1.22 a round where
bench accept kept 1.58, and keeping the first draft as often as bench accept and never a
second, and once keeping more than bench accept with the chain breaking elsewhere. So any
disagreement is probed (the length outside its interval, or a draft position outside its
own: stats.compare_sampled), and so is an engine keeping almost nothing even inside the
interval (on few prompts it can reach past 1), except one another of
the engine's verification rules explains (measured offline when the server does not say its
rule) or the server's own rule, differing from bench accept's, already explains."""

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
    cfg: Any, k: int, online: Any, offline: Any, agree: bool, rule: Any, served: Any
) -> list[diagnose.Finding]:
    """bench parity at temperature > 0 (`cfg` a ParityConfig; `online` and `offline` its
    two sides' reports, `rule` the one bench accept verified by, `served` what the server
    said): where the engine's figures disagree with bench accept's, both sides measured
    again at temperature 0 on the first diagnose.PROBE_SAMPLES conversations. Agreeing there
    (and keeping drafts), the engine's sampling is at fault."""
    import eagle3kit.bench.accept as accept
    import eagle3kit.bench.server as server

    sampled = engine_length(online)
    garbled = diagnose.keeps_almost_nothing(sampled, online.per_position)
    if cfg.temperature == 0 or offline is None:
        return []
    if not worth_probing(sampled, garbled, agree, offline.acceptance_length):
        return []
    if not garbled and another_rule_explains(cfg, k, online, rule, served):
        return []
    zero = dataclasses.replace(
        cfg,
        temperature=0.0,
        max_samples=min(cfg.max_samples or diagnose.PROBE_SAMPLES, diagnose.PROBE_SAMPLES),
    )
    kept = (
        "almost no drafts"
        if garbled
        else "fewer drafts than bench accept"
        if (sampled or 1.0) < offline.acceptance_length
        else "drafts at other rates than bench accept"
    )
    _ui.info(
        f"the engine keeps {kept} at temperature {cfg.temperature:g}: both sides again at "
        f"temperature 0 on {zero.max_samples} conversations",
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
        diagnose.engine_sampling(
            online.api,
            cfg.temperature,
            sampled,
            engine_zero,
            offline_zero,
            bench_sampled=None if garbled else offline.acceptance_length,
        )
    ]


def worth_probing(engine: float | None, garbled: bool, agree: bool, offline: float) -> bool:
    """Whether the engine's sampled figure (`engine`; `garbled`: it keeps almost no drafts)
    calls for the probe against bench accept's `offline`: outside chance (`agree` false), in
    either direction, or keeping almost nothing where bench accept keeps more. The broken
    build has done all three in the vllm tier's gate on 4 prompts: 5 first drafts kept in 150
    rounds where bench accept kept 1.423 a round (one prompt holding most of bench accept's
    drafts widened the interval past 1, so chance admitted it), and 1.465 a round against
    1.423 with the chain breaking where bench accept's does not."""
    if likely_misconfigured(offline):
        return False
    return not agree or (garbled and (engine or 1.0) < offline)


def another_rule_explains(cfg: Any, k: int, online: Any, rule: Any, served: Any) -> bool:
    """Whether another verification rule explains the engine's figure: the server's own,
    where it says one that differs from bench accept's `rule` (the `verification` finding
    names it); else, for vLLM, its other rule (onehot, probabilistic), measured offline on
    the same prompts, with the engine's figure inside that interval."""
    import eagle3kit.bench.accept as accept
    from eagle3kit.bench.served import VLLM_RULES
    from eagle3kit.bench.stats import compare_sampled
    from eagle3kit.model.verification import Rule

    if served.verify is not None:
        return served.verify != rule.name
    if online.api != "vllm":
        return False
    for name in sorted(set(VLLM_RULES.values()) - {rule.name}):
        _ui.info(
            f"the engine's acceptance is outside the interval of rule '{rule.name}': bench "
            f"accept again as '{name}'",
            cfg.output,
        )
        try:
            other = accept.run(cfg.accept_config(k, Rule(name)))
        except UserError:
            return True  # not measured: no engine fault is claimed on a guess
        _, inside, _ = compare_sampled(
            engine_length(online),
            online.rounds,
            other.acceptance_length,
            other.interval,
            online.per_position,
            [p.rounds for p in other.prompts],
        )
        if inside:
            return True
    return False

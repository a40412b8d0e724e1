"""Why a served drafter accepts less than it should: what the parity gate can inspect.

Three sources, compared with each other:
- the drafter directory the user serves (`eagle3kit info`'s checks against the target);
- the run it came from (the provenance `eagle3kit export` wrote beside it, and the run's own
  drafter checkpoint): the aux layer ids, draft vocabulary, norm flags and layout (the
  EAGLE-3.1 norms, the layer count, an own embedding) training used;
- what the server says it serves (`Served`): its speculative method, drafter path and chain
  length (SGLang's /server_info; vLLM's /server_info when started with
  VLLM_SERVER_DEV_MODE=1, else the `--speculative-config` the user passes the gate), its
  model and context length, and the prompt its chat template makes (vLLM's /tokenize).

Each finding names one cause of `CAUSES`; the docs' troubleshooting has an entry per cause.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eagle3kit.bench.stats import likely_misconfigured
from eagle3kit.target import to_layer_output

CAUSES = {
    "aux-layer-ids": "aux layer ids",
    "d2t": "d2t/t2d mapping",
    "embed-tokens": "embed_tokens",
    "norm": "norm flags",
    "rope": "RoPE and context length",
    "draft-vocab": "draft vocabulary",
    "chat-template": "chat template and BOS",
    "method": "speculative method",
    "verification": "verification rule at temperature > 0",
    "engine-sampling": "the engine's sampling at temperature > 0",
    "served-drafter": "the drafter served",
    "served-target": "the target served",
    "checkpoint": "the drafter checkpoint",
    "unexplained": "no cause found by inspection",
}
"""cause -> what it is about, as the report and the docs name it."""


@dataclass(frozen=True)
class Finding:
    cause: str
    """A key of CAUSES."""
    message: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass
class Served:
    """What the server says it serves; None where it does not say."""

    api: str
    model: str | None = None
    """The target path or name the server loaded."""
    context_length: int | None = None
    method: str | None = None
    """eagle3 / eagle / ... (lower case) as the server names it."""
    drafter: str | None = None
    k: int | None = None
    source: str | None = None
    """Where the speculative fields came from (None: the server does not expose them)."""
    verify: str | None = None
    """How it verifies drafts at temperature > 0 (eagle3kit.model.verification.RULES): vLLM's
    draft_sample_method (greedy: onehot), SGLang's rule."""
    thresholds: tuple[float, float] = (1.0, 1.0)
    """SGLang's speculative_accept_threshold_single and _acc."""
    template_ids: list[int] | None = None
    """The prompt ids the server's chat template makes of the first prompt (vLLM /tokenize)."""
    extra: dict[str, Any] = field(default_factory=dict)


# The drafter, against the target -------------------------------------------------------------
_PROBLEM_CAUSES = (
    ("aux layer ids", "aux-layer-ids"),
    ("boundary ids", "aux-layer-ids"),
    ("fc takes", "aux-layer-ids"),
    ("embed_tokens", "embed-tokens"),
    ("norm_before_residual", "norm"),
    ("norm_before_fc", "norm"),
    ("fc_norm", "norm"),
    ("max_position_embeddings", "rope"),
    ("d2t", "d2t"),
    ("t2d", "d2t"),
    ("draft vocabulary", "draft-vocab"),
    ("lm_head", "draft-vocab"),
    ("vocabulary of", "draft-vocab"),
)


def problem_cause(problem: str) -> str:
    """The cause an `eagle3kit info` problem line is about."""
    for needle, cause in _PROBLEM_CAUSES:
        if needle in problem:
            return cause
    return "checkpoint"


def drafter_findings(info: Any) -> list[Finding]:
    """`eagle3kit info`'s problems of the served drafter (inspected against the target)."""
    return [Finding(problem_cause(p), f"{info.path}: {p}") for p in info.problems]


def layer_rope(info: Any) -> tuple[float | None, dict | None]:
    """(rope_theta, rope_scaling) of the checkpoint's draft layer config."""
    from eagle3kit.checkpoints.base import layer_config, target_rope

    try:
        layer = layer_config(info.layout, info.config)
    except Exception:  # an unreadable layout has no rope to compare
        return None, None
    if not any(k in layer for k in ("rope_theta", "rope_parameters", "rope_scaling")):
        return None, None
    return target_rope(layer)


def rope_findings(info: Any, target: dict) -> list[Finding]:
    from eagle3kit.checkpoints.base import target_rope

    theta, scaling = layer_rope(info)
    if theta is None:
        return []
    t_theta, t_scaling = target_rope(target)
    if float(theta) != float(t_theta) or (scaling or None) != (t_scaling or None):
        return [
            Finding(
                "rope",
                f"{info.path}: the drafter's RoPE (theta {theta:g}, scaling "
                f"{scaling}) is not the target's (theta {t_theta:g}, scaling "
                f"{t_scaling}): positions are encoded differently from training",
            )
        ]
    return []


# The drafter, against its run ----------------------------------------------------------------
def run_findings(info: Any, provenance: dict | None, run_info: Any | None) -> list[Finding]:
    """Where the served drafter differs from what its run recorded."""
    out: list[Finding] = []
    where = info.path
    recorded = ((provenance or {}).get("aux_layer_ids") or {}).get("boundary")
    if run_info is not None and run_info.aux_layer_ids:
        recorded = run_info.aux_layer_ids
    if recorded and info.aux_layer_ids and list(recorded) != list(info.aux_layer_ids):
        shifted = to_layer_output(recorded) == list(info.aux_layer_ids)
        out.append(
            Finding(
                "aux-layer-ids",
                (
                    f"{where}: aux layer ids {info.aux_layer_ids} ({info.layer_ids_source}) but "
                    f"the run "
                    f"trained on boundary ids {list(recorded)}"
                    + (
                        "; these are the run's ids in the layer-output convention (one less each), "
                        "written where the boundary convention is read"
                        if shifted
                        else ""
                    )
                ),
            )
        )
    vocab = ((provenance or {}).get("draft_vocab") or {}).get("size")
    if run_info is not None and run_info.draft_vocab_size:
        vocab = run_info.draft_vocab_size
    if vocab and info.draft_vocab_size and int(vocab) != info.draft_vocab_size:
        out.append(
            Finding(
                "draft-vocab",
                f"{where}: draft vocabulary of {info.draft_vocab_size} but the run trained {vocab}",
            )
        )
    if (
        run_info is not None
        and run_info.norm_before_residual is not None
        and info.norm_before_residual is not None
        and run_info.norm_before_residual != info.norm_before_residual
    ):
        out.append(
            Finding(
                "norm",
                (
                    f"{where}: norm_before_residual is {str(info.norm_before_residual).lower()} "
                    f"but the "
                    f"run trained with {str(run_info.norm_before_residual).lower()}: the engine "
                    f"adds "
                    f"the residual from the wrong tensor"
                ),
            )
        )
    trained = getattr(run_info, "variant", None) or {}
    served = getattr(info, "variant", None) or {}
    for name in trained if served else ():
        if trained[name] != served.get(name):
            out.append(
                Finding(
                    "norm" if "norm" in name else "checkpoint",
                    (
                        f"{where}: {name} is {_flag(served.get(name))} but the run trained with "
                        f"{_flag(trained[name])}: the engine computes another drafter than the one "
                        f"trained"
                    ),
                )
            )
    return out


def _flag(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


# What the server serves ----------------------------------------------------------------------
def _same_place(given: str, served: str, cwd: Path | None = None) -> bool:
    a, b = Path(given), Path(served)
    if not b.is_absolute() and cwd is not None:
        b = cwd / b
    if a.exists() and b.exists():
        return a.resolve() == b.resolve()
    return a.name == b.name or str(a) == str(b)


def served_findings(
    served: Served,
    drafter: Path,
    target: Path,
    info: Any,
    target_config: dict,
    renderer_ids: list[int] | None,
    bos_id: int | None,
) -> list[Finding]:
    out: list[Finding] = []
    if served.method is not None and served.method.lower() != "eagle3":
        out.append(
            Finding(
                "method",
                (
                    f"the server speculates with method {served.method!r} ({served.source}): an "
                    f'EAGLE-3 drafter needs eagle3 (vLLM: "method": "eagle3"; SGLang: '
                    f"--speculative-algorithm EAGLE3); served as plain EAGLE it reads the wrong "
                    f"features and accepts almost nothing"
                ),
            )
        )
    if served.drafter and not _same_place(str(drafter), served.drafter):
        out.append(
            Finding(
                "served-drafter",
                (
                    f"the server serves the drafter {served.drafter} ({served.source}), not "
                    f"--drafter "
                    f"{drafter}: the gate measured another checkpoint offline"
                ),
            )
        )
    if served.model and not _same_place(str(target), served.model):
        out.append(
            Finding(
                "served-target",
                (f"the server serves the model {served.model}, not --target {target}"),
            )
        )
    limit = info.max_position_embeddings
    if served.context_length and limit and served.context_length > limit:
        out.append(
            Finding(
                "rope",
                (
                    f"the server's context length {served.context_length} is longer than the "
                    f"drafter's max_position_embeddings {limit} (the target's is "
                    f"{target_config.get('max_position_embeddings')}): past it the drafter's "
                    f"positions "
                    f"are ones it never saw"
                ),
            )
        )
    if (
        served.template_ids is not None
        and renderer_ids is not None
        and served.template_ids != renderer_ids
    ):
        out.append(
            Finding("chat-template", template_message(served.template_ids, renderer_ids, bos_id))
        )
    return out


def template_message(server: list[int], ours: list[int], bos_id: int | None) -> str:
    head = "the server's chat template makes another prompt than the run's tokenizer"
    if bos_id is not None and server[1:] == ours and server[:1] == [bos_id]:
        return (
            f"{head}: it adds a BOS ({bos_id}) the run's prompts do not have; chat "
            f"requests get a prompt the drafter was not trained on"
        )
    if bos_id is not None and ours[1:] == server and ours[:1] == [bos_id]:
        return f"{head}: it leaves out the BOS ({bos_id}) the run's prompts start with"
    at = next(
        (i for i, (a, b) in enumerate(zip(server, ours, strict=False)) if a != b),
        min(len(server), len(ours)),
    )
    return (
        f"{head} ({len(server)} vs {len(ours)} tokens, first difference at token {at}): "
        f"start the server with the run's template (--chat-template) so chat requests get "
        f"the prompts the drafter was trained on"
    )


# When the figures alone say something is wrong ----------------------------------------------
def verification_findings(served: Served, rule: str, temperature: float) -> list[Finding]:
    """At temperature > 0: the engine verifies by another rule than bench accept did."""
    if temperature == 0 or served.verify is None or served.verify == rule:
        return []
    flag = "bench parity --verify auto (the default) or --verify " + served.verify
    return [
        Finding(
            "verification",
            (
                f"the engine verifies drafts as '{served.verify}' ({served.source}) but bench "
                f"accept "
                f"verified them as '{rule}': at temperature {temperature:g} the two rules accept "
                f"different shares of the same drafts; rerun with {flag}"
            ),
        )
    ]


def unexplained(
    engine: float | None,
    offline: float | None,
    near_one: bool,
    served: Served,
    rule: str | None = None,
) -> Finding:
    seen = (
        ""
        if served.source
        else "; the server does not say what it speculates with: start vLLM with "
        "VLLM_SERVER_DEV_MODE=1 or pass the gate --speculative-config with the JSON the "
        "server was started with, so it can compare"
    )
    if near_one:
        return Finding(
            "unexplained",
            (
                f"the engine accepts almost nothing (acceptance length {engine:.3f}) and nothing "
                f"inspected explains it: check the aux layer ids the engine reads (an override in "
                f"--speculative-config, or the other convention), the method (eagle3, not eagle) "
                f"and that the drafter was trained for this target{seen}"
            ),
        )
    if rule is not None:  # sampled: the rule is the first suspect, and it went unseen
        return Finding(
            "unexplained",
            (
                f"the engine's acceptance length {_fmt(engine)} is outside the interval around "
                f"the offline {_fmt(offline)}, which verified drafts as '{rule}': the engine "
                f"likely verifies by another rule (vLLM's draft_sample_method: greedy is "
                f"'onehot', probabilistic is 'probabilistic'; SGLang's is 'sglang'), else it "
                f"drafts from other features or another drafter than --drafter{seen}"
            ),
        )
    return Finding(
        "unexplained",
        (
            f"the engine's acceptance length {_fmt(engine)} differs from the offline "
            f"{_fmt(offline)} and nothing inspected explains it: the engine drafts from other "
            f"features or another drafter than --drafter{seen}"
        ),
    )


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


# When the engine's own sampling is at fault -------------------------------------------------
NEAR_ZERO = 0.05
"""A first draft position kept less often than this: the engine keeps almost no drafts."""
PROBE_SAMPLES = 4
"""Conversations the temperature-0 probe measures (of the run's own, the first ones)."""
SERVER_ZERO_KEEPS = 1.5
"""`bench server` has no offline side: the temperature-0 acceptance length above which a
sampled one near 1 is the engine's fault (half a draft kept a round, where a sound engine at
temperature > 0 keeps far more than none)."""
EXPAND_FIX = "eagle3kit/bench/vllm_cpu_expand_fix/sitecustomize.py"
"""The patch a vLLM CPU server takes first on its PYTHONPATH (`python -m
eagle3kit.bench.vllm_cpu_expand_fix` prints the folder)."""


def keeps_almost_nothing(length: float | None, per_position: list[float | None]) -> bool:
    """The engine's figures at temperature > 0 say it keeps almost no drafts: an acceptance
    length near 1, or a first position kept under NEAR_ZERO of the rounds."""
    first = per_position[0] if per_position else None
    return likely_misconfigured(length) or (first is not None and first < NEAR_ZERO)


def engine_sampling(
    api: str,
    temperature: float,
    sampled: float | None,
    zero: float,
    offline_zero: float | None = None,
    bench_sampled: float | None = None,
) -> Finding:
    """The engine keeps almost no drafts at `temperature` (or, `bench_sampled` given, other
    than bench accept's figure there under every rule it has) but keeps them at 0 (`zero`,
    with bench accept's `offline_zero` beside it where the gate measured one): its sampling,
    not the drafter, is at fault."""
    agrees = "" if offline_zero is None else f", as bench accept does ({offline_zero:.3f})"
    kept = (
        "almost no drafts"
        if bench_sampled is None
        else f"fewer drafts than bench accept allows under any rule it has "
        f"({bench_sampled:.3f} as verified)"
        if (sampled or 1.0) < bench_sampled
        else f"drafts at rates bench accept matches under no rule it has "
        f"({bench_sampled:.3f} as verified)"
    )
    head = (
        f"at temperature {temperature:g} the engine keeps {kept} (acceptance "
        f"length {_fmt(sampled)}) but the same server at temperature 0 accepts "
        f"{zero:.3f}{agrees}: its sampling at temperature > 0 is at fault, not the drafter"
    )
    if api != "vllm":
        return Finding(
            "engine-sampling",
            (
                f"{head}; check the engine's release notes for a sampling fix, and measure at "
                f"temperature 0 meanwhile"
            ),
        )
    return Finding(
        "engine-sampling",
        (
            f"{head}. vLLM 0.32.0's CPU build verifies sampled drafts against uninitialised "
            f"memory (vllm#55005: its C++ stand-in for expand_kernel never copies the "
            f"temperatures back), and garbles greedy requests batched with sampled ones too: start "
            f"the server with {EXPAND_FIX} first on its PYTHONPATH (`python -m "
            f"eagle3kit.bench.vllm_cpu_expand_fix` prints the folder), serve from a GPU build, or "
            f"serve at temperature 0 (docs/troubleshooting.md, engine-sampling)"
        ),
    )

"""`eagle3kit bench parity`: the serving-parity gate, after export and before deployment.

The same prompts go through the user's server (SGLang or vLLM, speculating with the drafter)
and through `bench accept` (the drafter and the target in-process); the gate shows the two
acceptance figures side by side, per draft position where the engine reports positions
(vLLM), and fails (exit 1) when they differ by more than `--tolerance`, when the engine
accepts almost nothing, or when inspection finds a served setting that differs from the run
(eagle3kit.bench.diagnose names the cause). At temperature 0 both sides are deterministic
and count the same rounds, so they agree within --tolerance; at temperature > 0 both are
random, and the engine's figure must fall inside the confidence interval around bench
accept's (`stats.compare_sampled`). What the server serves is read by served.py, the report is
result.py's `ParityReport`, shown by report.py.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import eagle3kit.bench.diagnose as diagnose
import eagle3kit.bench.prompts as bench_prompts
from eagle3kit import _ui
from eagle3kit._options import SEED_BOUNDS, embed, opt
from eagle3kit.bench.contexts import DepthOptions
from eagle3kit.bench.parity_report import show_parity
from eagle3kit.bench.result import ParityReport
from eagle3kit.bench.served import inspect_server
from eagle3kit.bench.stats import compare_sampled, likely_misconfigured
from eagle3kit.errors import UserError
from eagle3kit.target import parse_dtype

TOLERANCE = 0.05


@dataclass
class ParityConfig:
    server: str = field(metadata=opt(metavar="URL", cli_only="destination"))
    """Your SGLang or vLLM server, speculating with --drafter: its URL."""
    prompts: list[Path] = field(metadata=bench_prompts.PROMPTS_ARG)
    """Prompt files, as gen takes them (JSONL, JSON, parquet); EAGLE/MT-bench question.jsonl."""
    target: Path
    """The target model directory."""
    drafter: Path
    """The drafter directory the server serves (an `eagle3kit export` output)."""
    speculative_config: dict[str, Any] | str | None = field(
        default=None, metadata=opt(metavar="JSON", type=str)
    )
    """The --speculative-config the vLLM server was started with, for servers that do not
    expose it."""
    tolerance: float = TOLERANCE
    """Largest engine - bench accept difference that passes at temperature 0, overall and
    per position."""
    temperature: float = 0.0
    """Sampling temperature of both sides; above 0 the acceptance lengths must agree within
    their confidence interval."""
    verify: str = field(default="auto", metadata=opt(metavar="RULE"))
    """bench accept's verification rule at temperature > 0: auto (the one the server says it
    runs, else vLLM's default onehot), onehot, probabilistic or sglang."""
    top_p: float = 1.0
    """Top-p of both sides (sent to the server, applied by bench accept)."""
    top_k: int = -1
    """Top-k of both sides; -1 off."""
    seed: int = field(default=0, metadata=opt(bounds=SEED_BOUNDS))
    """Sampling seed of both sides."""
    api: str = "auto"
    """auto, sglang or vllm."""
    k: int | None = field(default=None, metadata=opt("--k"))
    """Draft tokens per round, when the server does not say."""
    max_new_tokens: int = 128
    """Tokens generated per turn."""
    max_samples: int | None = None
    """At most N conversations."""
    max_turns: int | None = None
    """At most N turns of each."""
    format: str = "auto"
    """Prompt file shape (as gen's --format)."""
    chat_template: Path | None = None
    """A Jinja chat template file."""
    device: str = "auto"
    """bench accept's device: auto, cpu, cuda, cuda:N."""
    dtype: str = "auto"
    """bench accept's dtype: auto, bfloat16, float16, float32."""
    api_key: str | None = field(
        default=None, repr=False, metadata=opt(envvar="EAGLE3KIT_API_KEY", cli_only="secret")
    )
    """Bearer token for the servers (never stored)."""
    request_timeout: float | None = field(default=None, metadata=opt(metavar="SECONDS"))
    """Limit on one request (default none)."""
    trust_remote_code: bool = field(default=False, metadata=opt(cli_only="code"))
    """Run code the target directory ships (auto_map); only ever from the flag."""
    depth: DepthOptions = field(default_factory=DepthOptions, metadata=embed())
    output: _ui.OutputOptions = field(default_factory=_ui.OutputOptions)

    def __post_init__(self) -> None:
        from eagle3kit._json import json_object

        bench_prompts.required(server=self.server)
        self.prompts = bench_prompts.prompt_files(
            self.prompts, optional=self.depth.context_from is not None
        )
        bench_prompts.required(target=self.target, drafter=self.drafter)
        self.target, self.drafter = Path(self.target), Path(self.drafter)
        if not self.drafter.is_dir():
            raise UserError(f"--drafter {self.drafter}: no such checkpoint directory")
        if not (self.target / "config.json").is_file():
            raise UserError(f"--target {self.target}: no config.json (not a model directory)")
        self.dtype, note = parse_dtype(self.dtype)
        if note:
            _ui.warn(note)
        from eagle3kit.bench.accept import check_sampling
        from eagle3kit.model.acceptance import VERIFY_RULES as RULES

        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise UserError(f"--temperature must be >= 0 (got {self.temperature})")
        check_sampling(self, ("auto", *RULES))
        if not (0 <= self.tolerance < 1 and math.isfinite(self.tolerance)):
            raise UserError(f"--tolerance must be in [0, 1) (got {self.tolerance})")
        if isinstance(self.speculative_config, str):
            self.speculative_config = json_object(self.speculative_config, "--speculative-config")

    def server_config(self) -> Any:
        from eagle3kit.bench.server import ServerBenchConfig

        return ServerBenchConfig(
            self.server,
            self.prompts,
            self.target,
            api=self.api,
            chat_template=self.chat_template,
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=self.seed,
            max_samples=self.max_samples,
            max_turns=self.max_turns,
            format=self.format,
            k=self.k,
            api_key=self.api_key,
            request_timeout=self.request_timeout,
            trust_remote_code=self.trust_remote_code,
            depth=self.depth,
            output=_inner(self.output),
        )

    def accept_config(self, k: int, rule: Any = None) -> Any:
        """bench accept's config: the server's k, and at temperature > 0 `rule`
        (eagle3kit.model.verification.Rule)."""
        from eagle3kit.bench.accept import AcceptConfig
        from eagle3kit.model.verification import Rule

        rule = rule or Rule()
        return AcceptConfig(
            self.target,
            self.drafter,
            self.prompts,
            k=k,
            temperature=self.temperature,
            verify=rule.name,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=self.seed,
            speculative_accept_threshold_single=rule.threshold_single,
            speculative_accept_threshold_acc=rule.threshold_acc,
            max_new_tokens=self.max_new_tokens,
            max_samples=self.max_samples,
            max_turns=self.max_turns,
            format=self.format,
            chat_template=self.chat_template,
            device=self.device,
            dtype=self.dtype,
            trust_remote_code=self.trust_remote_code,
            depth=self.depth,
            output=_inner(self.output),
        )


def _inner(opts: _ui.OutputOptions) -> _ui.OutputOptions:
    """The measurements' own output: their progress, not their reports (the gate's is one)."""
    return _ui.OutputOptions(
        quiet=True, no_progress=opts.no_progress or opts.quiet, log_every=opts.log_every
    )


# The run the drafter came from ---------------------------------------------------------------
def run_checkpoint(drafter: Path) -> tuple[dict | None, Any | None]:
    """(export provenance, `inspect` of the run's own drafter) where they can be found."""
    from eagle3kit.checkpoints.detect import inspect
    from eagle3kit.checkpoints.provenance import read_provenance
    from eagle3kit.checkpoints.rundir import RunDir

    provenance = read_provenance(drafter)
    source = (provenance or {}).get("source")
    if not source:
        return provenance, None
    source_path = Path(source)
    run = RunDir.holding(source_path) or RunDir(source_path)
    checkpoint = run.drafter if run.exists() and run.has_drafter() else source_path
    try:
        return provenance, inspect(checkpoint)
    except UserError:
        return provenance, None


# The gate ------------------------------------------------------------------------------------
def run(cfg: ParityConfig) -> ParityReport:
    import eagle3kit.bench.accept as accept
    import eagle3kit.bench.prompts as prompts
    import eagle3kit.bench.server as server
    from eagle3kit.checkpoints.base import target_dict
    from eagle3kit.checkpoints.detect import inspect

    info = inspect(cfg.drafter, cfg.target)
    target_config, _ = target_dict(cfg.target)
    assert target_config is not None  # None only for no target; --target is required
    _ui.info(f"bench parity: {cfg.server} against bench accept with {cfg.drafter}", cfg.output)
    online = server.measure(cfg.server_config())
    k = online.k or cfg.k or 3

    convs = prompts.load(cfg.prompts, cfg.format, cfg.max_samples) if cfg.prompts else []
    renderer = prompts.load_renderer(
        cfg.target, "--target", cfg.chat_template, cfg.trust_remote_code
    )
    # The template is checked on the first prompt file's record (contexts cut from a
    # dataset are ids already).
    first = renderer.history(convs[0], 0, []) if convs else None
    # (cast: ParityConfig parsed --speculative-config to a dict)
    served = inspect_server(
        cfg.server,
        cfg.api_key,
        online.api,
        first,
        cast(dict[str, Any] | None, cfg.speculative_config),
    )
    ours = (
        renderer.render(first, convs[0].tools)
        if first is not None and served.template_ids is not None
        else None
    )
    rule = verification_rule(cfg, served)

    offline, refused = None, None
    try:
        offline = accept.run(cfg.accept_config(k, rule))
    except UserError as exc:  # a drafter bench accept cannot run is itself a finding
        refused = str(exc)

    provenance, run_info = run_checkpoint(cfg.drafter)
    findings = [
        *(
            [diagnose.Finding("checkpoint", f"bench accept refused the drafter: {refused}")]
            if refused
            else []
        ),
        *diagnose.drafter_findings(info),
        *diagnose.rope_findings(info, target_config),
        *diagnose.run_findings(info, provenance, run_info),
        *diagnose.served_findings(
            served,
            cfg.drafter,
            cfg.target,
            info,
            target_config,
            ours,
            renderer.tokenizer.bos_token_id,
        ),
        *diagnose.verification_findings(served, rule.name, cfg.temperature),
    ]
    engine_length = (
        online.acceptance_length_without_prefill
        if online.api == "sglang"
        else online.acceptance_length
    )
    offline_figures: dict[str, Any] = {
        "acceptance_length": offline.acceptance_length if offline else None,
        "per_position": offline.per_position if offline else [],
        "lossless": offline.lossless if offline else None,
        "predicted_acceptance_length": offline.predicted_acceptance_length if offline else None,
        "rounds": offline.rounds if offline else 0,
        "interval": offline.interval if offline else None,
    }
    sampled = cfg.temperature > 0
    if sampled:
        differences, agree, interval = compare_sampled(
            engine_length,
            online.rounds,
            offline_figures["acceptance_length"],
            offline_figures["interval"],
            online.per_position,
            [p.rounds for p in offline.prompts] if offline else [],
        )
        differences["per_position"] = [
            None if a is None or b is None else a - b
            for a, b in zip(online.per_position, offline_figures["per_position"], strict=False)
        ]
    else:
        differences, agree = compare(
            engine_length,
            online.per_position,
            offline_figures["acceptance_length"],
            offline_figures["per_position"],
            cfg.tolerance,
        )
        interval = None
    near_one = engine_length is not None and likely_misconfigured(engine_length)
    from eagle3kit.bench.probe import sampling_probe  # T > 0, the engine disagreeing

    findings += sampling_probe(cfg, k, online, offline, agree, rule, served)
    if (not agree or near_one) and not findings:
        findings.append(
            diagnose.unexplained(
                engine_length,
                offline_figures["acceptance_length"],
                near_one,
                served,
                rule.name if sampled else None,
            )
        )
    warnings = []
    if served.source is None:
        warnings.append(
            "the server does not say which drafter and method it speculates with "
            "(vLLM: start it with VLLM_SERVER_DEV_MODE=1, or pass "
            "--speculative-config): those were not checked"
        )
    if sampled and served.verify is None and cfg.verify == "auto":
        warnings.append(
            f"the server does not say how it verifies drafts: bench accept "
            f"verified them as vLLM's default, '{rule.name}'"
        )
    if offline_figures["lossless"] is False:
        warnings.append(
            "bench accept's output differed from the target's own: see bench accept's mismatches"
        )
    report = ParityReport(
        server=cfg.server,
        api=online.api,
        version=online.version,
        drafter=str(cfg.drafter),
        target=str(cfg.target),
        shape=f"chain k={k}",
        k=k,
        temperature=cfg.temperature,
        tolerance=cfg.tolerance,
        passed=agree and not near_one and not findings,
        agree=agree,
        engine={
            "acceptance_length": engine_length,
            "per_position": online.per_position,
            "source": online.source,
            "requests": online.requests,
            "errors": online.errors,
            "rounds": online.rounds,
        },
        offline=offline_figures,
        differences=differences,
        phases=offline.phases if offline else {},
        served={k_: v for k_, v in asdict(served).items() if k_ not in ("template_ids", "extra")}
        | {"template_checked": served.template_ids is not None},
        findings=[f.to_dict() for f in findings],
        warnings=warnings,
        depths=depth_sides(online.depths, offline.depths if offline else {}),
        verify=rule.name if sampled else None,
        top_p=cfg.top_p,
        top_k=cfg.top_k,
        interval=interval,
    )
    if online.depths:
        far = [
            name
            for name, d in report.depths.items()
            if d["difference"] is not None and abs(d["difference"]) > cfg.tolerance + 1e-9
        ]
        if far:
            report.warnings.append(
                f"the engine and bench accept differ by more than {cfg.tolerance:g} at context "
                f"depth {', '.join(far)}: see the table per context depth"
            )
    elif any(d["from"] > 0 for d in report.depths.values()):  # deep rounds, unchecked
        report.warnings.append(
            "the server does not report its rounds per request: the engine's side of the "
            "depth buckets is missing (start vLLM with --per-request-spec-decode-metrics "
            "detailed)"
        )
    show_parity(report, cfg.output)
    return report


def depth_sides(
    engine: dict[str, dict[str, Any]], offline: dict[str, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Per depth bucket either side had rounds in: both sides' figures and engine minus
    offline (None where one side had none)."""
    out = {}
    for name in [*offline, *(n for n in engine if n not in offline)]:
        eng, off = engine.get(name), offline.get(name)
        either = eng or off
        assert either is not None
        out[name] = {
            "from": either["from"],
            "to": either["to"],
            "engine": _side(eng),
            "offline": _side(off),
            "difference": (
                eng["acceptance_length"] - off["acceptance_length"] if eng and off else None
            ),
        }
    return out


def _side(figures: dict[str, Any] | None) -> dict[str, Any] | None:
    return (
        None
        if figures is None
        else {key: figures[key] for key in ("rounds", "acceptance_length", "per_position")}
    )


def verification_rule(cfg: ParityConfig, served: diagnose.Served) -> Any:
    """The rule bench accept verifies by: --verify, or with auto the server's own (its
    SGLang thresholds too), else vLLM's default."""
    from eagle3kit.model.verification import Rule

    name = cfg.verify if cfg.verify != "auto" else (served.verify or "onehot")
    thresholds = served.thresholds if name == "sglang" else (1.0, 1.0)
    return Rule(name, *thresholds)


def compare(
    engine: float | None,
    engine_positions: list[float | None],
    offline: float | None,
    offline_positions: list[float | None],
    tolerance: float,
) -> tuple[dict[str, Any], bool]:
    """(engine minus offline, overall and per position; whether all are within tolerance).
    Positions are compared where the engine reports them (vLLM); a missing figure disagrees."""
    overall = None if engine is None or offline is None else engine - offline
    positions = [
        None if a is None or b is None else a - b
        for a, b in zip(engine_positions, offline_positions, strict=False)
    ]
    agree = (
        overall is not None
        and abs(overall) <= tolerance + 1e-9
        and all(d is not None and abs(d) <= tolerance + 1e-9 for d in positions)
    )
    if engine_positions and len(engine_positions) != len(offline_positions):
        agree = False
    return {"acceptance_length": overall, "per_position": positions}, agree

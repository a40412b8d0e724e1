"""`eagle3kit bench accept`: acceptance length of a drafter, measured by real speculative
decoding with the transformers target, before anyone deploys it.

Every prompt is decoded twice on the same device: by the target alone (the reference, and the
tokens/s baseline) and speculatively. At temperature 0 the two outputs must agree token for
token; where they part, the target's own logits at that step must show a near-tie (the token
speculation chose is within --tie-epsilon of the top logit), or the run fails (exit 1).
"""

from __future__ import annotations

import math
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import Any

import eagle3kit.bench.prompts as bench_prompts
from eagle3kit import _ui
from eagle3kit._options import SEED_BOUNDS, embed, opt
from eagle3kit.bench.accept_figures import (
    category_figures,
    interval_figures,
    predicted_length,
    report_warnings,
    speed_figures,
)
from eagle3kit.bench.accept_load import check_pair, load_drafter, load_target, training_prediction
from eagle3kit.bench.contexts import DepthOptions
from eagle3kit.bench.result import AcceptReport, PromptResult
from eagle3kit.bench.stats import Acceptance
from eagle3kit.errors import UserError
from eagle3kit.model.depth import round_depths
from eagle3kit.target import parse_dtype, resolve_device, resolve_dtype

TIE_EPSILON = {"float32": 1e-3, "bfloat16": 0.25, "float16": 0.05}
"""Default --tie-epsilon per dtype: a k+1-token verification pass and one-token decoding sum
in different orders, so their logits differ by rounding; bf16 logits near 20 are spaced 0.125."""


def parse_tree(text: str | None) -> tuple[int, int] | None:
    """'TOPK,DEPTH' -> (topk, depth)."""
    if text is None:
        return None
    parts = text.split(",")
    try:
        topk, depth = (int(p) for p in parts)
    except ValueError:
        raise UserError(f"--tree {text}: expected TOPK,DEPTH, e.g. --tree 4,5") from None
    if topk < 1 or depth < 1:
        raise UserError(f"--tree {text}: TOPK and DEPTH must be at least 1")
    return topk, depth


def check_sampling(cfg: Any, rules: tuple[str, ...] | None = None) -> None:
    """--verify, --top-p, --top-k and SGLang's thresholds, as bench accept and bench parity
    take them."""
    from eagle3kit.model.acceptance import VERIFY_RULES as RULES

    rules = rules or RULES
    if cfg.verify not in rules:
        raise UserError(f"--verify must be one of {', '.join(rules)} (got {cfg.verify})")
    if not (0 < cfg.top_p <= 1):
        raise UserError(f"--top-p must be in (0, 1] (got {cfg.top_p})")
    if cfg.top_k == 0 or cfg.top_k < -1:
        raise UserError(f"--top-k must be -1 (off) or at least 1 (got {cfg.top_k})")
    for flag, value in (
        (
            "--speculative-accept-threshold-single",
            getattr(cfg, "speculative_accept_threshold_single", 1.0),
        ),
        (
            "--speculative-accept-threshold-acc",
            getattr(cfg, "speculative_accept_threshold_acc", 1.0),
        ),
    ):
        if not (0 < value <= 1):
            raise UserError(f"{flag} must be in (0, 1] (got {value})")
        if value != 1 and cfg.verify != "sglang":
            raise UserError(f"{flag} is SGLang's: give it with --verify sglang")


@dataclass
class AcceptConfig:
    target: Path
    """The target model (a transformers directory)."""
    drafter: Path
    """The drafter checkpoint directory (any layout `eagle3kit info` reads)."""
    prompts: list[Path] = field(metadata=bench_prompts.PROMPTS_ARG)
    """Prompt files, as gen takes them (JSONL, JSON, parquet); EAGLE/MT-bench question.jsonl."""
    k: int | None = field(default=None, metadata=opt("--k"))
    """Draft tokens per round (a chain); 3 when not given (a tree's depth is its own)."""
    tree: tuple[int, int] | str | None = field(
        default=None, metadata=opt(metavar="TOPK,DEPTH", type=str)
    )
    """Draft a tree instead of a chain: TOPK candidates per level, DEPTH levels."""
    temperature: float = 0.0
    """Sampling temperature; 0 is greedy (and checks losslessness)."""
    verify: str = field(default="onehot", metadata=opt(metavar="RULE"))
    """How the target verifies drafts at temperature > 0, as the engine you serve with:
    onehot (vLLM's default, draft_sample_method greedy), probabilistic (vLLM's
    draft_sample_method probabilistic) or sglang (SGLang's EAGLE rule, with its accept
    thresholds)."""
    top_p: float = 1.0
    """Top-p the server samples with (applied to the target's distribution after the
    temperature and top-k, as vLLM and SGLang do)."""
    top_k: int = -1
    """Top-k the server samples with; -1 off."""
    speculative_accept_threshold_single: float = 1.0
    """With --verify sglang: SGLang's flag of that name (a draft whose target probability
    reaches it is kept)."""
    speculative_accept_threshold_acc: float = 1.0
    """With --verify sglang: SGLang's flag of that name (a draft is kept with probability
    min(1, p / this))."""
    max_new_tokens: int = 128
    """Tokens generated per turn."""
    max_samples: int | None = None
    """At most N conversations."""
    max_turns: int | None = None
    """At most N turns of each conversation (default all)."""
    format: str = "auto"
    """Prompt file shape (as gen's --format)."""
    tokenizer: Path | None = None
    """The tokenizer directory (default: the target's)."""
    chat_template: Path | None = None
    """A Jinja chat template file."""
    device: str = "auto"
    """auto (cuda when there is one), cpu, cuda, cuda:N."""
    dtype: str = "auto"
    """auto (float32 on CPU, bfloat16 on GPU), bfloat16, float16, float32."""
    tie_epsilon: float | None = None
    """Largest top-1 minus chosen-token logit gap counted as a near-tie (default 1e-3 fp32,
    0.25 bf16, 0.05 fp16)."""
    seed: int = field(default=0, metadata=opt(bounds=SEED_BOUNDS))
    """Sampling seed."""
    plot: Path | None = field(default=None, metadata=opt(metavar="FILE.png"))
    """Draw acceptance per position and category, and against context depth (plot extra)."""
    trust_remote_code: bool = field(default=False, metadata=opt(cli_only="code"))
    """Run code the target directory ships (auto_map in its config or tokenizer); only ever
    from the flag."""
    depth: DepthOptions = field(default_factory=DepthOptions, metadata=embed())
    output: _ui.OutputOptions = field(default_factory=_ui.OutputOptions)
    prompts_alias: InitVar[list[Path] | None] = field(
        default=None, metadata=bench_prompts.PROMPTS_ALIAS
    )
    """Deprecated: give the prompt files positionally."""

    def __post_init__(self, prompts_alias: list[Path] | None) -> None:
        bench_prompts.required(target=self.target, drafter=self.drafter)
        self.prompts = bench_prompts.prompt_files(
            self.prompts, prompts_alias, optional=self.depth.context_from is not None
        )
        if isinstance(self.tree, str):
            if self.k is not None:
                raise UserError(
                    "--k and --tree exclude each other: a tree's depth is its "
                    "second number (--tree TOPK,DEPTH)"
                )
            self.tree = parse_tree(self.tree)
        self.target, self.drafter = Path(self.target), Path(self.drafter)
        for path in self.prompts:
            if not path.is_file():
                raise UserError(f"{path}: no such prompt file")
        if not self.target.is_dir():
            raise UserError(f"--target {self.target}: no such model directory")
        if not self.drafter.is_dir():
            raise UserError(f"--drafter {self.drafter}: no such checkpoint directory")
        for flag, value in (
            ("--k", self.k),
            ("--max-new-tokens", self.max_new_tokens),
            ("--max-samples", self.max_samples),
            ("--max-turns", self.max_turns),
        ):
            if value is not None and value < 1:
                raise UserError(f"{flag} must be at least 1 (got {value})")
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise UserError(f"--temperature must be >= 0 (got {self.temperature})")
        if self.tie_epsilon is not None and not (
            self.tie_epsilon >= 0 and math.isfinite(self.tie_epsilon)
        ):
            raise UserError(f"--tie-epsilon must be a finite number >= 0 (got {self.tie_epsilon})")
        check_sampling(self)
        if self.tree is not None and self.temperature > 0:
            raise UserError(
                "--tree verifies greedily: use it with --temperature 0, or draft "
                "a chain (--k N) to sample"
            )
        self.dtype, note = parse_dtype(self.dtype)
        if note:
            _ui.warn(note)
        if self.plot is not None:
            from eagle3kit._plot import check_plotting

            check_plotting(Path(self.plot))

    @property
    def rule(self) -> Any:
        """The verification rule (eagle3kit.model.verification.Rule) --verify names."""
        from eagle3kit.model.verification import Rule

        return Rule(
            self.verify,
            self.speculative_accept_threshold_single,
            self.speculative_accept_threshold_acc,
        )

    @property
    def chain_k(self) -> int:
        """Draft tokens per round of a chain: --k, or 3 when it was not given."""
        return 3 if self.k is None else self.k

    @property
    def tree_shape(self) -> tuple[int, int] | None:
        """--tree as (TOPK, DEPTH): `__post_init__` has parsed the text by now."""
        assert not isinstance(self.tree, str), "parsed in __post_init__"
        return self.tree

    @property
    def shape(self) -> str:
        tree = self.tree_shape
        if tree is not None:
            return f"tree top-{tree[0]} depth {tree[1]}"
        return f"chain k={self.chain_k}"


# Running ------------------------------------------------------------------------------------
def compare(spec: list[int], plain: Any, epsilon: float) -> tuple[str, int | None, float | None]:
    """Where speculation's output first differs from the target's own, and whether the
    target was nearly tied there."""
    for i, (mine, ref) in enumerate(zip(spec, plain.tokens, strict=False)):
        if mine != ref:
            ids, logits = plain.top_ids[i], plain.top_logits[i]
            margin = logits[0] - logits[ids.index(mine)] if mine in ids else math.inf
            return ("near-tie" if margin <= epsilon else "mismatch"), i, margin
    if len(spec) != len(plain.tokens):
        return "mismatch", min(len(spec), len(plain.tokens)), None
    return "identical", None, None


def _warm_up(target: Any, drafter: Any, cfg: AcceptConfig, sampler_cls: Any) -> None:
    """First calls pay for kernel selection and allocation; keep that out of the timings."""
    import eagle3kit.bench.decode as decode

    prompt = [0, 1, 2, 3]
    decode.plain(target, prompt, 4, set(), sampler_cls(0.0))
    decode.speculate(
        target, drafter, prompt, 4, set(), sampler_cls(0.0), cfg.chain_k, cfg.tree_shape
    )


def run(cfg: AcceptConfig) -> AcceptReport:
    import torch

    import eagle3kit.bench.decode as decode
    from eagle3kit.chat import phases

    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    dtype_name = str(dtype).removeprefix("torch.")
    epsilon = cfg.tie_epsilon if cfg.tie_epsilon is not None else TIE_EPSILON[dtype_name]
    tokenizer_flag = "--tokenizer" if cfg.tokenizer else "--target"
    renderer = bench_prompts.load_renderer(
        cfg.tokenizer or cfg.target, tokenizer_flag, cfg.chat_template, cfg.trust_remote_code
    )
    convs = bench_prompts.sources(
        cfg.prompts,
        cfg.format,
        cfg.max_samples,
        cfg.depth.context_from,
        cfg.depth.cuts,
        renderer.vocab_size,
    )
    model = load_target(cfg.target, device, dtype, cfg.trust_remote_code)
    # The embedding goes in after the pair check, so a drafter for another target gets that
    # message rather than a shape error.
    drafter, checkpoint_notes = load_drafter(cfg.drafter, None, model.config)
    check_pair(drafter, model, cfg.drafter, cfg.target)
    drafter.load_target_embedding(model.get_input_embeddings().weight.detach().float().cpu())
    drafter = drafter.to(device=device, dtype=dtype).eval()
    target = decode.Target(model, drafter.config.aux_layer_ids)
    stops = set(renderer.stop_token_ids)
    markers = phases.Markers.of(renderer.tokenizer)
    from eagle3kit.bench.report import sampling_label

    _ui.info(
        f"bench accept: {cfg.shape}, {sampling_label(cfg)}, "
        f"max {cfg.max_new_tokens} new tokens, {device} {dtype_name}, "
        f"{len(convs)} conversations",
        cfg.output,
    )
    _warm_up(target, drafter, cfg, decode.Sampler)
    from eagle3kit.model import attention

    _ui.warn_all(attention.take_warnings())  # the kernel picked on first use

    results: list[PromptResult] = []
    with _ui.Progress("bench accept", len(convs), cfg.output, unit="prompts") as progress:
        for number, conv in enumerate(convs):
            made = 0
            for turn, answered, prompt in conv.turns(renderer, cfg.max_turns):
                seed = cfg.seed * 1_000_003 + number * 101 + turn

                def sampler(offset: int, seed: int = seed) -> decode.Sampler:
                    gen = torch.Generator().manual_seed(seed * 2 + offset)
                    return decode.Sampler(cfg.temperature, gen, cfg.rule, cfg.top_k, cfg.top_p)

                ref = decode.plain(target, prompt, cfg.max_new_tokens, stops, sampler(0))
                spec = run_one(target, drafter, prompt, cfg, stops, sampler(1))
                status, where, margin = (
                    compare(spec.tokens, ref, epsilon)
                    if cfg.temperature == 0
                    else ("sampled", None, None)
                )
                results.append(
                    PromptResult(
                        conv.label,
                        turn + 1,
                        conv.category,
                        len(prompt),
                        len(spec.tokens),
                        spec.rounds,
                        spec.seconds,
                        ref.seconds,
                        status,
                        where,
                        margin,
                        phases.round_phases(prompt, spec.tokens, spec.rounds, markers)
                        if markers.known
                        else [],
                        round_depths(len(prompt), spec.rounds),
                    )
                )
                answered(spec.tokens)
                made += len(spec.tokens)
            progress.add(1, tokens=made)
    report = summarize(results, cfg, device=str(device), dtype=dtype_name, epsilon=epsilon)
    report.warnings[:0] = [f"--drafter {cfg.drafter}: {note}" for note in checkpoint_notes]
    from eagle3kit.bench.report import show_accept

    show_accept(report, cfg.output, cfg.plot)
    return report


def run_one(
    target: Any, drafter: Any, prompt: list[int], cfg: AcceptConfig, stops: set[int], sampler: Any
) -> Any:
    import eagle3kit.bench.decode as decode

    return decode.speculate(
        target, drafter, prompt, cfg.max_new_tokens, stops, sampler, cfg.chain_k, cfg.tree_shape
    )


# Summarizing --------------------------------------------------------------------------------


def _positions(cfg: AcceptConfig) -> int:
    """Drafts a round can accept: k in a chain, the depth in a tree."""
    tree = cfg.tree_shape
    return cfg.chain_k if tree is None else tree[1]


def summarize(
    results: list[PromptResult], cfg: AcceptConfig, *, device: str, dtype: str, epsilon: float
) -> AcceptReport:
    from eagle3kit.chat.phases import by_phase
    from eagle3kit.model.depth import by_depth

    positions = _positions(cfg)
    acc = Acceptance(positions)
    for r in results:
        acc.add_all(r.rounds)
    by_category: dict[str, list[PromptResult]] = {}
    for r in results:
        by_category.setdefault(r.category, []).append(r)
    greedy = cfg.temperature == 0
    mismatches = sum(r.status == "mismatch" for r in results)
    predicted = training_prediction(cfg.drafter)
    report = AcceptReport(
        target=str(cfg.target),
        drafter=str(cfg.drafter),
        device=device,
        dtype=dtype,
        shape=cfg.shape,
        k=positions,
        temperature=cfg.temperature,
        max_new_tokens=cfg.max_new_tokens,
        tie_epsilon=epsilon,
        acceptance_length=acc.length,
        per_position=acc.per_position,
        per_position_conditional=acc.conditional,
        rounds=acc.rounds,
        tokens=sum(r.tokens for r in results),
        **speed_figures(results),
        lossless=(mismatches == 0) if greedy else None,
        near_ties=sum(r.status == "near-tie" for r in results),
        mismatches=mismatches,
        categories={name: category_figures(rs, positions) for name, rs in by_category.items()},
        phases=by_phase([(r.phases, r.rounds) for r in results if r.phases], positions),
        depth_edges=list(cfg.depth.edges),
        depths=by_depth([(r.prompt_tokens, r.rounds) for r in results], positions, cfg.depth.edges),
        verify=None if greedy else cfg.verify,
        top_p=cfg.top_p,
        top_k=cfg.top_k,
        interval=None if greedy else interval_figures(results),
        predicted_acceptance_length=predicted_length(predicted),
        predicted=predicted,
        prompts=results,
    )
    report.warnings = report_warnings(report, predicted)
    return report

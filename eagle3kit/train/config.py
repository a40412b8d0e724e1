"""What a training run is asked to do, checked before anything is loaded.

No torch here: the CLI builds a TrainConfig for `--help`-speed validation, and the stage
imports the heavy modules only once the options are known to be usable.
"""

from __future__ import annotations

import math
from dataclasses import InitVar, asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from eagle3kit import _ui
from eagle3kit._options import SEED_BOUNDS, OutputOptions, WriteOptions, arg, embed, not_option, opt
from eagle3kit._served_files import served_dir_problems
from eagle3kit.errors import UserError
from eagle3kit.target import check_layer_ids, device_problem, parse_dtype, parse_layer_ids
from eagle3kit.train.option_values import (
    DATA_ORDERS,
    DRAFTER_STEPS,
    DTYPES,
    LM_HEADS,
    LONG_POLICIES,
    LOSSES,
    RECORDED_DTYPES,
    SCHEDULES,
    TRAJECTORY_OPTIONS,
    DataSpec,
    default_lr,
)


@dataclass
class TrainConfig:
    data: list[DataSpec] = field(
        metadata=arg(metavar="DATA[:WEIGHT]... RUN", last="out", type=list[str])
    )
    """Hidden-state datasets (offline), or token datasets with --online; `DIR:W` weights one."""
    out: Path = field(metadata=not_option())  # filled by DATA... RUN's last value
    """The run directory (created, or continued when it holds a run)."""
    target: Path | None
    """The target model directory (HF layout). Required: None is refused by name, with any
    other problems of the command line."""
    online: bool = False
    """Run the frozen target in the loop on token datasets instead of reading stored states."""
    layers: list[int] | str | None = field(default=None, metadata=opt(metavar="2,18,33", type=str))
    """Aux layer ids (boundary convention) for --online; offline they come from the data."""
    servers: list[str] = field(
        default_factory=list, metadata=opt("--server", metavar="URL[@N]", cli_only="destination")
    )
    """--online --server: vLLM servers running extract_hidden_states (`URL` or `URL@SLOTS`)
    give the states; no target weights but the final norm, lm_head and embedding load."""
    prefetch: int | None = field(default=None, metadata=opt(metavar="SAMPLES"))
    """--server: samples fetched ahead of the training step and held (the queue's depth);
    default max(64, 2 x all servers' slots)."""
    concurrency: int = 8
    """--server: requests in flight per server (and rank) unless URL@SLOTS says."""
    request_timeout: float = field(default=600.0, metadata=opt(metavar="SECONDS"))
    """--server: seconds one request may take before the server counts as stalled."""
    model: str | None = None
    """--server: the served model name (default: each server's first)."""
    hidden_states_dir: Path | None = field(
        default=None, metadata=opt(metavar="DIR", cli_only="deletion")
    )
    """--server: the servers' shared_storage_path as this machine sees it (or a folder
    holding them all); only `.safetensors` files inside it that a server names are read,
    then deleted. Required with --server."""
    api_key: str | None = field(
        default=None, repr=False, metadata=opt(envvar="EAGLE3KIT_API_KEY", cli_only="secret")
    )
    """--server: bearer token for the servers (never stored)."""
    draft_vocab: int = field(default=32000, metadata=opt(metavar="N"))
    """Draft vocabulary size: the most frequent loss-carrying tokens (capped at the target's)."""
    init_from: Path | None = field(default=None, metadata=opt(metavar="DIR"))
    """Warm-start from an EAGLE-3 checkpoint, keeping its draft vocabulary."""
    variant: str | None = field(default=None, metadata=opt(metavar="NAME"))
    """The layout of a new drafter: eagle3 (the reference EAGLE-3 drafter), speculators
    (speculators 0.9.0's CLI defaults) or eagle3.1; None: eagle3, or --init-from's own."""
    norm_before_residual: bool | None = field(
        default=None, metadata=opt("--norm-before-residual/--no-norm-before-residual")
    )
    """Override the variant: the first layer's residual is the normed hidden input."""
    norm_before_fc: bool | None = field(
        default=None, metadata=opt("--norm-before-fc/--no-norm-before-fc")
    )
    """Override the variant: one RMSNorm over the concatenated aux states before fc."""
    fc_norm: bool | None = field(default=None, metadata=opt("--fc-norm/--no-fc-norm"))
    """Override the variant: one RMSNorm per aux state before fc."""
    norm_output: bool | None = field(default=None, metadata=opt("--norm-output/--no-norm-output"))
    """Override the variant: feed the final norm's output to the next step."""
    num_hidden_layers: int | None = field(default=None, metadata=opt(metavar="N"))
    """Override the variant: decoder layers."""
    embed_requires_grad: bool | None = field(
        default=None, metadata=opt("--embed-requires-grad/--no-embed-requires-grad")
    )
    """Override the variant: train the drafter's own embedding (stored in its checkpoints)."""
    fc_scale: str | None = field(default=None, metadata=opt(metavar="auto|off|NUMBER"))
    """Train fc as if the target's states reached it times this: auto (1 / their RMS), off or a
    number; its weights stay the layout's (docs/train.md, "The scale of fc's input").
    Default: auto for a new run (off with --server), a continued run's own."""
    ttt_steps: int = 3
    """Training-time-test steps: at least the chain length the drafter will serve (k)."""
    ttt_decay: float = 1.0
    """Weight of step k's loss: decay**k."""
    loss: str = "soft-ce"
    """The loss of each training-time-test step (docs/train.md, "Objectives"): soft-ce
    (cross-entropy against the target's distribution: forward KL, as EAGLE-3 trains), tv
    (1 − α, where α = Σ min(p, q) is the chance a sampled draft is kept), nla (−log α) or lk
    (λ·KL + (1 − λ)·TV, λ = exp(−3α))."""
    auf: bool = field(default=False, metadata=opt("--auf/--no-auf"))
    """Accept-until-fail: weigh step k by the chance the chain's earlier drafts were kept
    under the serving rule (--eval-temperature, --eval-verify), since a chain discards every
    draft after its first miss."""
    teacher_temperature: float = 1.0
    """The target distribution the drafter learns: softmax(logits / T) (1: the target's own)."""
    max_len: int | None = field(default=None, metadata=opt(metavar="TOKENS"))
    """Longest sample trained on, in tokens (default: the target's context length, its
    max_position_embeddings: whole samples)."""
    long_samples: str = "truncate"
    """What happens to longer samples: truncate or drop."""
    sliding_window: int | None = field(default=None, metadata=opt(metavar="TOKENS"))
    """The draft layers attend to the last N positions only (a sliding window, exported for
    vLLM and SGLang); default: every earlier position (docs/train.md, "Long contexts")."""
    lr: float | None = field(default=None, metadata=opt(metavar="NUMBER"))
    """Peak learning rate (default: from the drafter's hidden size, 1e-4 from 4,096 up to 1e-3
    at 64 and below, log-linear between; docs/train.md, "Why these defaults")."""
    min_lr: float = 0.0
    """Learning rate the decay ends at."""
    schedule: str = "cosine"
    """After the warm-up: cosine or linear decay to --min-lr, or constant (docs/train.md,
    "Why these defaults")."""
    lm_head: str = "target"
    """The drafter's lm_head: target (starts as the target's rows of the draft vocabulary,
    trained; the default, docs/train.md "Why these defaults"), train (fresh) or frozen (the
    target's rows, never trained, as speculators 0.9.0 does)."""
    data_order: str = "shuffle"
    """shuffle: a fresh seeded order each epoch; fixed: one seeded order for every epoch."""
    warmup: float = 0.05
    """Linear warm-up: a share of the steps when < 1, else a number of steps."""
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    """Largest global gradient norm; 0 turns clipping off."""
    batch_tokens: int = field(default=8192, metadata=opt(metavar="N"))
    """Tokens per micro-batch and rank; a step is batch_tokens x ranks x grad_accum."""
    grad_accum: int = 1
    """Micro-batches per rank and optimizer step."""
    epochs: float | None = None
    """Passes over the training split (default 1, or as many as --max-steps needs)."""
    max_steps: int | None = None
    """Stop after this many optimizer steps."""
    seed: int = field(default=0, metadata=opt(bounds=SEED_BOUNDS))
    device: str = "auto"
    """auto (cuda when available), cpu, cuda, cuda:N."""
    dtype: str = "auto"
    """The drafter's autocast: auto (bfloat16 on GPU, float32 on CPU), bfloat16 or float32."""
    eval_split: float = field(default=0.05, metadata=opt(metavar="SHARE|COUNT"))
    """Held-out samples: a share when < 1, else a count; chosen by sample-id hash; 0: none."""
    eval_every: int = field(default=500, metadata=opt(metavar="STEPS"))
    """Evaluate the held-out split every N steps (and at the end); 0: only at the end."""
    eval_k: int = 3
    """Draft chain length for the predicted acceptance length."""
    eval_temperature: float = 0.0
    """Temperature of the predicted acceptance length: 0 is greedy decoding; above 0 the
    acceptance when the server samples at it and verifies by --eval-verify (walked along the
    data when gen sampled them at it, else expected)."""
    eval_verify: str = field(default="onehot", metadata=opt(metavar="RULE"))
    """The verification rule of the prediction at --eval-temperature > 0, as bench accept's
    --verify: onehot (vLLM's default), probabilistic or sglang."""
    checkpoint_every: int = field(default=1000, metadata=opt(metavar="STEPS"))
    """Write a resumable checkpoint every N steps (and at the end)."""
    checkpoint_interval: float = field(default=30.0, metadata=opt(metavar="MINUTES"))
    """Also write one when N minutes have passed since the last (0: off)."""
    keep: int = 2
    """How many checkpoints to keep."""
    drafter_step: str = "best"
    """Which step RUN/drafter/ (what export and bench read) holds: best (the evaluated step
    with the highest held-out predicted acceptance length; the last step without a held-out
    split) or last."""
    patience: int = field(default=0, metadata=opt(metavar="EVALS"))
    """Stop training once N evaluations in a row have not raised the best held-out predicted
    acceptance length (the chain figure at --eval-temperature and --eval-verify); 0: never."""
    fsdp: bool = False
    """Shard the drafter, its gradients and optimizer state over the ranks (FSDP2) instead
    of a whole copy per rank (DDP)."""
    trust_remote_code: bool = field(default=False, metadata=opt(cli_only="code"))
    """Run code the target directory ships (auto_map); only ever from the flag, never from
    what a dataset records."""
    report_to: str = field(default="none", metadata=opt(metavar="NAMES", cli_only="destination"))
    """Experiment trackers to send the metrics to, a comma list of tensorboard, wandb,
    mlflow, trackio (each an extra: pip install 'eagle3kit[wandb]'), set up by their usual
    environment variables; none: only metrics.jsonl."""
    write: WriteOptions = field(
        default_factory=WriteOptions, metadata=embed("resume", "overwrite", "force")
    )
    """--resume/--overwrite/--force: whether a run continues (auto), must (resume) or starts
    afresh, and whether one started with other settings may (force)."""
    output: OutputOptions = field(default_factory=OutputOptions)
    precision: InitVar[str | None] = field(default=None, metadata=opt(hidden=True))
    """--dtype's old name (with bf16 or fp32), still accepted with a note."""

    @classmethod
    def from_paths(cls, paths: list[str], **options: Any) -> TrainConfig:
        """DATA[:WEIGHT]... RUN as the command line gives them: the run directory last."""
        if len(paths) < 2:
            raise UserError("give the datasets, then the run directory last")
        *data, out = paths
        return cls(
            [DataSpec.parse(d) for d in data], Path(out), options.pop("target", None), **options
        )

    def __post_init__(self, precision: str | None) -> None:
        if self.out is None:  # a single path on the command line
            raise UserError("give the datasets, then the run directory last")
        self.data = [DataSpec.parse(d) for d in self.data]
        self.out = Path(self.out)
        self.target = None if self.target is None else Path(self.target)
        if self.init_from is not None:
            self.init_from = Path(self.init_from)
        if self.hidden_states_dir is not None:
            self.hidden_states_dir = Path(self.hidden_states_dir)
        if not self.data:
            raise UserError("give at least one dataset, then the run directory last")
        # Every problem of the command line at once (torchtune's config validation).
        found: list[str] = []
        _check_ranges(self, found)
        _check_choices(self, found)
        try:
            self._parse_dtype(precision)
        except UserError as exc:
            found.append(str(exc))
        _check_servers(self, found)
        _check_paths(self, found)
        from eagle3kit.train.trackers import parse_report_to

        found += parse_report_to(self.report_to)[1]
        if found:
            raise UserError("; ".join(found))

    @property
    def peak_lr(self) -> float:
        """--lr once set-up has set it (with_lr_for)."""
        if self.lr is None:
            raise RuntimeError("set-up sets --lr (with_lr_for) before training")
        return self.lr

    def auf_rule(self) -> str:
        """How --auf counts an earlier draft as kept: the serving rule the prediction models
        (greedy at --eval-temperature 0; SGLang's rule at its default thresholds is onehot)."""
        if not self.auf:
            return "off"
        if self.eval_temperature == 0:
            return "greedy"
        return "probabilistic" if self.eval_verify == "probabilistic" else "onehot"

    def drafter_variant(self) -> dict[str, Any]:
        """The layout fields of a new drafter: --variant's, then the field flags given."""
        from eagle3kit.model.config import VARIANTS

        fields = dict(VARIANTS.get(self.variant or "eagle3", VARIANTS["eagle3"]))
        for name in fields:
            if getattr(self, name) is not None:
                fields[name] = getattr(self, name)
        return fields

    @property
    def variant_given(self) -> bool:
        """Whether --variant or a field flag was given."""
        from eagle3kit.model.config import VARIANTS

        return self.variant is not None or any(
            getattr(self, name) is not None for name in VARIANTS["eagle3"]
        )

    @property
    def server_slots(self) -> list[tuple[str, int]]:
        """(url, slots) per --server, once checked."""
        out = []
        for s in self.servers:
            url, _, slots = s.rpartition("@")
            out.append((url, int(slots)))
        return out

    @property
    def prefetch_depth(self) -> int:
        return self.prefetch or max(64, 2 * sum(n for _, n in self.server_slots))

    @property
    def eval_count(self) -> int | None:
        """The held-out count when --eval-split is a count, else None."""
        return int(self.eval_split) if self.eval_split >= 1 else None

    def _parse_dtype(self, precision: str | None) -> None:
        """--dtype (or --precision, its old name) in the one dtype vocabulary."""
        given, old_name = self.dtype, None
        if precision is not None:
            given, old_name = precision, "--precision"
        self.dtype, note = parse_dtype(given, allowed=DTYPES, given_as=old_name)
        if note:
            _ui.warn(note)

    def trajectory_options(self) -> dict[str, Any]:
        """The trajectory-deciding options, as JSON (what run.json records and resume checks).
        The drafter's layout is among them when it is not the plain EAGLE-3 one (so runs of
        the default layout record what they always did)."""
        from eagle3kit.model.config import VARIANTS

        raw = asdict(self)
        out: dict[str, Any] = {}
        for name in TRAJECTORY_OPTIONS:
            value = raw.get(name)
            if name == "data":
                value = [d.to_json() for d in self.data]
            elif name == "precision":
                value = RECORDED_DTYPES.get(self.dtype, self.dtype)
            elif isinstance(value, Path):
                value = str(value.resolve())
            out[name] = value
        if self.drafter_variant() != VARIANTS["eagle3"]:
            out["variant"] = self.drafter_variant()
        # options added later, recorded only away from what runs made before them did
        out.update({k: raw[k] for k, before in RECORDED_UNLESS.items() if raw[k] not in before})
        if self.auf:
            out["auf"] = True
            # AUF weighs each step by the chance the earlier drafts were kept under these
            # serving conditions, so here they decide the trajectory too
            out["eval_temperature"] = self.eval_temperature
            if self.eval_temperature > 0:
                out["eval_verify"] = self.eval_verify
        return out


RECORDED_UNLESS: dict[str, tuple[Any, ...]] = {
    "sliding_window": (None,),
    "loss": ("soft-ce",),
    "teacher_temperature": (1.0,),
    "fc_scale": (None, "off"),
}
"""Trajectory options that run.json records only when not one of these values: the ones
runs made before each option had, so such a run's record stays what it always was."""


def with_fc_scale_for(cfg: TrainConfig, previous: dict | None) -> TrainConfig:
    """`cfg` with --fc-scale resolved when it was not given: a continued run keeps its own
    (off for one whose run.json records none: every run made before the option), a new run
    takes auto, or off with --server (whose states arrive only once training starts)."""
    if cfg.fc_scale is not None:
        return cfg
    if previous is not None:
        recorded = previous.get("settings", {}).get("fc_scale")
        return replace(cfg, fc_scale=str(recorded) if recorded is not None else "off")
    return replace(cfg, fc_scale="off" if cfg.servers else "auto")


def with_lr_for(cfg: TrainConfig, hidden_size: int) -> TrainConfig:
    """`cfg` with --lr set: as given, else default_lr for a drafter of `hidden_size` (the
    target's). Set-up calls it once the target's config is read, so everything after (the
    optimizer, run.json, a resume's comparison) sees one rate."""
    if cfg.lr is not None:
        return cfg
    lr = default_lr(hidden_size)
    if cfg.min_lr > lr:
        raise UserError(
            f"--min-lr ({cfg.min_lr}) must not exceed --lr, whose default for this "
            f"drafter (hidden size {hidden_size}) is {lr:.3g}: give --lr"
        )
    return replace(cfg, lr=lr)


# The command line's checks, each adding what it finds to `found` -------------------------
def _check_ranges(cfg: TrainConfig, found: list[str]) -> None:
    positive: dict[str, float] = {
        "--draft-vocab": cfg.draft_vocab,
        "--ttt-steps": cfg.ttt_steps,
        "--batch-tokens": cfg.batch_tokens,
        "--grad-accum": cfg.grad_accum,
        "--eval-k": cfg.eval_k,
        "--checkpoint-every": cfg.checkpoint_every,
        "--keep": cfg.keep,
    }
    for flag, value in positive.items():
        if not value >= 1:
            found.append(f"{flag} must be >= 1 (got {value})")
    if cfg.max_len is not None and cfg.max_len < 3:
        found.append(f"--max-len must be >= 3 tokens (got {cfg.max_len})")
    unrolled = max(cfg.ttt_steps, cfg.eval_k)
    if cfg.sliding_window is not None and not cfg.sliding_window >= unrolled:
        found.append(
            f"--sliding-window must be >= --ttt-steps and --eval-k ({unrolled}): the "
            f"last step unrolled sits that many positions past its context "
            f"(got {cfg.sliding_window})"
        )
    lr = {"--lr": cfg.lr} if cfg.lr is not None else {}
    for flag, value in {**lr, "--ttt-decay": cfg.ttt_decay}.items():
        if not (value > 0 and math.isfinite(value)):
            found.append(f"{flag} must be > 0 (got {value})")
    for flag, value in (
        ("--min-lr", cfg.min_lr),
        ("--warmup", cfg.warmup),
        ("--weight-decay", cfg.weight_decay),
        ("--grad-clip", cfg.grad_clip),
        ("--eval-split", cfg.eval_split),
        ("--checkpoint-interval", cfg.checkpoint_interval),
        ("--eval-every", cfg.eval_every),
        ("--patience", cfg.patience),
    ):
        if not (value >= 0 and math.isfinite(value)):
            found.append(f"{flag} must be >= 0 (got {value})")
    if not (cfg.eval_temperature >= 0 and math.isfinite(cfg.eval_temperature)):
        found.append(f"--eval-temperature must be >= 0 (got {cfg.eval_temperature})")
    if not (cfg.teacher_temperature > 0 and math.isfinite(cfg.teacher_temperature)):
        found.append(f"--teacher-temperature must be > 0 (got {cfg.teacher_temperature})")
    _check_fc_scale(cfg, found)
    from eagle3kit.model.acceptance import VERIFY_RULES as RULES

    if cfg.eval_verify not in RULES:
        found.append(f"--eval-verify must be one of {', '.join(RULES)} (got {cfg.eval_verify})")
    if cfg.lr is not None and cfg.min_lr > cfg.lr:
        found.append(f"--min-lr ({cfg.min_lr}) must not exceed --lr ({cfg.lr})")
    if cfg.eval_split >= 1 and not float(cfg.eval_split).is_integer():
        found.append(f"--eval-split is a share below 1 or a whole count (got {cfg.eval_split})")
    if cfg.epochs is not None and not (cfg.epochs > 0 and math.isfinite(cfg.epochs)):
        found.append(f"--epochs must be > 0 (got {cfg.epochs})")
    if cfg.max_steps is not None and cfg.max_steps < 1:
        found.append(f"--max-steps must be >= 1 (got {cfg.max_steps})")


def _check_fc_scale(cfg: TrainConfig, found: list[str]) -> None:
    if cfg.fc_scale is None or cfg.fc_scale == "off":
        return
    if cfg.fc_scale == "auto":
        if cfg.servers:
            found.append(
                "--fc-scale auto measures the states of the first training samples before "
                "training starts, when --server has fetched none: give the factor as a "
                "number (1 / the RMS of the states, docs/train.md)"
            )
        return
    try:
        value = float(cfg.fc_scale)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        found.append(f"--fc-scale must be auto, off or a number > 0 (got {cfg.fc_scale})")


def _check_variant(cfg: TrainConfig, found: list[str]) -> None:
    from eagle3kit.model.config import VARIANTS

    if cfg.variant is not None and cfg.variant not in VARIANTS:
        found.append(f"--variant must be one of {', '.join(VARIANTS)} (got {cfg.variant})")
        return
    if cfg.num_hidden_layers is not None and not cfg.num_hidden_layers >= 1:
        found.append(f"--num-hidden-layers must be >= 1 (got {cfg.num_hidden_layers})")
    fields = cfg.drafter_variant()
    if fields["norm_before_fc"] and fields["fc_norm"]:
        found.append(
            "--fc-norm and --norm-before-fc exclude each other (both normalise "
            "the aux states before fc)"
            + (
                f"; --variant {cfg.variant} has norm_before_fc"
                if cfg.variant and VARIANTS[cfg.variant]["norm_before_fc"]
                else ""
            )
            + (
                f"; --variant {cfg.variant} has fc_norm"
                if cfg.variant and VARIANTS[cfg.variant]["fc_norm"]
                else ""
            )
        )


def _check_choices(cfg: TrainConfig, found: list[str]) -> None:
    _check_variant(cfg, found)
    if cfg.long_samples not in LONG_POLICIES:
        found.append(f"--long-samples must be drop or truncate (got {cfg.long_samples})")
    for flag, value, allowed in (
        ("--schedule", cfg.schedule, SCHEDULES),
        ("--lm-head", cfg.lm_head, LM_HEADS),
        ("--data-order", cfg.data_order, DATA_ORDERS),
        ("--drafter-step", cfg.drafter_step, DRAFTER_STEPS),
        ("--loss", cfg.loss, LOSSES),
    ):
        if value not in allowed:
            found.append(f"{flag} must be one of {', '.join(allowed)} (got {value})")
    try:
        cfg.layers = parse_layer_ids(cfg.layers)
        if cfg.layers is not None:
            check_layer_ids(cfg.layers, count=3)
    except UserError as exc:
        found.append(str(exc))
    if cfg.layers is not None and not cfg.online:
        found.append(
            "--layers applies to --online training; offline, the layer ids are "
            "those the hidden-state dataset was extracted at"
        )
    problem = device_problem(cfg.device)
    if problem:
        found.append(problem)


def _check_servers(cfg: TrainConfig, found: list[str]) -> None:
    from eagle3kit.gen import parse_server

    for flag, value in (("--concurrency", cfg.concurrency), ("--prefetch", cfg.prefetch)):
        if value is not None and not value >= 1:
            found.append(f"{flag} must be >= 1 (got {value})")
    if not (cfg.request_timeout > 0 and math.isfinite(cfg.request_timeout)):
        found.append(f"--request-timeout must be > 0 seconds (got {cfg.request_timeout})")
    found += served_dir_problems(cfg.hidden_states_dir, bool(cfg.servers), "--server")
    if not cfg.servers:
        return
    if not cfg.online:
        found.append(
            "--server applies to --online training (the states come from the "
            "servers instead of the target in this process): add --online"
        )
    try:
        specs = [parse_server(s) for s in cfg.servers]
    except UserError as exc:
        found.append(str(exc))
        return
    if len({s.url for s in specs}) < len(specs):
        found.append("--server: the same server is given twice")
    cfg.servers = [f"{s.url}@{s.concurrency or cfg.concurrency}" for s in specs]


def _check_paths(cfg: TrainConfig, found: list[str]) -> None:
    # Here, not in the stage: a mistyped path is refused in a second, before torch loads.
    found += [f"{d.path}: no such dataset directory" for d in cfg.data if not d.path.is_dir()]
    if cfg.target is None:
        found.append("--target is required: the target model directory")
    elif not cfg.target.is_dir():
        found.append(f"--target {cfg.target}: no such directory")
    elif not (cfg.target / "config.json").is_file():
        found.append(f"--target {cfg.target}: no config.json there (an HF model directory?)")
    if cfg.init_from is not None and not cfg.init_from.is_dir():
        found.append(f"--init-from {cfg.init_from}: no such directory")
    if cfg.out.exists() and not cfg.out.is_dir():
        found.append(
            f"{cfg.out}: exists and is not a directory (the run directory "
            "train writes); give a new directory"
        )
    elif cfg.out.is_dir():  # a link where the run keeps its own files, in every mode
        from eagle3kit.checkpoints.rundir import RunDir

        try:
            RunDir(cfg.out).check_no_links()
        except UserError as exc:
            found.append(str(exc))

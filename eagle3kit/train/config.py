"""What a training run is asked to do, checked before anything is loaded.

No torch here: the CLI builds a TrainConfig for `--help`-speed validation, and the stage
imports the heavy modules only once the options are known to be usable.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eagle3kit._options import OutputOptions, WriteOptions
from eagle3kit.errors import UserError
from eagle3kit.target import check_layer_ids, parse_layer_ids

LONG_POLICIES = ("drop", "truncate")
PRECISIONS = ("auto", "bf16", "fp32")
SCHEDULES = ("cosine", "linear", "constant")
LM_HEADS = ("train", "target", "frozen")
DATA_ORDERS = ("shuffle", "fixed")

SETTINGS = (
    "data", "target", "online", "layers", "draft_vocab", "init_from", "ttt_steps",
    "ttt_decay", "max_len", "long_samples", "lr", "min_lr", "warmup", "weight_decay",
    "grad_clip", "batch_tokens", "grad_accum", "epochs", "max_steps", "seed", "eval_split",
    "eval_k", "precision", "schedule", "lm_head", "data_order",
)
"""The options that decide a run's trajectory: continuing a run with any of them changed
needs --force. Logging, checkpoint cadence, --device, --fsdp and --eval-every may change
freely."""


@dataclass(frozen=True)
class DataSpec:
    """One training dataset and its mixing weight (`DIR` or `DIR:0.3`)."""

    path: Path
    weight: float = 1.0

    @classmethod
    def parse(cls, text: str | Path | DataSpec) -> DataSpec:
        """`DIR` or `DIR:WEIGHT`; a colon followed by something that is not a number is part
        of the path."""
        if isinstance(text, DataSpec):
            return text
        raw = str(text)
        head, sep, tail = raw.rpartition(":")
        if sep and head:
            try:
                weight = float(tail)
            except ValueError:
                return cls(Path(raw))
            if not (weight > 0 and math.isfinite(weight)):
                raise UserError(f"{raw}: a dataset weight must be a number > 0 (got {tail})")
            return cls(Path(head), weight)
        return cls(Path(raw))

    def to_json(self) -> dict:
        return {"path": str(self.path.resolve()), "weight": self.weight}


@dataclass
class TrainConfig:
    data: list[DataSpec]
    """Hidden-state datasets (offline), or token datasets with --online; `DIR:W` weights one."""
    out: Path
    """The run directory (created, or continued when it holds a run)."""
    target: Path | None
    """The target model directory (HF layout). Required: None is refused by name, with any
    other problems of the command line."""
    online: bool = False
    """Run the frozen target in the loop on token datasets instead of reading stored states."""
    servers: list[str] = field(default_factory=list)
    """--online --server: vLLM servers running extract_hidden_states (`URL` or `URL@SLOTS`)
    give the states; no target weights but the final norm, lm_head and embedding load."""
    prefetch: int | None = None
    """--server: samples fetched ahead of the training step and held (the queue's depth);
    default max(64, 2 x all servers' slots)."""
    concurrency: int = 8
    """--server: requests in flight per server (and rank) unless URL@SLOTS says."""
    request_timeout: float = 600.0
    """--server: seconds one request may take before the server counts as stalled."""
    model: str | None = None
    """--server: the served model name (default: each server's first)."""
    layers: list[int] | str | None = None
    """Aux layer ids (boundary convention) for --online; offline they come from the data."""
    draft_vocab: int = 32000
    """Draft vocabulary size: the most frequent loss-carrying tokens (capped at the target's)."""
    init_from: Path | None = None
    """Warm-start from an EAGLE-3 checkpoint, keeping its draft vocabulary."""
    variant: str | None = None
    """The layout of a new drafter: eagle3 (the reference EAGLE-3 drafter), speculators
    (speculators 0.9.0's CLI defaults) or eagle3.1; None: eagle3, or --init-from's own."""
    norm_before_residual: bool | None = None
    """Override the variant: the first layer's residual is the normed hidden input."""
    norm_before_fc: bool | None = None
    """Override the variant: one RMSNorm over the concatenated aux states before fc."""
    fc_norm: bool | None = None
    """Override the variant: one RMSNorm per aux state before fc."""
    norm_output: bool | None = None
    """Override the variant: feed the final norm's output to the next step."""
    num_hidden_layers: int | None = None
    """Override the variant: decoder layers."""
    embed_requires_grad: bool | None = None
    """Override the variant: train the drafter's own embedding (stored in its checkpoints)."""
    ttt_steps: int = 7
    """Training-time-test steps."""
    ttt_decay: float = 0.8
    """Weight of step k's loss: decay**k."""
    max_len: int | None = None
    """Longest sample trained on, in tokens (default: the target's context length, its
    max_position_embeddings: whole samples)."""
    long_samples: str = "truncate"
    """What happens to longer samples: truncate or drop."""
    lr: float = 1e-4
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
    warmup: float = 0.015
    """Linear warm-up: a share of the steps when < 1, else a number of steps."""
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    """Largest global gradient norm; 0 turns clipping off."""
    batch_tokens: int = 8192
    """Tokens per micro-batch and rank; a step is batch_tokens x ranks x grad_accum."""
    grad_accum: int = 1
    """Micro-batches per rank and optimizer step."""
    epochs: float | None = None
    """Passes over the training split (default 1, or as many as --max-steps needs)."""
    max_steps: int | None = None
    """Stop after this many optimizer steps."""
    seed: int = 0
    device: str = "auto"
    """auto (cuda when available), cpu, cuda, cuda:N."""
    precision: str = "auto"
    """auto (bf16 autocast on GPU, fp32 on CPU), bf16 or fp32."""
    eval_split: float = 0.05
    """Held-out samples: a share when < 1, else a count; chosen by sample-id hash; 0: none."""
    eval_every: int = 500
    """Evaluate the held-out split every N steps (and at the end); 0: only at the end."""
    eval_k: int = 3
    """Draft chain length for the predicted acceptance length."""
    checkpoint_every: int = 1000
    """Write a resumable checkpoint every N steps (and at the end)."""
    checkpoint_interval: float = 30.0
    """Also write one when N minutes have passed since the last (0: off)."""
    fsdp: bool = False
    """Shard the drafter, its gradients and optimizer state over the ranks (FSDP2) instead
    of a whole copy per rank (DDP)."""
    keep: int = 2
    """How many checkpoints to keep."""
    trust_remote_code: bool | None = None
    """Run code the target directory ships (auto_map); None: as the datasets' makers were
    told (gen and extract record --trust-remote-code), else no."""
    write: WriteOptions = field(default_factory=WriteOptions)
    """--resume/--overwrite/--force: whether a run continues (auto), must (resume) or starts
    afresh, and whether one started with other settings may (force)."""
    output: OutputOptions = field(default_factory=OutputOptions)

    @classmethod
    def from_paths(cls, paths: list[str], **options: Any) -> TrainConfig:
        """DATA[:WEIGHT]... RUN as the command line gives them: the run directory last."""
        if len(paths) < 2:
            raise UserError("give the datasets, then the run directory last")
        *data, out = paths
        return cls([DataSpec.parse(d) for d in data], Path(out), options.pop("target", None),
                   **options)

    def __post_init__(self) -> None:
        self.data = [DataSpec.parse(d) for d in self.data]
        self.out = Path(self.out)
        self.target = None if self.target is None else Path(self.target)
        if self.init_from is not None:
            self.init_from = Path(self.init_from)
        if not self.data:
            raise UserError("give at least one dataset, then the run directory last")
        # Every problem of the command line at once (torchtune's config validation).
        found: list[str] = []
        self._check_ranges(found)
        self._check_choices(found)
        self._check_servers(found)
        self._check_paths(found)
        if found:
            raise UserError("; ".join(found))

    def _check_ranges(self, found: list[str]) -> None:
        positive: dict[str, float] = {
                    "--draft-vocab": self.draft_vocab, "--ttt-steps": self.ttt_steps,
                    "--batch-tokens": self.batch_tokens,
                    "--grad-accum": self.grad_accum, "--eval-k": self.eval_k,
                    "--checkpoint-every": self.checkpoint_every, "--keep": self.keep}
        for flag, value in positive.items():
            if not value >= 1:
                found.append(f"{flag} must be >= 1 (got {value})")
        if self.max_len is not None and self.max_len < 3:
            found.append(f"--max-len must be >= 3 tokens (got {self.max_len})")
        for flag, value in (("--lr", self.lr), ("--ttt-decay", self.ttt_decay)):
            if not (value > 0 and math.isfinite(value)):
                found.append(f"{flag} must be > 0 (got {value})")
        for flag, value in (("--min-lr", self.min_lr), ("--warmup", self.warmup),
                            ("--weight-decay", self.weight_decay),
                            ("--grad-clip", self.grad_clip), ("--eval-split", self.eval_split),
                            ("--checkpoint-interval", self.checkpoint_interval),
                            ("--eval-every", self.eval_every)):
            if not (value >= 0 and math.isfinite(value)):
                found.append(f"{flag} must be >= 0 (got {value})")
        if self.min_lr > self.lr:
            found.append(f"--min-lr ({self.min_lr}) must not exceed --lr ({self.lr})")
        if self.eval_split >= 1 and not float(self.eval_split).is_integer():
            found.append(f"--eval-split is a share below 1 or a whole count "
                         f"(got {self.eval_split})")
        if self.epochs is not None and not (self.epochs > 0 and math.isfinite(self.epochs)):
            found.append(f"--epochs must be > 0 (got {self.epochs})")
        if self.max_steps is not None and self.max_steps < 1:
            found.append(f"--max-steps must be >= 1 (got {self.max_steps})")

    def _check_variant(self, found: list[str]) -> None:
        from eagle3kit.model.config import VARIANTS

        if self.variant is not None and self.variant not in VARIANTS:
            found.append(f"--variant must be one of {', '.join(VARIANTS)} (got {self.variant})")
            return
        if self.num_hidden_layers is not None and not self.num_hidden_layers >= 1:
            found.append(f"--num-hidden-layers must be >= 1 (got {self.num_hidden_layers})")
        fields = self.drafter_variant()
        if fields["norm_before_fc"] and fields["fc_norm"]:
            found.append("--fc-norm and --norm-before-fc exclude each other (both normalise "
                         "the aux states before fc)"
                         + (f"; --variant {self.variant} has norm_before_fc"
                            if self.variant and VARIANTS[self.variant]["norm_before_fc"]
                            else "")
                         + (f"; --variant {self.variant} has fc_norm"
                            if self.variant and VARIANTS[self.variant]["fc_norm"] else ""))

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
            getattr(self, name) is not None for name in VARIANTS["eagle3"])

    def _check_choices(self, found: list[str]) -> None:
        self._check_variant(found)
        if self.long_samples not in LONG_POLICIES:
            found.append(f"--long-samples must be drop or truncate (got {self.long_samples})")
        for flag, value, allowed in (("--schedule", self.schedule, SCHEDULES),
                                     ("--lm-head", self.lm_head, LM_HEADS),
                                     ("--data-order", self.data_order, DATA_ORDERS)):
            if value not in allowed:
                found.append(f"{flag} must be one of {', '.join(allowed)} (got {value})")
        if self.precision not in PRECISIONS:
            found.append(f"--precision must be one of {', '.join(PRECISIONS)} "
                         f"(got {self.precision})")
        try:
            self.layers = parse_layer_ids(self.layers)
            if self.layers is not None:
                check_layer_ids(self.layers, count=3)
        except UserError as exc:
            found.append(str(exc))
        if self.layers is not None and not self.online:
            found.append("--layers applies to --online training; offline, the layer ids are "
                         "those the hidden-state dataset was extracted at")
        if not self.device or not (self.device in ("auto", "cpu")
                                   or self.device.startswith("cuda")):
            found.append(f"--device must be auto, cpu, cuda or cuda:N (got {self.device})")

    def _check_servers(self, found: list[str]) -> None:
        from eagle3kit.gen.config import parse_server

        for flag, value in (("--concurrency", self.concurrency), ("--prefetch", self.prefetch)):
            if value is not None and not value >= 1:
                found.append(f"{flag} must be >= 1 (got {value})")
        if not (self.request_timeout > 0 and math.isfinite(self.request_timeout)):
            found.append(f"--request-timeout must be > 0 seconds (got {self.request_timeout})")
        if not self.servers:
            return
        if not self.online:
            found.append("--server applies to --online training (the states come from the "
                         "servers instead of the target in this process): add --online")
        try:
            specs = [parse_server(s) for s in self.servers]
        except UserError as exc:
            found.append(str(exc))
            return
        if len({s.url for s in specs}) < len(specs):
            found.append("--server: the same server is given twice")
        self.servers = [f"{s.url}@{s.concurrency or self.concurrency}" for s in specs]

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

    def _check_paths(self, found: list[str]) -> None:
        # Here, not in the stage: a mistyped path is refused in a second, before torch loads.
        found += [f"{d.path}: no such dataset directory" for d in self.data
                  if not d.path.is_dir()]
        if self.target is None:
            found.append("--target is required: the target model directory")
        elif not self.target.is_dir():
            found.append(f"--target {self.target}: no such directory")
        elif not (self.target / "config.json").is_file():
            found.append(f"--target {self.target}: no config.json there (an HF model directory?)")
        if self.init_from is not None and not self.init_from.is_dir():
            found.append(f"--init-from {self.init_from}: no such directory")

    @property
    def eval_count(self) -> int | None:
        """The held-out count when --eval-split is a count, else None."""
        return int(self.eval_split) if self.eval_split >= 1 else None

    def settings(self) -> dict[str, Any]:
        """The trajectory-deciding options, as JSON (what run.json records and resume checks).
        The drafter's layout is among them when it is not the plain EAGLE-3 one (so runs of
        the default layout record what they always did)."""
        from eagle3kit.model.config import VARIANTS

        raw = asdict(self)
        out: dict[str, Any] = {}
        for name in SETTINGS:
            value = raw[name]
            if name == "data":
                value = [d.to_json() for d in self.data]
            elif isinstance(value, Path):
                value = str(value.resolve())
            out[name] = value
        if self.drafter_variant() != VARIANTS["eagle3"]:
            out["variant"] = self.drafter_variant()
        return out


@dataclass
class TrainResult:
    out: Path
    steps: int
    """Optimizer steps done in total (earlier runs included)."""
    total_steps: int
    tokens: int
    """Training tokens seen in total."""
    loss: float | None
    eval: dict | None
    """The last held-out evaluation (EvalResult.to_dict()), None without a held-out split."""
    initial_eval: dict | None
    """The evaluation of the drafter before training (None when resumed or no split)."""
    vocab_coverage: float | None
    resumed_from: int | None = None
    metrics: dict = field(default_factory=dict)
    stopped: str | None = None
    """The signal that stopped the run before its last step (SIGTERM, SIGINT, SIGUSR1)."""
    exit_code: int = 0
    """0, or 143 / 130 when a signal stopped the run."""
    resume_command: str | None = None
    """The command that continues a stopped run."""

    def to_dict(self) -> dict:
        d = asdict(self)
        d["out"] = str(self.out)
        return d

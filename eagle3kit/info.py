"""`eagle3kit info`: what a dataset holds, where it came from, and what is wrong with it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from eagle3kit import _ui
from eagle3kit._options import arg, opt
from eagle3kit.errors import CheckFailed, UserError
from eagle3kit.format import Dataset

if TYPE_CHECKING:
    from eagle3kit.checkpoints.rundir import RunDir


@dataclass
class InfoConfig:
    path: Path = field(metadata=arg())
    """A dataset, run or checkpoint directory."""
    verify: bool = field(default=True, metadata=opt("--no-verify", negate=True))
    """Skip reading every shard against its checksums (by default all the data is read
    once)."""
    target: Path | None = None
    """Checkpoints: the target model directory to check the checkpoint against."""
    plot: Path | None = field(default=None, metadata=opt(metavar="FILE.png"))
    """Runs: draw the loss, the accuracy per TTT step and the held-out predicted acceptance
    length against steps from the run's metrics.jsonl (plot extra)."""
    output: _ui.OutputOptions = field(default_factory=_ui.OutputOptions)

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        self.target = None if self.target is None else Path(self.target)
        if self.plot is not None:
            from eagle3kit._plot import check_plotting

            self.plot = Path(self.plot)
            check_plotting(self.plot)


@dataclass
class InfoReport:
    path: str
    kind: str
    format_version: int
    written_by: str
    samples: int
    tokens: int
    loss_tokens: int
    completion_tokens: int
    shards: int
    bytes_on_disk: int
    bytes_per_token: float
    partitions: dict[str, dict]
    finish_reasons: dict[str, int]
    created: float
    updated: float
    config: dict
    provenance: dict
    runs: list[dict]
    problems: list[str]
    warnings: list[str]

    @property
    def exit_code(self) -> int:
        """1 when the dataset has problems: `eagle3kit info`'s exit status."""
        return 1 if self.problems else 0

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _sum_finish(partitions: dict[str, dict]) -> dict[str, int]:
    total: dict[str, int] = {}
    for stats in partitions.values():
        for reason, n in stats["finish"].items():
            total[reason] = total.get(reason, 0) + n
    return dict(sorted(total.items(), key=lambda kv: -kv[1]))


def describe(cfg: InfoConfig) -> InfoReport:
    ds = Dataset(cfg.path, kind=None, verify_shards=False, warn_stray=False)
    partitions = ds.partition_stats()
    manifest = ds.manifest
    problems = ds.verify() + ds.duplicate_ids() if cfg.verify else ds.check_files()
    temps, orphans = ds.stray_files()
    warnings = [ds.marker_warning()] if ds.marker_missing else []
    warnings += [
        f"{p}: temp file left by an interrupted run (ignored; the next writer removes it)"
        for p in temps
    ]
    warnings += [
        f"{p}: shard sealed but never committed (ignored; the next writer removes it)"
        for p in orphans
    ]
    size = ds.shard_bytes
    return InfoReport(
        path=str(cfg.path),
        kind=ds.kind,
        format_version=ds.version,
        written_by=manifest.get("written_by", "?"),
        samples=len(ds),
        tokens=ds.num_tokens,
        loss_tokens=sum(p["loss_tokens"] for p in partitions.values()),
        completion_tokens=sum(p["completion_tokens"] for p in partitions.values()),
        shards=len(ds.shards),
        bytes_on_disk=size,
        bytes_per_token=round(size / ds.num_tokens, 3) if ds.num_tokens else 0.0,
        partitions=partitions,
        finish_reasons=_sum_finish(partitions),
        created=manifest.get("created", 0.0),
        updated=manifest.get("updated", 0.0),
        config=manifest.get("config", {}),
        provenance=manifest.get("provenance", {}),
        runs=manifest.get("runs", []),
        problems=problems,
        warnings=warnings,
    )


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "?"


def _show(report: InfoReport, opts: _ui.OutputOptions) -> None:
    _ui.kv(
        f"{report.path}",
        [
            (
                "kind",
                f"{report.kind} dataset, format version {report.format_version} "
                f"(written by eagle3kit {report.written_by})",
            ),
            ("samples", f"{report.samples:,} in {report.shards:,} shards"),
            (
                "tokens",
                f"{report.tokens:,} ({report.completion_tokens:,} completion, "
                f"{report.loss_tokens:,} with loss)",
            ),
            (
                "finish reasons",
                ", ".join(f"{k} {v:,}" for k, v in report.finish_reasons.items()) or "none",
            ),
            (
                "size on disk",
                f"{report.bytes_on_disk:,} bytes ({report.bytes_per_token} per token)",
            ),
            ("created", _when(report.created)),
            ("updated", _when(report.updated)),
            (
                "runs",
                f"{len(report.runs)}"
                + (f", last by {report.runs[-1].get('command', '?')}" if report.runs else ""),
            ),
            (
                "settings",
                ", ".join(f"{k}={v}" for k, v in report.config.items()) or "none recorded",
            ),
            (
                "provenance",
                ", ".join(f"{k}={v}" for k, v in report.provenance.items()) or "none recorded",
            ),
        ],
        opts,
    )
    rows = [
        [
            name,
            p["samples"],
            p["tokens"],
            round(p["completion_tokens"] / p["samples"], 1) if p["samples"] else 0,
            ", ".join(f"{k} {v}" for k, v in sorted(p["finish"].items())),
        ]
        for name, p in report.partitions.items()
    ]
    if rows:
        _ui.table(
            "partitions",
            ["partition", "samples", "tokens", "mean completion", "finish"],
            rows,
            opts,
        )
    for w in report.warnings:
        _ui.warn(w)
    found = f"{len(report.problems)} problems found" if report.problems else "no problems found"
    _ui.checklist([(not report.problems, "checks", found)], opts)
    for p in report.problems:
        _ui.error(p)


def run(cfg: InfoConfig) -> InfoReport | CheckpointReport:
    curves = None if cfg.plot is None else plot_run(cfg.path, cfg.plot, cfg.output)
    if checkpoint_dirs(cfg.path):
        return run_checkpoint(cfg, curves)
    if cfg.target is not None:
        raise UserError(f"--target: {cfg.path} is a dataset; --target applies to checkpoints")
    report = describe(cfg)
    if cfg.output.json:
        _ui.print_json(report.to_dict())
    else:
        _show(report, cfg.output)
    return report


# Checkpoints: a run, an export, or any EAGLE-3 checkpoint (CHECKPOINTS.md) ------------------
@dataclass
class CheckpointReport:
    path: str
    checkpoints: list[dict]
    """One CheckpointInfo.to_dict() per checkpoint (an export with both formats has two)."""
    problems: list[str]
    warnings: list[str]
    kind: str = "checkpoint"
    plot: dict | None = None
    """With --plot: the file and, per axis, its title and the points of each series."""
    selection: dict | None = None
    """A run: which step its drafter/ holds and why (run.json's `selection`)."""

    def to_dict(self) -> dict:
        out = dict(self.__dict__)
        for optional in ("plot", "selection"):
            if out[optional] is None:
                del out[optional]
        return out


def checkpoint_dirs(path: Path) -> list[Path]:
    """The checkpoints `path` holds: itself, a run's drafter/, or an export's vllm/, sglang/."""
    from eagle3kit.checkpoints.rundir import RunDir
    from eagle3kit.format import has_dataset_files

    if has_dataset_files(path):
        return []  # a dataset
    if (path / "config.json").is_file():
        return [path]
    if RunDir(path).exists():
        return [RunDir(path).drafter]
    return [path / sub for sub in ("vllm", "sglang") if (path / sub / "config.json").is_file()]


def run_checkpoint(cfg: InfoConfig, curves: dict | None = None) -> CheckpointReport:
    from eagle3kit.checkpoints.detect import inspect

    dirs = checkpoint_dirs(cfg.path)
    if not (dirs[0] / "config.json").is_file():
        raise UserError(f"{dirs[0]}: the run has no drafter yet (train writes it there)")
    infos = [inspect(d, cfg.target) for d in dirs]
    several = len(infos) > 1

    def tagged(info, text: str) -> str:
        return f"{info.path}: {text}" if several else text

    cards = [_card_and_warnings(d, i) for d, i in zip(dirs, infos, strict=True)]
    report = CheckpointReport(
        path=str(cfg.path),
        checkpoints=[{**i.to_dict(), "card": card} for i, card in zip(infos, cards, strict=True)],
        problems=[tagged(i, p) for i in infos for p in i.problems],
        warnings=[tagged(i, w) for i in infos for w in i.warnings],
        plot=curves,
        selection=_selection(cfg.path),
    )
    if cfg.output.json:
        _ui.print_json(report.to_dict())
    else:
        for d, info, card in zip(dirs, infos, cards, strict=True):
            _show_checkpoint(info, cfg.output)
            _show_card(d, card, cfg.output)
        if report.selection:
            _show_selection(dirs[0], report.selection, cfg.output)
        for w in report.warnings:
            _ui.warn(w)
        found = f"{len(report.problems)} problems found" if report.problems else "no problems found"
        _ui.checklist([(not report.problems, "checks", found)], cfg.output)
        for p in report.problems:
            _ui.error(p)
    if report.problems:
        raise CheckFailed(
            f"{cfg.path}: {len(report.problems)} checkpoint problem"
            f"{'s' if len(report.problems) > 1 else ''} (CHECKPOINTS.md §5)"
        )
    return report


def _selection(path: Path) -> dict | None:
    """A run's record of which step its drafter/ holds (None: not a run, or a run written
    before train chose the step)."""
    from eagle3kit.checkpoints.rundir import RunDir

    run = RunDir(path)
    chosen = (run.record() or {}).get("selection") if run.exists() else None
    return chosen if isinstance(chosen, dict) else None


def _show_selection(drafter: Path, chosen: dict, opts: _ui.OutputOptions) -> None:
    def figure(which: str) -> str:
        f = chosen.get(which)
        if not isinstance(f, dict):
            return "none"
        return f"step {f.get('step')}, held-out AL {f.get('predicted_acceptance_length')}"

    _ui.kv(
        f"{drafter}: the step it holds",
        [
            ("step", f"{chosen.get('step')} (--drafter-step {chosen.get('rule')})"),
            ("why", chosen.get("why", "?")),
            ("best evaluation", figure("best")),
            ("last evaluation", figure("last")),
        ],
        opts,
    )


def _show_checkpoint(info, opts: _ui.OutputOptions) -> None:
    from eagle3kit.model.config import describe_variant

    ids = (
        f"{info.aux_layer_ids} boundary / {info.aux_layer_ids_output} layer-output"
        if info.aux_layer_ids
        else "none"
    )
    vocab = "?"
    if info.draft_vocab_size:
        vocab = f"{info.draft_vocab_size:,} of {info.vocab_size or 0:,} target ids"
        if info.coverage is not None:
            vocab += f", covering {info.coverage:.1%} of the training tokens"
    size = f"{info.hidden_size}" + (
        f" (target {info.target_hidden_size})" if info.target_hidden_size else ""
    )
    _ui.kv(
        info.path,
        [
            ("layout", info.description),
            ("aux layer ids", f"{ids} (from {info.layer_ids_source})"),
            ("aux states", info.num_aux),
            ("draft vocab", vocab),
            ("hidden size", size),
            ("norm_before_residual", info.norm_before_residual),
            ("variant", describe_variant(info.variant)),
            ("max positions", info.max_position_embeddings),
            (
                "attention",
                f"sliding window of {info.sliding_window:,} positions"
                if info.sliding_window
                else "every earlier position",
            ),
            ("verifier", info.verifier),
            (
                "embedding",
                "included" if info.has_embedding else "none (the engine uses the target's)",
            ),
            (
                "weights",
                f"{', '.join(info.weights_files)}: {len(info.tensors)} tensors, {info.dtype}",
            ),
        ],
        opts,
    )


# A run's curves (--plot) --------------------------------------------------------------------
def read_curves(run_dir: RunDir) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """metrics.jsonl as series of (step, value) per axis title: the training loss, the
    accuracy of each TTT step, and the held-out predicted acceptance length. Only lines in
    the form train writes are drawn (RunDir.metric_records): a line cut short by a kill, or
    one eagle3kit did not write, is passed over."""
    loss: list[tuple[int, float]] = []
    acc: dict[str, list[tuple[int, float]]] = {}
    accept: list[tuple[int, float]] = []
    for _, record in run_dir.metric_records():
        step = record["step"]
        if "loss" in record:
            loss.append((step, float(record["loss"])))
        for k, value in enumerate(record.get("acc_k") or []):
            acc.setdefault(f"step {k + 1}", []).append((step, float(value)))
        evaluation = record.get("eval")
        if evaluation and evaluation.get("predicted_acceptance_length") is not None:
            accept.append((step, float(evaluation["predicted_acceptance_length"])))
    return {
        "loss": {"loss": loss},
        "accuracy per TTT step": acc,
        "predicted acceptance length (held out)": {"overall": accept},
    }


def plot_run(path: Path, plot: Path, opts: _ui.OutputOptions) -> dict:
    """Draw the run's curves into `plot`; what was drawn (to_dict's `plot`)."""
    from eagle3kit.checkpoints.rundir import RunDir

    run_dir = RunDir(path)
    if not run_dir.exists():
        raise UserError(
            f"--plot: {path} is not a training run (--plot draws a run's metrics.jsonl)"
        )
    curves = read_curves(run_dir)
    if not any(points for series in curves.values() for points in series.values()):
        raise UserError(f"--plot: {run_dir.metrics} holds no logged steps yet")
    _draw(curves, f"{path.resolve().name}", plot)
    _ui.info(f"figure: {plot}", opts)
    return {
        "file": str(plot),
        "axes": [
            {"title": title, "series": {name: len(points) for name, points in series.items()}}
            for title, series in curves.items()
        ],
    }


def _draw(curves: dict[str, dict[str, list[tuple[int, float]]]], title: str, path: Path) -> None:
    from eagle3kit._plot import pyplot

    plt = pyplot()
    fig, axes = plt.subplots(1, len(curves), figsize=(15, 4))
    for ax, (name, series) in zip(axes, curves.items(), strict=True):
        for label, points in series.items():
            ax.plot([s for s, _ in points], [v for _, v in points], marker=".", label=label)
        ax.set(xlabel="step", title=name)
        if len(series) > 1:
            ax.legend(fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# An export's model card, and what the layout's own library makes of the checkpoint ---------
def _card_and_warnings(directory: Path, info) -> dict | None:
    """The card export wrote beside the checkpoint (None: none), and, into info.warnings,
    what the layout's own library would load differently (speculators: no embedding). The
    held-out prediction shown is the checkpoint's own record, checked, never the card's
    text."""
    from eagle3kit.checkpoints.card import prediction_line, read_card
    from eagle3kit.checkpoints.provenance import training_prediction
    from eagle3kit.checkpoints.speculators import embedding_warning

    warning = embedding_warning(info)
    if warning:
        info.warnings.append(warning)
    card = read_card(directory)
    if card is not None:
        card["held-out prediction"] = prediction_line(training_prediction(directory))
    return card


def _show_card(directory: Path, card: dict | None, opts: _ui.OutputOptions) -> None:
    if card is None:
        return
    from eagle3kit.checkpoints.card import CARD

    _ui.kv(
        str(directory / CARD),
        [
            ("base_model", card.get("base_model", "?")),
            ("library_name", card.get("library_name", "?")),
            ("tags", ", ".join(card.get("tags", []))),
            ("draft vocab", card.get("draft vocab", "?")),
            ("training data", "; ".join(card.get("training data", [])) or "?"),
            ("held-out prediction", card.get("held-out prediction", "?")),
        ],
        opts,
    )

"""The `eagle3kit` command: a map from each command to its stage's config and `run`.

Nothing else happens here. Each option is declared once, on its config field (its flag,
metavar and panel in the field's metadata, its help the field's docstring, its default the
field's default); `eagle3kit/_command.py` builds the command line from the configs when a
command is first used, so `--help` is instant and loads no torch."""

from __future__ import annotations

from typing import Annotated

import typer

from eagle3kit import __version__
from eagle3kit._command import Group, Stage, interrupted, stages_group

STAGES: dict[str, Stage | Group] = {
    "info": Stage(
        "eagle3kit.info:InfoConfig",
        "eagle3kit.info:run",
        "Datasets",
        "Describe a dataset or checkpoint and list its problems (exit 1 when there are any).",
    ),
    "convert": Stage(
        "eagle3kit.convert:ConvertConfig",
        "eagle3kit.convert:run",
        "Datasets",
        "A dataset to JSONL, or JSONL to a dataset (resumable), one sample per line.",
    ),
    "validate": Stage(
        "eagle3kit.validate:ValidateConfig",
        "eagle3kit.validate:run",
        "Datasets",
        "Check a token dataset before training (exit 1 when a check fails).",
    ),
    "gen": Stage(
        "eagle3kit.gen.config:GenConfig",
        "eagle3kit.gen:run",
        "Stages",
        "Generate exact-token samples from SGLang or vLLM servers (or transformers).",
    ),
    "plan": Stage(
        "eagle3kit.plan:PlanConfig",
        "eagle3kit.plan:run",
        "Stages",
        "Forecast a gen run's hours, tokens and disk from a pilot that gen then skips.",
    ),
    "extract": Stage(
        "eagle3kit.extract.config:ExtractConfig",
        "eagle3kit.extract:run",
        "Stages",
        "Target hidden states for a token dataset (resumable; torchrun for several GPUs).",
    ),
    "train": Stage(
        "eagle3kit.train.config:TrainConfig",
        "eagle3kit.train:run",
        "Stages",
        "Train an EAGLE-3 drafter (resumable; torchrun for several processes).",
    ),
    "export": Stage(
        "eagle3kit.export.config:ExportConfig",
        "eagle3kit.export:run",
        "Stages",
        "Write a trained drafter as the checkpoints vLLM and SGLang load.",
    ),
    "bench": Group(
        "Stages",
        "Acceptance length: offline against the target, or on a live server.",
        {
            "accept": Stage(
                "eagle3kit.bench.accept:AcceptConfig",
                "eagle3kit.bench.accept:run",
                None,
                "Speculative decoding with the target in-process: acceptance length, losslessness.",
            ),
            "server": Stage(
                "eagle3kit.bench.server:ServerBenchConfig",
                "eagle3kit.bench.server:run",
                None,
                "Acceptance length, throughput and latency of a live speculating server.",
            ),
            "parity": Stage(
                "eagle3kit.bench.parity:ParityConfig",
                "eagle3kit.bench.parity:run",
                None,
                "The serving-parity gate: the server's acceptance against bench accept's, and why.",
            ),
        },
    ),
    "quickstart": Stage(
        "eagle3kit.quickstart:QuickstartConfig",
        "eagle3kit.quickstart:run",
        "Start here",
        "The whole pipeline on a tiny target, on CPU, offline, in minutes (rerun continues).",
    ),
}
"""Each command: its config class (whose fields are its options), its run, its help panel."""

app = typer.Typer(
    name="eagle3kit",
    cls=stages_group(STAGES),
    help="Exact training data, crash-safe datasets and acceptance forecasts for EAGLE-3 drafters.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"eagle3kit {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Exact training data, crash-safe datasets and acceptance forecasts for EAGLE-3 drafters."""


def main() -> None:
    try:
        app()
    except KeyboardInterrupt as exc:
        raise SystemExit(interrupted(exc)) from None

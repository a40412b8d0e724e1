"""The `eagle3kit` command: parse options, build a stage's config, call its `run`.

Nothing else happens here. Stages import torch and transformers themselves, so `--help` is
instant; defaults live in the config dataclasses, so options default to None here and only
the ones given are passed on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from eagle3kit import __version__
from eagle3kit.errors import UserError

app = typer.Typer(
    name="eagle3kit",
    help="Exact training data, crash-safe datasets and acceptance forecasts for EAGLE-3 drafters.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

# The shared output flags, the same on every subcommand (DESIGN.md, command-line conventions).
Json = Annotated[bool, typer.Option("--json", envvar="EAGLE3KIT_JSON",
                                    help="Print the result as JSON on stdout.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", envvar="EAGLE3KIT_QUIET",
                                     help="Only warnings and errors on stderr.")]
NoProgress = Annotated[bool, typer.Option("--no-progress", envvar="EAGLE3KIT_NO_PROGRESS",
                                          help="No live display; plain status lines only.")]
LogEvery = Annotated[float | None, typer.Option(
    "--log-every", envvar="EAGLE3KIT_LOG_EVERY", metavar="SECONDS",
    help="Seconds between status lines when stderr is not a terminal [default: 30].")]
Resume = Annotated[bool, typer.Option(
    "--resume", help="Continue the output; fail if there is none.")]
Overwrite = Annotated[bool, typer.Option("--overwrite", help="Start the output afresh.")]
Force = Annotated[bool, typer.Option(
    "--force", help="Accept settings that differ from those the output was started with.")]
CommitEvery = Annotated[int | None, typer.Option(
    "--commit-every", metavar="N", help="Commit after N samples [default: 1000].")]
CommitInterval = Annotated[float | None, typer.Option(
    "--commit-interval", metavar="SECONDS", help="...or after S seconds [default: 60].")]


def _given(**options: Any) -> dict[str, Any]:
    return {k: v for k, v in options.items() if v is not None}


def _output(json: bool, quiet: bool, no_progress: bool, log_every: float | None):
    from eagle3kit._ui import OutputOptions

    return OutputOptions(json=json, quiet=quiet, no_progress=no_progress,
                         **_given(log_every=log_every))


def _open_mode(resume: bool, overwrite: bool) -> str:
    if resume and overwrite:
        raise UserError("--resume and --overwrite exclude each other")
    return "resume" if resume else "overwrite" if overwrite else "auto"


def _fail(exc: UserError) -> NoReturn:
    from eagle3kit import _ui

    _ui.error(str(exc))
    raise typer.Exit(exc.exit_code)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"eagle3kit {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """Exact training data, crash-safe datasets and acceptance forecasts for EAGLE-3 drafters."""


@app.command()
def info(
    path: Annotated[Path, typer.Argument(help="A dataset directory.")],
    no_verify: Annotated[bool, typer.Option(
        "--no-verify", help="Skip reading every shard against its checksums.")] = False,
    json: Json = False, quiet: Quiet = False, no_progress: NoProgress = False,
    log_every: LogEvery = None,
) -> None:
    """Describe a dataset and list its problems (exit 1 when there are any)."""
    from eagle3kit import info as stage

    try:
        report = stage.run(stage.InfoConfig(
            path, verify=not no_verify, output=_output(json, quiet, no_progress, log_every)))
    except UserError as exc:
        _fail(exc)
    raise typer.Exit(1 if report.problems else 0)


@app.command()
def convert(
    src: Annotated[Path, typer.Argument(help="A dataset directory, or a JSONL file to import.")],
    dst: Annotated[Path, typer.Argument(help="The JSONL file ('-': stdout) or dataset to write.")],
    tokenizer: Annotated[Path | None, typer.Option(
        help="Export: add decoded prompt_text and completion_text.")] = None,
    partition: Annotated[str | None, typer.Option(help="Export: only this partition.")] = None,
    skip_bad_lines: Annotated[bool, typer.Option(
        "--skip-bad-lines", help="Import: skip and count malformed lines.")] = False,
    commit_every: CommitEvery = None, commit_interval: CommitInterval = None,
    resume: Resume = False, overwrite: Overwrite = False, force: Force = False,
    json: Json = False, quiet: Quiet = False, no_progress: NoProgress = False,
    log_every: LogEvery = None,
) -> None:
    """A dataset to JSONL, or JSONL to a dataset (resumable), one sample per line."""
    from eagle3kit import convert as stage

    try:
        stage.run(stage.ConvertConfig(
            src, dst, tokenizer=tokenizer, partition=partition, skip_bad_lines=skip_bad_lines,
            mode=_open_mode(resume, overwrite), force=force,
            output=_output(json, quiet, no_progress, log_every),
            **_given(commit_every=commit_every, commit_interval=commit_interval),
        ))
    except UserError as exc:
        _fail(exc)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        from eagle3kit import _ui

        _ui.error("interrupted; what was committed is safe: rerun the same command to continue")
        raise SystemExit(130) from None

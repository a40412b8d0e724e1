"""The `eagle3kit` command: parse options, build a stage's config, call its `run`.

Nothing else happens here. Stages import torch and transformers themselves, so `--help` is
instant; defaults live in the config dataclasses, so options default to None here and only
the ones given are passed on.
"""

from __future__ import annotations

from collections.abc import Callable
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
    help="Seconds between status lines when stderr is not a terminal (default 30).")]
Resume = Annotated[bool, typer.Option(
    "--resume", help="Continue the output; fail if there is none.")]
Overwrite = Annotated[bool, typer.Option("--overwrite", help="Start the output afresh.")]
Force = Annotated[bool, typer.Option(
    "--force", help="Accept settings that differ from those the output was started with.")]
CommitEvery = Annotated[int | None, typer.Option(
    "--commit-every", metavar="N", help="Commit after N samples (default 1000).")]
CommitInterval = Annotated[float | None, typer.Option(
    "--commit-interval", metavar="SECONDS", help="...or after S seconds (default 60).")]


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


def _json_object(text: str | None, flag: str) -> dict:
    import json

    if text is None:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise UserError(f"{flag}: not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise UserError(f"{flag}: expected a JSON object like '{{\"enable_thinking\": false}}'")
    return value


def _fail(exc: UserError) -> NoReturn:
    from eagle3kit import _ui

    _ui.error(str(exc))
    raise typer.Exit(exc.exit_code)


def _run(run: Callable[[Any], Any], make_config: Callable[[], Any]) -> Any:
    """Build the config and run the stage; user errors and Ctrl-C end in one line."""
    try:
        return run(make_config())
    except UserError as exc:
        _fail(exc)
    except KeyboardInterrupt:
        from eagle3kit import _ui

        _ui.error("interrupted; what was committed is safe: rerun the same command to continue")
        raise typer.Exit(130) from None


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


@app.command(rich_help_panel="Datasets")
def info(
    path: Annotated[Path, typer.Argument(help="A dataset directory.")],
    no_verify: Annotated[bool, typer.Option(
        "--no-verify", help="Skip reading every shard against its checksums.")] = False,
    json: Json = False, quiet: Quiet = False, no_progress: NoProgress = False,
    log_every: LogEvery = None,
) -> None:
    """Describe a dataset and list its problems (exit 1 when there are any)."""
    from eagle3kit import info as stage

    report = _run(stage.run, lambda: stage.InfoConfig(
        path, verify=not no_verify, output=_output(json, quiet, no_progress, log_every)))
    raise typer.Exit(1 if report.problems else 0)


@app.command(rich_help_panel="Datasets")
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

    _run(stage.run, lambda: stage.ConvertConfig(
        src, dst, tokenizer=tokenizer, partition=partition, skip_bad_lines=skip_bad_lines,
        mode=_open_mode(resume, overwrite), force=force,
        output=_output(json, quiet, no_progress, log_every),
        **_given(commit_every=commit_every, commit_interval=commit_interval),
    ))


@app.command(rich_help_panel="Datasets")
def validate(
    path: Annotated[Path, typer.Argument(help="A token dataset directory.")],
    tokenizer: Annotated[Path | None, typer.Option(
        help="Override the tokenizer stored in the dataset.")] = None,
    chat_template: Annotated[Path | None, typer.Option(
        help="Override the stored chat template (a Jinja file).")] = None,
    think_start: Annotated[str | None, typer.Option(
        metavar="TOKEN", help="Reasoning start token (with --think-end).")] = None,
    think_end: Annotated[str | None, typer.Option(metavar="TOKEN")] = None,
    max_truncation: Annotated[float | None, typer.Option(
        metavar="SHARE", help="Largest share finished by length (default 0.05).")] = None,
    min_reasoning: Annotated[float | None, typer.Option(
        metavar="SHARE", help="Smallest share with reasoning (default 0.5).")] = None,
    only: Annotated[str | None, typer.Option(metavar="A,B", help="Run only these checks.")] = None,
    skip: Annotated[str | None, typer.Option(metavar="A,B", help="Leave out these checks.")] = None,
    write_clean: Annotated[Path | None, typer.Option(
        metavar="OUT", help="Write a new dataset without the flagged samples.")] = None,
    json: Json = False, quiet: Quiet = False, no_progress: NoProgress = False,
    log_every: LogEvery = None,
) -> None:
    """Check a token dataset before training (exit 1 when a check fails)."""
    from eagle3kit import validate as stage

    def names(text: str | None) -> list[str] | None:
        return None if text is None else [n.strip() for n in text.split(",") if n.strip()]

    report = _run(stage.run, lambda: stage.ValidateConfig(
        path, tokenizer=tokenizer, chat_template=chat_template, think_start=think_start,
        think_end=think_end, only=names(only), skip=names(skip), write_clean=write_clean,
        output=_output(json, quiet, no_progress, log_every),
        **_given(max_truncation=max_truncation, min_reasoning=min_reasoning)))
    raise typer.Exit(report.exit_code)


@app.command(rich_help_panel="Stages")
def gen(
    prompts: Annotated[list[Path], typer.Argument(
        help="Prompt files (JSONL, JSON, parquet), then the output dataset directory last.")],
    server: Annotated[list[str] | None, typer.Option(
        "--server", metavar="URL[@N]",
        help="An SGLang or vLLM server; repeat for several; @N sets its own concurrency.")] = None,
    api: Annotated[str | None, typer.Option(
        help="auto, sglang, vllm, or openai-chat (text fallback, marked reconstructed).")] = None,
    api_key: Annotated[str | None, typer.Option(
        envvar="EAGLE3KIT_API_KEY", help="Bearer token for the servers (never stored).",
        show_envvar=True)] = None,
    engine: Annotated[str | None, typer.Option(
        help="server (default) or hf: transformers in-process with --target.")] = None,
    target: Annotated[Path | None, typer.Option(
        help="The target model directory (for --engine hf).")] = None,
    tokenizer: Annotated[Path | None, typer.Option(
        help="The target's tokenizer directory.")] = None,
    trust_remote_code: Annotated[bool, typer.Option("--trust-remote-code")] = False,
    chat_template: Annotated[Path | None, typer.Option(help="A Jinja chat template file.")] = None,
    chat_template_kwargs: Annotated[str | None, typer.Option(
        metavar="JSON", help='Template variables, e.g. \'{"enable_thinking": false}\'.')] = None,
    system: Annotated[str | None, typer.Option(
        metavar="PROMPT", help="System prompt for conversations without one.")] = None,
    history: Annotated[str | None, typer.Option(
        help="Later turns see the model's own answers (own) or the dataset's (dataset).")] = None,
    dataset: Annotated[str | None, typer.Option(
        metavar="NAME_OR_PATH", help="Read prompts through HF datasets (the hf extra).")] = None,
    dataset_split: Annotated[str | None, typer.Option()] = None,
    format: Annotated[str | None, typer.Option(
        help="auto, messages, sharegpt, conversations, prompt, mtbench.")] = None,
    partition_field: Annotated[str | None, typer.Option(
        help="Record field naming the partition (default: the file name).")] = None,
    partition: Annotated[str | None, typer.Option(help="Only this partition, or all.")] = None,
    max_samples: Annotated[int | None, typer.Option(help="At most N conversations.")] = None,
    shuffle_seed: Annotated[int | None, typer.Option()] = None,
    skip_bad_lines: Annotated[bool, typer.Option("--skip-bad-lines")] = False,
    concurrency: Annotated[int | None, typer.Option(
        help="Requests in flight per server (default 64).")] = None,
    max_tokens: Annotated[int | None, typer.Option(help="(default 4096)")] = None,
    max_seq_len: Annotated[int | None, typer.Option(
        help="Prompt + completion cap (default the server's context length).")] = None,
    long_threshold: Annotated[int | None, typer.Option(
        help="Prompts with at least N tokens use the --long-* settings.")] = None,
    short_concurrency: Annotated[int | None, typer.Option()] = None,
    long_concurrency: Annotated[int | None, typer.Option()] = None,
    short_max_tokens: Annotated[int | None, typer.Option()] = None,
    long_max_tokens: Annotated[int | None, typer.Option()] = None,
    min_completion_tokens: Annotated[int | None, typer.Option(
        help="Shorter completions are recorded as filtered.")] = None,
    temperature: Annotated[float | None, typer.Option(help="(default 0.7)")] = None,
    top_p: Annotated[float | None, typer.Option(help="(default 1.0)")] = None,
    top_k: Annotated[int | None, typer.Option(help="(default -1, off)")] = None,
    min_p: Annotated[float | None, typer.Option(help="(default 0.0)")] = None,
    n: Annotated[int | None, typer.Option("--n", help="Samples per prompt (default 1).")] = None,
    sampling_seed: Annotated[int | None, typer.Option(
        help="Each sample's seed derives from it and the sample id.")] = None,
    request_timeout: Annotated[float | None, typer.Option(
        metavar="SECONDS", help="Limit on one generation (default none).")] = None,
    max_attempts: Annotated[int | None, typer.Option(help="(default 5)")] = None,
    no_tokenizer_check: Annotated[bool, typer.Option("--no-tokenizer-check")] = False,
    strict: Annotated[bool, typer.Option(
        "--strict", help="Stop at the first response that breaks an invariant.")] = False,
    grace: Annotated[float | None, typer.Option(
        metavar="SECONDS", help="Time in-flight requests get after Ctrl-C (default 30).")] = None,
    commit_every: CommitEvery = None, commit_interval: CommitInterval = None,
    resume: Resume = False, overwrite: Overwrite = False, force: Force = False,
    json: Json = False, quiet: Quiet = False, no_progress: NoProgress = False,
    log_every: LogEvery = None,
) -> None:
    """Generate exact-token samples from SGLang or vLLM servers (or transformers)."""
    from eagle3kit import gen as stage


    def config() -> stage.GenConfig:
        if len(prompts) < 2 and not (dataset and prompts):
            raise UserError("give the prompt files, then the output directory last")
        *inputs, output = prompts
        return stage.GenConfig(
            inputs, output, servers=[stage.parse_server(s) for s in server or []],
            chat_template_kwargs=_json_object(chat_template_kwargs, "--chat-template-kwargs"),
            trust_remote_code=trust_remote_code, skip_bad_lines=skip_bad_lines,
            tokenizer_check=not no_tokenizer_check, strict=strict,
            mode=_open_mode(resume, overwrite), force=force,
            output_options=_output(json, quiet, no_progress, log_every),
            **_given(api=api, api_key=api_key, engine=engine, target=target, tokenizer=tokenizer,
                     chat_template=chat_template, system=system, history=history,
                     dataset=dataset, dataset_split=dataset_split, format=format,
                     partition_field=partition_field, partition=partition,
                     max_samples=max_samples, shuffle_seed=shuffle_seed,
                     concurrency=concurrency, max_tokens=max_tokens, max_seq_len=max_seq_len,
                     long_threshold=long_threshold, short_concurrency=short_concurrency,
                     long_concurrency=long_concurrency, short_max_tokens=short_max_tokens,
                     long_max_tokens=long_max_tokens,
                     min_completion_tokens=min_completion_tokens, temperature=temperature,
                     top_p=top_p, top_k=top_k, min_p=min_p, n=n, sampling_seed=sampling_seed,
                     request_timeout=request_timeout, max_attempts=max_attempts, grace=grace,
                     commit_every=commit_every, commit_interval=commit_interval),
        )

    result = _run(stage.run, config)
    if result.stopped:  # a script must not go on to validate or train a partial dataset
        raise typer.Exit(130)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        from eagle3kit import _ui

        _ui.error("interrupted; what was committed is safe: rerun the same command to continue")
        raise SystemExit(130) from None

"""The `eagle3kit` command: parse options, build a stage's config, call its `run`.

Nothing else happens here. Stages import torch and transformers themselves, so `--help` is
instant; defaults live in the config dataclasses, so options default to None here and only
the ones given are passed on. `--help` shows each default from its config (eagle3kit._help):
no help string here restates one.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Any

import typer

from eagle3kit import __version__
from eagle3kit._command import Group, Stage, interrupted, stages_group
from eagle3kit._command import run_stage as _run
from eagle3kit._help import stage_command

STAGES: dict[str, Stage | Group] = {
    "validate": Stage("eagle3kit.validate:ValidateConfig", "eagle3kit.validate:run", "Datasets",
                      "Check a token dataset before training (exit 1 when a check fails)."),
    "extract": Stage("eagle3kit.extract.config:ExtractConfig", "eagle3kit.extract:run", "Stages",
                     "Target hidden states for a token dataset (resumable; torchrun for several "
                     "GPUs)."),
    "train": Stage("eagle3kit.train.config:TrainConfig", "eagle3kit.train:run", "Stages",
                   "Train an EAGLE-3 drafter (resumable; torchrun for several processes)."),
    "export": Stage("eagle3kit.export.config:ExportConfig", "eagle3kit.export:run", "Stages",
                    "Write a trained drafter as the checkpoints vLLM and SGLang load."),
    "bench": Group("Stages", "Acceptance length: offline against the target, or on a live "
                   "server.", {
        "accept": Stage(
            "eagle3kit.bench.accept:AcceptConfig", "eagle3kit.bench.accept:run", None,
            "Speculative decoding with the target in-process: acceptance length, losslessness."),
        "server": Stage(
            "eagle3kit.bench.server:ServerBenchConfig", "eagle3kit.bench.server:run", None,
            "Acceptance length, throughput and latency of a live speculating server."),
        "parity": Stage(
            "eagle3kit.bench.parity:ParityConfig", "eagle3kit.bench.parity:run", None,
            "The serving-parity gate: the server's acceptance against bench accept's, and why."),
    }),
}
"""Each command: its config class (whose fields are its options), its run, its help panel."""

app = typer.Typer(
    name="eagle3kit", cls=stages_group(STAGES),
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
    help="Seconds between status lines when stderr is not a terminal.")]
Resume = Annotated[bool, typer.Option(
    "--resume", help="Continue the output; fail if there is none.")]
Overwrite = Annotated[bool, typer.Option("--overwrite", help="Start the output afresh.")]
Force = Annotated[bool, typer.Option(
    "--force", help="Accept settings that differ from those the output was started with.")]
CommitEvery = Annotated[int | None, typer.Option(
    "--commit-every", metavar="N", help="Commit after N samples...")]
CommitInterval = Annotated[float | None, typer.Option(
    "--commit-interval", metavar="SECONDS", help="...or after S seconds, whichever is first.")]

# Options several stages take, with one wording.
ChatTemplate = Annotated[Path | None, typer.Option(help="A Jinja chat template file.")]
MaxSamples = Annotated[int | None, typer.Option(help="At most N conversations.")]
ApiKey = Annotated[str | None, typer.Option(
    envvar="EAGLE3KIT_API_KEY", help="Bearer token for the servers (never stored).",
    show_envvar=True)]
HiddenStatesDir = Annotated[Path | None, typer.Option(
    metavar="DIR", help="vLLM servers: their shared_storage_path as this machine sees it; only "
    "files they name inside it are read, then deleted (required).")]
TrustRemoteCode = Annotated[bool, typer.Option(
    "--trust-remote-code", help="Run the Python code a model or tokenizer directory ships "
    "(auto_map in its config). Only this flag allows it: what a dataset or run records "
    "never does.")]


def _given(**options: Any) -> dict[str, Any]:
    return {k: v for k, v in options.items() if v is not None}


def _output(json: bool, quiet: bool, no_progress: bool, log_every: float | None) -> Any:
    from eagle3kit._options import OutputOptions

    return OutputOptions(json=json, quiet=quiet, no_progress=no_progress,
                         **_given(log_every=log_every))


def _write(config: type, resume: bool, overwrite: bool, force: bool = False,
           commit_every: int | None = None, commit_interval: float | None = None) -> Any:
    """--resume/--overwrite/--force and the commit flags given, over `config`'s defaults."""
    from eagle3kit._options import WriteOptions

    return WriteOptions.for_stage(config, resume, overwrite, force, **_given(
        commit_every=commit_every, commit_interval=commit_interval))


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


@app.command(rich_help_panel="Datasets", cls=stage_command("eagle3kit.info:InfoConfig"))
def info(
    path: Annotated[Path, typer.Argument(
        help="A dataset, run or checkpoint directory.")],
    no_verify: Annotated[bool, typer.Option(
        "--no-verify", help="Skip reading every shard against its checksums.")] = False,
    target: Annotated[Path | None, typer.Option(
        help="Checkpoints: the target model directory to check against.")] = None,
    json: Json = False, quiet: Quiet = False, no_progress: NoProgress = False,
    log_every: LogEvery = None,
) -> None:
    """Describe a dataset or checkpoint and list its problems (exit 1 when there are any)."""
    from eagle3kit import info as stage

    report = _run(stage.run, lambda: stage.InfoConfig(
        path, verify=not no_verify, output=_output(json, quiet, no_progress, log_every),
        target=target))
    raise typer.Exit(1 if report.problems else 0)


@app.command(rich_help_panel="Datasets",
             cls=stage_command("eagle3kit.convert:ConvertConfig"))
def convert(
    src: Annotated[Path, typer.Argument(help="A dataset directory, or a JSONL file to import.")],
    dst: Annotated[Path, typer.Argument(help="The JSONL file ('-': stdout) or dataset to write.")],
    tokenizer: Annotated[Path | None, typer.Option(
        help="Export: add decoded prompt_text and completion_text.")] = None,
    partition: Annotated[str | None, typer.Option(help="Export: only this partition.")] = None,
    skip_bad_lines: Annotated[bool, typer.Option(
        "--skip-bad-lines", help="Import: skip and count malformed lines.")] = False,
    to: Annotated[str | None, typer.Option(
        help="Hidden states: export to speculators or specforge files.")] = None,
    target: Annotated[Path | None, typer.Option(
        help="Hidden states: the target (its final norm for --to specforge).")] = None,
    layers: Annotated[str | None, typer.Option(
        metavar="2,18,33", help="Hidden-state import: aux layer ids, boundary convention.")
    ] = None,
    trust_remote_code: TrustRemoteCode = False,
    commit_every: CommitEvery = None, commit_interval: CommitInterval = None,
    resume: Resume = False, overwrite: Overwrite = False, force: Force = False,
    json: Json = False, quiet: Quiet = False, no_progress: NoProgress = False,
    log_every: LogEvery = None,
) -> None:
    """A dataset to JSONL, or JSONL to a dataset (resumable), one sample per line."""
    from eagle3kit import convert as stage

    _run(stage.run, lambda: stage.ConvertConfig(
        src, dst, tokenizer=tokenizer, partition=partition, skip_bad_lines=skip_bad_lines,
        to=to, target=target, layers=layers, trust_remote_code=trust_remote_code,
        write=_write(stage.ConvertConfig, resume, overwrite, force, commit_every,
                     commit_interval),
        output=_output(json, quiet, no_progress, log_every),
    ))


# gen's help groups its options by what they are about (Typer's rich_help_panel).
GEN_INPUT, GEN_SERVERS, GEN_RENDER, GEN_SAMPLING, GEN_RUN = (
    "Prompts", "Servers", "Rendering the prompts", "Sampling and lengths", "The run")


@app.command(rich_help_panel="Stages", cls=stage_command("eagle3kit.gen.config:GenConfig"))
def gen(
    prompts: Annotated[list[Path], typer.Argument(
        metavar="PROMPTS... OUTPUT",
        help="Prompt files (JSONL, JSON, parquet), then the output dataset directory last.")],
    dataset: Annotated[str | None, typer.Option(
        metavar="NAME_OR_PATH", rich_help_panel=GEN_INPUT,
        help="Read prompts through HF datasets (the hf extra).")] = None,
    dataset_split: Annotated[str | None, typer.Option(
        rich_help_panel=GEN_INPUT, help="The --dataset split to read.")] = None,
    format: Annotated[str | None, typer.Option(
        rich_help_panel=GEN_INPUT,
        help="auto, messages, sharegpt, conversations, prompt, mtbench.")] = None,
    partition_field: Annotated[str | None, typer.Option(
        rich_help_panel=GEN_INPUT,
        help="Record field naming the partition (default: the file name).")] = None,
    partition: Annotated[str | None, typer.Option(
        rich_help_panel=GEN_INPUT, help="Only this partition, or all.")] = None,
    max_samples: Annotated[int | None, typer.Option(
        rich_help_panel=GEN_INPUT, help="At most N conversations.")] = None,
    shuffle_seed: Annotated[int | None, typer.Option(
        rich_help_panel=GEN_INPUT,
        help="Shuffle the conversations with this seed before --max-samples picks.")] = None,
    skip_bad_lines: Annotated[bool, typer.Option(
        "--skip-bad-lines", rich_help_panel=GEN_INPUT,
        help="Skip and count malformed prompt lines instead of stopping at the first.")
    ] = False,
    server: Annotated[list[str] | None, typer.Option(
        "--server", metavar="URL[@N]", rich_help_panel=GEN_SERVERS,
        help="An SGLang or vLLM server; repeat for several; @N sets its own concurrency. "
             "Required unless --engine hf.")] = None,
    api: Annotated[str | None, typer.Option(
        rich_help_panel=GEN_SERVERS,
        help="auto, sglang, vllm, or openai-chat (text fallback, marked reconstructed).")] = None,
    api_key: Annotated[str | None, typer.Option(
        envvar="EAGLE3KIT_API_KEY", help="Bearer token for the servers (never stored).",
        show_envvar=True, rich_help_panel=GEN_SERVERS)] = None,
    engine: Annotated[str | None, typer.Option(
        rich_help_panel=GEN_SERVERS,
        help="server, or hf: transformers in-process with --target.")] = None,
    target: Annotated[Path | None, typer.Option(
        rich_help_panel=GEN_SERVERS, help="The target model directory (for --engine hf).")
    ] = None,
    concurrency: Annotated[int | None, typer.Option(
        rich_help_panel=GEN_SERVERS, help="Requests in flight per server.")] = None,
    request_timeout: Annotated[float | None, typer.Option(
        metavar="SECONDS", rich_help_panel=GEN_SERVERS,
        help="Limit on one generation (default none: long reasoning takes long).")] = None,
    max_attempts: Annotated[int | None, typer.Option(
        rich_help_panel=GEN_SERVERS,
        help="Attempts per request on a server that is up (default: no limit, --retry-for).")
    ] = None,
    retry_for: Annotated[str | None, typer.Option(
        metavar="DURATION", rich_help_panel=GEN_SERVERS,
        help="Retry a failing request for this long, e.g. 15m, 1h, 900 (seconds); time its "
             "server is down does not count.")] = None,
    stall_after: Annotated[str | None, typer.Option(
        metavar="DURATION", rich_help_panel=GEN_SERVERS,
        help="Warn about a request with no answer for this long.")] = None,
    long_threshold: Annotated[int | None, typer.Option(
        rich_help_panel=GEN_SERVERS,
        help="Prompts with at least N tokens use the --long-* settings, others --short-*.")
    ] = None,
    short_concurrency: Annotated[int | None, typer.Option(
        rich_help_panel=GEN_SERVERS,
        help="Requests in flight per server for short prompts (default --concurrency).")
    ] = None,
    long_concurrency: Annotated[int | None, typer.Option(
        rich_help_panel=GEN_SERVERS,
        help="Requests in flight per server for long prompts (default --concurrency).")
    ] = None,
    tokenizer: Annotated[Path | None, typer.Option(
        rich_help_panel=GEN_RENDER,
        help="The target's tokenizer directory. Required, except with --engine hf (then "
             "--target's).")] = None,
    trust_remote_code: Annotated[bool, typer.Option(
        "--trust-remote-code", rich_help_panel=GEN_RENDER,
        help="Run the Python code the tokenizer or target ships (auto_map); recorded in the "
             "dataset, so later stages need it no more.")] = False,
    chat_template: Annotated[Path | None, typer.Option(
        rich_help_panel=GEN_RENDER, help="A Jinja chat template file (default: the "
                                         "tokenizer's).")] = None,
    chat_template_kwargs: Annotated[str | None, typer.Option(
        metavar="JSON", rich_help_panel=GEN_RENDER,
        help='Template variables, e.g. \'{"enable_thinking": false}\'.')] = None,
    system: Annotated[str | None, typer.Option(
        metavar="PROMPT", rich_help_panel=GEN_RENDER,
        help="System prompt for conversations without one.")] = None,
    history: Annotated[str | None, typer.Option(
        rich_help_panel=GEN_RENDER,
        help="Later turns see the model's own answers (own) or the dataset's (dataset).")] = None,
    no_tokenizer_check: Annotated[bool, typer.Option(
        "--no-tokenizer-check", rich_help_panel=GEN_RENDER,
        help="Skip checking that each server tokenizes a probe text as --tokenizer does.")
    ] = False,
    max_tokens: Annotated[int | None, typer.Option(
        rich_help_panel=GEN_SAMPLING, help="Longest completion asked for.")] = None,
    max_seq_len: Annotated[int | None, typer.Option(
        rich_help_panel=GEN_SAMPLING,
        help="Prompt + completion cap (default the server's context length).")] = None,
    short_max_tokens: Annotated[int | None, typer.Option(
        rich_help_panel=GEN_SAMPLING,
        help="--max-tokens for short prompts (with --long-threshold).")] = None,
    long_max_tokens: Annotated[int | None, typer.Option(
        rich_help_panel=GEN_SAMPLING,
        help="--max-tokens for long prompts (with --long-threshold).")] = None,
    min_completion_tokens: Annotated[int | None, typer.Option(
        rich_help_panel=GEN_SAMPLING, help="Shorter completions are recorded as filtered.")
    ] = None,
    temperature: Annotated[float | None, typer.Option(
        rich_help_panel=GEN_SAMPLING, help="Sampling temperature; 0 is greedy.")] = None,
    top_p: Annotated[float | None, typer.Option(
        rich_help_panel=GEN_SAMPLING, help="Nucleus sampling: the smallest set of tokens "
                                           "holding this much probability.")] = None,
    top_k: Annotated[int | None, typer.Option(
        rich_help_panel=GEN_SAMPLING, help="Sample among the k likeliest tokens; -1 off.")
    ] = None,
    min_p: Annotated[float | None, typer.Option(
        rich_help_panel=GEN_SAMPLING,
        help="Drop tokens less likely than this share of the likeliest one's probability.")
    ] = None,
    n: Annotated[int | None, typer.Option(
        "--n", rich_help_panel=GEN_SAMPLING, help="Samples per prompt.")] = None,
    sampling_seed: Annotated[int | None, typer.Option(
        rich_help_panel=GEN_SAMPLING,
        help="Each sample's seed derives from it and the sample id (default: unseeded).")
    ] = None,
    strict: Annotated[bool, typer.Option(
        "--strict", rich_help_panel=GEN_RUN,
        help="Stop at the first response that breaks an invariant.")] = False,
    grace: Annotated[float | None, typer.Option(
        metavar="SECONDS", rich_help_panel=GEN_RUN,
        help="Time in-flight requests get after Ctrl-C.")] = None,
    commit_every: Annotated[int | None, typer.Option(
        "--commit-every", metavar="N", rich_help_panel=GEN_RUN,
        help="Commit after N samples...")] = None,
    commit_interval: Annotated[float | None, typer.Option(
        "--commit-interval", metavar="SECONDS", rich_help_panel=GEN_RUN,
        help="...or after S seconds, whichever is first.")] = None,
    resume: Annotated[bool, typer.Option(
        "--resume", rich_help_panel=GEN_RUN,
        help="Continue the output; fail if there is none.")] = False,
    overwrite: Annotated[bool, typer.Option(
        "--overwrite", rich_help_panel=GEN_RUN, help="Start the output afresh.")] = False,
    force: Annotated[bool, typer.Option(
        "--force", rich_help_panel=GEN_RUN,
        help="Accept settings that differ from those the output was started with.")] = False,
    keep_failed: Annotated[bool, typer.Option(
        "--keep-failed", rich_help_panel=GEN_RUN,
        help="Leave samples an earlier run recorded as skipped:failed (by default a rerun "
             "retries them).")] = False,
    json: Json = False, quiet: Quiet = False, no_progress: NoProgress = False,
    log_every: LogEvery = None,
) -> None:
    """Generate exact-token samples from SGLang or vLLM servers (or transformers)."""
    options = dict(locals())  # by name: plan takes the same options (_gen_config)
    from eagle3kit import gen as stage

    result = _run(stage.run, lambda: _gen_config(options))
    if result.stopped:  # a script must not go on to validate or train a partial dataset
        raise typer.Exit(result.exit_code)


_GEN_PASSED_ON = (
    "api", "api_key", "engine", "target", "tokenizer", "chat_template", "system", "history",
    "dataset", "dataset_split", "format", "partition_field", "partition", "max_samples",
    "shuffle_seed", "concurrency", "max_tokens", "max_seq_len", "long_threshold",
    "short_concurrency", "long_concurrency", "short_max_tokens", "long_max_tokens",
    "min_completion_tokens", "temperature", "top_p", "top_k", "min_p", "n", "sampling_seed",
    "request_timeout", "max_attempts", "retry_for", "stall_after", "grace",
)
"""gen options handed to GenConfig only when given (its defaults apply otherwise)."""


def _gen_config(o: dict[str, Any]) -> Any:
    """gen's options, keyed by its parameter names, as a GenConfig (plan builds one too)."""
    from eagle3kit.gen.config import GenConfig

    return GenConfig.from_paths(
        o["prompts"], servers=o["server"] or [],
        chat_template_kwargs=o["chat_template_kwargs"] or {},
        trust_remote_code=o["trust_remote_code"], skip_bad_lines=o["skip_bad_lines"],
        tokenizer_check=not o["no_tokenizer_check"], strict=o["strict"],
        retry_failed=not o["keep_failed"],
        write=_write(GenConfig, o["resume"], o["overwrite"], o["force"], o["commit_every"],
                     o["commit_interval"]),
        output=_output(o["json"], o["quiet"], o["no_progress"], o["log_every"]),
        **_given(**{name: o[name] for name in _GEN_PASSED_ON}),
    )


PLAN = "The forecast"


def _plan_options(
    pilot: Annotated[str | None, typer.Option(
        metavar="N|SHARE", rich_help_panel=PLAN,
        help="Pilot prompts: a count, or a share of the run like 0.05 (default 1% or 200, "
             "whichever is larger).")] = None,
    hidden_size: Annotated[int | None, typer.Option(
        rich_help_panel=PLAN, help="The target's hidden size (default: from --target).")
    ] = None,
    layers: Annotated[str | None, typer.Option(
        metavar="2,18,33", rich_help_panel=PLAN,
        help="Aux layer ids; their count sets the states stored (default three).")] = None,
    batch_tokens: Annotated[int | None, typer.Option(
        metavar="N", rich_help_panel=PLAN,
        help="Training tokens per step: forecast the steps per epoch.")] = None,
    train_tokens_per_s: Annotated[float | None, typer.Option(
        metavar="N", rich_help_panel=PLAN,
        help="Training throughput: forecast the time per epoch.")] = None,
    extract_tokens_per_s: Annotated[float | None, typer.Option(
        metavar="N", rich_help_panel=PLAN,
        help="extract's throughput (its tokens_per_s): forecast its time.")] = None,
    seed: Annotated[int | None, typer.Option(
        rich_help_panel=PLAN, help="Chooses the pilot prompts and the bootstrap draws.")
    ] = None,
) -> None:
    """plan's own options; `plan` takes these after all of gen's."""


def plan(**options: Any) -> None:
    """Forecast a gen run's hours, tokens and disk from a pilot that gen then skips."""
    from eagle3kit import plan as stage

    own = stage.PlanConfig.own_options(options)
    _run(stage.run, lambda: stage.PlanConfig(_gen_config(options), **_given(**own)))


# plan's signature is gen's plus its own options: one definition of gen's flags serves both.
plan.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
    *inspect.signature(gen, eval_str=True).parameters.values(),
    *inspect.signature(_plan_options, eval_str=True).parameters.values()])
app.command(rich_help_panel="Stages", cls=stage_command(
    "eagle3kit.plan:PlanConfig", "eagle3kit.gen.config:GenConfig"))(plan)


@app.command(rich_help_panel="Start here",
             cls=stage_command("eagle3kit.quickstart:QuickstartConfig"))
def quickstart(
    out: Annotated[Path | None, typer.Argument(
        metavar="[DIR]", show_default=False, help="Where everything goes.")] = None,
    prompts: Annotated[int | None, typer.Option(
        help="Prompts gen answers: the drafter's data.")] = None,
    bench_prompts: Annotated[int | None, typer.Option(
        help="Held-out prompts bench accept measures on.")] = None,
    target_steps: Annotated[int | None, typer.Option(
        help="Training steps of the tiny target.")] = None,
    train_steps: Annotated[int | None, typer.Option(
        help="Training steps of the drafter.")] = None,
    max_tokens: Annotated[int | None, typer.Option(
        help="Longest completion gen asks for.")] = None,
    threads: Annotated[int | None, typer.Option(help="torch threads.")] = None,
    overwrite: Overwrite = False,
    json: Json = False, quiet: Quiet = False, no_progress: NoProgress = False,
    log_every: LogEvery = None,
) -> None:
    """The whole pipeline on a tiny target, on CPU, offline, in minutes (rerun continues)."""
    from eagle3kit import quickstart as stage

    _run(stage.run, lambda: stage.QuickstartConfig(
        write=_write(stage.QuickstartConfig, False, overwrite),
        output=_output(json, quiet, no_progress, log_every),
        **_given(out=out, prompts=prompts, bench_prompts=bench_prompts,
                 target_steps=target_steps, train_steps=train_steps, max_tokens=max_tokens,
                 threads=threads)))


def main() -> None:
    try:
        app()
    except KeyboardInterrupt as exc:
        raise SystemExit(interrupted(exc)) from None

"""The `eagle3kit` command: parse options, build a stage's config, call its `run`.

Nothing else happens here. Stages import torch and transformers themselves, so `--help` is
instant; defaults live in the config dataclasses, so options default to None here and only
the ones given are passed on. `--help` shows each default from its config (eagle3kit._help):
no help string here restates one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from eagle3kit import __version__
from eagle3kit._command import Group, Stage, interrupted, stages_group
from eagle3kit._command import run_stage as _run
from eagle3kit._help import HelpGroup, stage_command
from eagle3kit.errors import UserError

STAGES: dict[str, Stage | Group] = {
    "info": Stage("eagle3kit.info:InfoConfig", "eagle3kit.info:run", "Datasets",
                  "Describe a dataset or checkpoint and list its problems (exit 1 when there are "
                  "any)."),
    "convert": Stage("eagle3kit.convert:ConvertConfig", "eagle3kit.convert:run", "Datasets",
                     "A dataset to JSONL, or JSONL to a dataset (resumable), one sample per "
                     "line."),
    "validate": Stage("eagle3kit.validate:ValidateConfig", "eagle3kit.validate:run", "Datasets",
                      "Check a token dataset before training (exit 1 when a check fails)."),
    "gen": Stage("eagle3kit.gen.config:GenConfig", "eagle3kit.gen:run", "Stages",
                 "Generate exact-token samples from SGLang or vLLM servers (or transformers)."),
    "plan": Stage("eagle3kit.plan:PlanConfig", "eagle3kit.plan:run", "Stages",
                  "Forecast a gen run's hours, tokens and disk from a pilot that gen then skips."),
    "train": Stage("eagle3kit.train.config:TrainConfig", "eagle3kit.train:run", "Stages",
                   "Train an EAGLE-3 drafter (resumable; torchrun for several processes)."),
    "quickstart": Stage("eagle3kit.quickstart:QuickstartConfig", "eagle3kit.quickstart:run",
                        "Start here", "The whole pipeline on a tiny target, on CPU, offline, in "
                        "minutes (rerun continues)."),
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


@app.command(rich_help_panel="Stages", cls=stage_command("eagle3kit.extract:ExtractConfig"))
def extract(
    tokens: Annotated[Path, typer.Argument(
        metavar="TOKENS", help="The token dataset (from gen or convert).")],
    out: Annotated[Path, typer.Argument(
        metavar="OUTPUT", help="The hidden-state dataset to write.")],
    target: Annotated[Path | None, typer.Option(help="The target model directory.")] = None,
    layers: Annotated[str | None, typer.Option(
        metavar="2,18,33", help="Aux layer ids, boundary convention (default 2,N//2,N-3).")
    ] = None,
    tokenizer: Annotated[Path | None, typer.Option(
        help="Override the tokenizer stored in the token dataset.")] = None,
    engine: Annotated[str | None, typer.Option(
        help="hf (transformers) or vllm (a server with --server).")] = None,
    server: Annotated[str | None, typer.Option(
        metavar="URL", help="--engine vllm: the server, launched for extract_hidden_states.")
    ] = None,
    model: Annotated[str | None, typer.Option(
        help="--engine vllm: the served model name (default: the server's first).")] = None,
    concurrency: Annotated[int | None, typer.Option(
        help="--engine vllm: requests in flight.")] = None,
    request_timeout: Annotated[float | None, typer.Option(
        metavar="SECONDS", help="--engine vllm: limit on one request.")] = None,
    hidden_states_dir: HiddenStatesDir = None,
    api_key: ApiKey = None,
    device: Annotated[str | None, typer.Option(
        help="cpu, cuda, cuda:N; auto: cuda when there is one.")] = None,
    dtype: Annotated[str | None, typer.Option(
        help="bfloat16, float16, float32; auto: bfloat16 on GPU, float32 on CPU.")] = None,
    device_map: Annotated[str | None, typer.Option(
        help="Spread a big model over GPUs (e.g. auto).")] = None,
    batch_tokens: Annotated[int | None, typer.Option(
        metavar="N", help="Tokens per forward pass, padding included.")] = None,
    codec: Annotated[str | None, typer.Option(help="raw (bf16), fp8 or zstd.")] = None,
    trust_remote_code: TrustRemoteCode = False,
    ignore_disk_check: Annotated[bool, typer.Option(
        "--ignore-disk-check", help="Start even when free disk is short of the estimate.")
    ] = False,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Print the size estimate and exit.")] = False,
    commit_every: CommitEvery = None, commit_interval: CommitInterval = None,
    resume: Resume = False, overwrite: Overwrite = False, force: Force = False,
    json: Json = False, quiet: Quiet = False, no_progress: NoProgress = False,
    log_every: LogEvery = None,
) -> None:
    """Target hidden states for a token dataset (resumable; torchrun for several GPUs)."""
    from eagle3kit import extract as stage

    _run(stage.run, lambda: stage.ExtractConfig(
        tokens, out, target=target, layers=layers, tokenizer=tokenizer, server=server,
        model=model, hidden_states_dir=hidden_states_dir, api_key=api_key,
        device_map=device_map, trust_remote_code=trust_remote_code,
        ignore_disk_check=ignore_disk_check, dry_run=dry_run,
        write=_write(stage.ExtractConfig, resume, overwrite, force, commit_every,
                     commit_interval),
        output=_output(json, quiet, no_progress, log_every),
        **_given(engine=engine, concurrency=concurrency, request_timeout=request_timeout,
                 device=device, dtype=dtype, batch_tokens=batch_tokens, codec=codec),
    ))


@app.command(rich_help_panel="Stages",
             cls=stage_command("eagle3kit.export:ExportConfig", run_dir="run"))
def export(
    run_dir: Annotated[Path, typer.Argument(
        metavar="RUN", help="A train run directory, or any EAGLE-3 checkpoint directory.")],
    out: Annotated[Path, typer.Argument(
        metavar="OUT", help="The directory to write (OUT/vllm and OUT/sglang with both).")],
    format: Annotated[str | None, typer.Option(
        help="vllm, sglang, or both (OUT/vllm and OUT/sglang).")] = None,
    verifier: Annotated[str | None, typer.Option(
        metavar="NAME_OR_PATH",
        help="The model `vllm serve <draft>` loads (default: the run's target).")] = None,
    num_speculative_tokens: Annotated[int | None, typer.Option(
        help="Draft tokens per step in the vLLM config.")] = None,
    dtype: Annotated[str | None, typer.Option(
        help="bfloat16, float16 or float32 weights.")] = None,
    target: Annotated[Path | None, typer.Option(
        help="The target model directory (default: the path the run recorded).")] = None,
    with_embedding: Annotated[bool, typer.Option(
        "--with-embedding", help="vLLM: add a bit-exact copy of the target's embedding.")] = False,
    layers: Annotated[str | None, typer.Option(
        metavar="A,B,C", help="Boundary layer ids, only for a checkpoint that has none.")] = None,
    trust_remote_code: TrustRemoteCode = False,
    overwrite: Annotated[bool, typer.Option(
        "--overwrite", help="Replace an OUT that holds an earlier export.")] = False,
    overwrite_dir: Annotated[Path | None, typer.Option(
        metavar="OUT", help="Replace OUT even when it is not an earlier export, deleting what "
        "it holds: name OUT again.")] = None,
    json: Json = False, quiet: Quiet = False, no_progress: NoProgress = False,
    log_every: LogEvery = None,
) -> None:
    """Write a trained drafter as the checkpoints vLLM and SGLang load."""
    from eagle3kit import export as stage

    _run(stage.run, lambda: stage.ExportConfig(
        run_dir, out, verifier=verifier, target=target, with_embedding=with_embedding,
        layers=layers, overwrite=overwrite, overwrite_dir=overwrite_dir,
        trust_remote_code=trust_remote_code,
        output=_output(json, quiet, no_progress, log_every),
        **_given(format=format, num_speculative_tokens=num_speculative_tokens, dtype=dtype)))


bench_app = typer.Typer(
    cls=HelpGroup, help="Acceptance length: offline against the target, or on a live server.",
    no_args_is_help=True, context_settings={"help_option_names": ["-h", "--help"]})
app.add_typer(bench_app, name="bench", rich_help_panel="Stages")
BenchPrompts = Annotated[list[Path] | None, typer.Argument(
    metavar="PROMPTS...", show_default=False,
    help="Prompt files, as gen takes them (JSONL, JSON, parquet); EAGLE/MT-bench "
         "question.jsonl.")]
BenchPromptsOption = Annotated[list[Path] | None, typer.Option(
    "--prompts", metavar="FILE", hidden=True,
    help="Deprecated: give the prompt files positionally.")]
BenchMaxTurns = Annotated[int | None, typer.Option(help="At most N turns of each.")]
BenchFormat = Annotated[str | None, typer.Option(help="Prompt file shape (as gen's --format).")]
BenchSeed = Annotated[int | None, typer.Option(help="Sampling seed.")]
BenchPlot = Annotated[Path | None, typer.Option(
    metavar="FILE.png", help="Draw acceptance per position and category (plot extra).")]


def _bench_required(**options: Any) -> None:
    for name, value in options.items():
        if value is None:
            raise UserError(f"--{name.replace('_', '-')} is required")


def _bench_prompts(positional: list[Path] | None, option: list[Path] | None) -> list[Path]:
    """The prompt files: positional, as gen takes them; `--prompts FILE` still works."""
    if option:
        from eagle3kit import _ui

        _ui.warn("--prompts is deprecated: give the prompt files positionally, as gen takes them")
    files = [*(positional or []), *(option or [])]
    if not files:
        raise UserError("give the prompt files (e.g. tests/data/prompts/eagle/mt_bench/"
                        "question.jsonl)")
    return files


@bench_app.command("accept", cls=stage_command("eagle3kit.bench.accept:AcceptConfig"))
def bench_accept(
    prompts: BenchPrompts = None,
    target: Annotated[Path | None, typer.Option(help="The target model directory.")] = None,
    drafter: Annotated[Path | None, typer.Option(
        help="The drafter checkpoint directory (any layout `eagle3kit info` reads).")] = None,
    prompts_option: BenchPromptsOption = None,
    k: Annotated[int | None, typer.Option("--k", help="Draft tokens per round (a chain).")
                 ] = None,
    tree: Annotated[str | None, typer.Option(
        metavar="TOPK,DEPTH", help="Draft a tree instead of a chain.")] = None,
    temperature: Annotated[float | None, typer.Option(
        help="Sampling temperature; 0 is greedy (and checks losslessness).")] = None,
    max_new_tokens: Annotated[int | None, typer.Option(
        help="Tokens generated per turn.")] = None,
    max_samples: MaxSamples = None,
    max_turns: BenchMaxTurns = None,
    format: BenchFormat = None,
    tokenizer: Annotated[Path | None, typer.Option(
        help="The tokenizer directory (default: the target's).")] = None,
    chat_template: ChatTemplate = None,
    device: Annotated[str | None, typer.Option(
        help="auto (cuda when there is one), cpu, cuda, cuda:N.")] = None,
    dtype: Annotated[str | None, typer.Option(
        help="auto (float32 on CPU, bfloat16 on GPU), bfloat16, float16, float32.")] = None,
    tie_epsilon: Annotated[float | None, typer.Option(
        help="Logit gap counted as a near-tie (default 1e-3 fp32, 0.25 bf16, 0.05 fp16).")
    ] = None,
    seed: BenchSeed = None,
    plot: BenchPlot = None,
    trust_remote_code: TrustRemoteCode = False,
    json: Json = False, quiet: Quiet = False, no_progress: NoProgress = False,
    log_every: LogEvery = None,
) -> None:
    """Speculative decoding with the target in-process: acceptance length, losslessness."""
    from eagle3kit.bench import accept as stage

    def config() -> stage.AcceptConfig:
        _bench_required(target=target, drafter=drafter)
        assert target is not None and drafter is not None  # _bench_required refused a None
        files = _bench_prompts(prompts, prompts_option)
        if k is not None and tree is not None:
            raise UserError("--k and --tree exclude each other: a tree's depth is its second "
                            "number (--tree TOPK,DEPTH)")
        return stage.AcceptConfig(
            target, drafter, files, tree=stage.parse_tree(tree), tokenizer=tokenizer,
            chat_template=chat_template, tie_epsilon=tie_epsilon, plot=plot,
            max_samples=max_samples, max_turns=max_turns, trust_remote_code=trust_remote_code,
            output=_output(json, quiet, no_progress, log_every),
            **_given(k=k, temperature=temperature, max_new_tokens=max_new_tokens,
                     format=format, device=device, dtype=dtype, seed=seed))

    report = _run(stage.run, config)
    raise typer.Exit(report.exit_code)


@bench_app.command("server", cls=stage_command("eagle3kit.bench.server:ServerBenchConfig"))
def bench_server(
    prompts: BenchPrompts = None,
    server: Annotated[str | None, typer.Option(
        metavar="URL", help="An SGLang or vLLM server running speculative decoding.")] = None,
    tokenizer: Annotated[Path | None, typer.Option(
        help="The target's tokenizer directory (prompts are sent as ids).")] = None,
    prompts_option: BenchPromptsOption = None,
    baseline: Annotated[str | None, typer.Option(
        metavar="URL", help="The same model served without speculation: the speedup.")] = None,
    api: Annotated[str | None, typer.Option(help="auto, sglang or vllm.")] = None,
    chat_template: ChatTemplate = None,
    max_new_tokens: Annotated[int | None, typer.Option(
        help="Tokens generated per turn.")] = None,
    temperature: Annotated[float | None, typer.Option(
        help="Sampling temperature; 0 is greedy.")] = None,
    concurrency: Annotated[int | None, typer.Option(help="Conversations in flight.")] = None,
    max_samples: MaxSamples = None,
    max_turns: BenchMaxTurns = None,
    format: BenchFormat = None,
    k: Annotated[int | None, typer.Option(
        "--k", help="Draft tokens per round, when the server does not say.")] = None,
    api_key: ApiKey = None,
    request_timeout: Annotated[float | None, typer.Option(
        metavar="SECONDS", help="Limit on one request (default none).")] = None,
    seed: BenchSeed = None,
    plot: BenchPlot = None,
    trust_remote_code: TrustRemoteCode = False,
    json: Json = False, quiet: Quiet = False, no_progress: NoProgress = False,
    log_every: LogEvery = None,
) -> None:
    """Acceptance length, throughput and latency of a live speculating server."""
    from eagle3kit.bench import server as stage

    def config() -> stage.ServerBenchConfig:
        _bench_required(server=server)
        files = _bench_prompts(prompts, prompts_option)
        _bench_required(tokenizer=tokenizer)
        assert server is not None and tokenizer is not None  # _bench_required refused a None
        return stage.ServerBenchConfig(
            server, files, tokenizer, baseline=baseline, chat_template=chat_template,
            max_samples=max_samples, max_turns=max_turns, k=k, api_key=api_key,
            request_timeout=request_timeout, plot=plot, trust_remote_code=trust_remote_code,
            output=_output(json, quiet, no_progress, log_every),
            **_given(api=api, max_new_tokens=max_new_tokens, temperature=temperature,
                     concurrency=concurrency, format=format, seed=seed))

    _run(stage.run, config)


@bench_app.command("parity", cls=stage_command("eagle3kit.bench.parity:ParityConfig"))
def bench_parity(
    prompts: BenchPrompts = None,
    server: Annotated[str | None, typer.Option(
        metavar="URL", help="Your SGLang or vLLM server, speculating with --drafter.")] = None,
    target: Annotated[Path | None, typer.Option(help="The target model directory.")] = None,
    drafter: Annotated[Path | None, typer.Option(
        help="The drafter directory the server serves (an export).")] = None,
    speculative_config: Annotated[str | None, typer.Option(
        metavar="JSON", help="The --speculative-config the vLLM server was started with.")
    ] = None,
    tolerance: Annotated[float | None, typer.Option(
        help="Largest engine - bench accept difference that passes, overall and per "
             "position.")] = None,
    api: Annotated[str | None, typer.Option(help="auto, sglang or vllm.")] = None,
    k: Annotated[int | None, typer.Option(
        "--k", help="Draft tokens per round, when the server does not say.")] = None,
    max_new_tokens: Annotated[int | None, typer.Option(
        help="Tokens generated per turn.")] = None,
    max_samples: MaxSamples = None,
    max_turns: BenchMaxTurns = None,
    format: BenchFormat = None,
    chat_template: ChatTemplate = None,
    device: Annotated[str | None, typer.Option(
        help="bench accept's device: auto, cpu, cuda, cuda:N.")] = None,
    dtype: Annotated[str | None, typer.Option(
        help="bench accept's dtype: auto, bfloat16, float16, float32.")] = None,
    api_key: ApiKey = None,
    request_timeout: Annotated[float | None, typer.Option(
        metavar="SECONDS", help="Limit on one request (default none).")] = None,
    trust_remote_code: TrustRemoteCode = False,
    json: Json = False, quiet: Quiet = False, no_progress: NoProgress = False,
    log_every: LogEvery = None,
) -> None:
    """The serving-parity gate: the server's acceptance against bench accept's, and why."""
    from eagle3kit.bench import parity as stage

    def config() -> stage.ParityConfig:
        _bench_required(server=server)
        files = _bench_prompts(prompts, None)
        _bench_required(target=target, drafter=drafter)
        # _bench_required refused a None
        assert server is not None and target is not None and drafter is not None
        return stage.ParityConfig(
            server, files, target, drafter, speculative_config=speculative_config,
            max_samples=max_samples, max_turns=max_turns, k=k, api_key=api_key,
            request_timeout=request_timeout, chat_template=chat_template,
            trust_remote_code=trust_remote_code,
            output=_output(json, quiet, no_progress, log_every),
            **_given(tolerance=tolerance, api=api, max_new_tokens=max_new_tokens,
                     format=format, device=device, dtype=dtype))

    report = _run(stage.run, config)
    raise typer.Exit(report.exit_code)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt as exc:
        raise SystemExit(interrupted(exc)) from None

"""What `eagle3kit plan` shows: the pilot, its partitions and the forecast's table on stderr,
the result as JSON on stdout with --json."""

from __future__ import annotations

from dataclasses import asdict
from functools import partial

from eagle3kit import _text, _ui
from eagle3kit.plan.result import Estimate, PlanResult

_time = partial(_text.duration, tenths=True)


def report(result: PlanResult, opts: _ui.OutputOptions) -> None:
    if opts.json:
        _ui.print_json(asdict(result))
    pilot = [
        (
            "samples",
            f"{result.samples:,} ({result.done:,} in the dataset, "
            f"{result.remaining:,} to generate)",
        ),
        ("slots", f"{result.slots:,} requests in flight"),
    ]
    if result.pilot_requests:
        pilot += [
            (
                "pilot",
                f"{result.pilot_requests:,} requests in {_time(result.pilot_elapsed_s)}"
                f": {result.pilot_req_per_s:.3g} req/s, "
                f"{_text.human_count(result.pilot_tok_per_s or 0)} tok/s",
            )
        ]
        if result.pilot_simulated_s is not None:
            pilot += [
                (
                    "slot model",
                    f"replays the pilot's requests in "
                    f"{_time(result.pilot_simulated_s)}; the rest, "
                    f"{_time(result.startup_s)}, is start-up (once per run)",
                )
            ]
    pilot += [
        (
            "truncation",
            f"{percent(result.truncation)} of pilot samples hit --max-tokens {result.max_tokens}",
        )
    ]
    _ui.kv(f"plan: {result.output}", pilot, opts)
    _ui.table(
        "pilot, by partition",
        [
            "partition",
            "samples",
            "pilot",
            "mean tok",
            "p50",
            "p90",
            "p99",
            "trunc %",
            "s/request",
            "% prompts",
            "% time",
        ],
        [
            [
                p.name,
                p.samples,
                p.pilot,
                round(p.mean_tokens),
                round(p.p50_tokens),
                round(p.p90_tokens),
                round(p.p99_tokens),
                round(100 * p.truncation, 1),
                round(p.mean_latency_s, 3),
                round(100 * p.prompt_share, 1),
                round(100 * p.time_share, 1),
            ]
            for p in result.partitions
        ],
        opts,
    )
    _ui.table(
        f"forecast (range: {percent(result.coverage)} of outcomes)",
        ["", "forecast", "range"],
        _forecast_rows(result),
        opts,
    )
    for note in result.notes:
        _ui.info(f"note: {note}", opts)


def _forecast_rows(r: PlanResult) -> list[list[object]]:
    def row(name: str, e: Estimate | dict, fmt) -> list[object]:
        e = Estimate(**e) if isinstance(e, dict) else e
        return [name, fmt(e.value), f"{fmt(e.low)} – {fmt(e.high)}"]

    rows = [
        row("wall time, the gen that follows", r.wall_time_s, _time),
        row("wall time, the whole run", r.full_wall_time_s, _time),
        row("completion tokens", r.completion_tokens, _text.human_count),
        row("tokens (prompt + completion)", r.total_tokens, _text.human_count),
        row("token dataset", r.token_dataset_bytes, _text.human_bytes),
    ]
    if r.hidden:
        shape = f"H={r.hidden['hidden_size']}, {r.hidden['n_aux']} aux"
        rows += [
            row(f"hidden states, {codec} ({shape})", e, _text.human_bytes)
            for codec, e in r.hidden["bytes"].items()
        ]
    if r.extract:
        rows.append(
            row(
                f"extract time ({_text.human_count(r.extract['tokens_per_s'])} tok/s)",
                r.extract["time_s"],
                _time,
            )
        )
    if "steps_per_epoch" in r.train:
        rows.append(
            row(
                f"train steps / epoch ({_text.human_count(r.train['batch_tokens'])} tok)",
                r.train["steps_per_epoch"],
                lambda x: f"{x:,.0f}",
            )
        )
    if "epoch_s" in r.train:
        rows.append(row("train time / epoch", r.train["epoch_s"], _time))
    return rows


def percent(x: float) -> str:
    return f"{100 * x:.0f}%" if x >= 0.01 else f"{100 * x:.1f}%"

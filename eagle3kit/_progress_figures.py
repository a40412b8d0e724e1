"""The figures a progress display shows, derived from its counts: each line's rate, tokens,
errors and ETA, the cells of the live table and of the final one, and which columns are
worth their place. Plain text and numbers: eagle3kit._ui's `Progress` draws them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from eagle3kit._text import duration, human_count, plain_number, printable


@dataclass
class Tally:
    """The raw counts of one line: the whole run, or one row of it (a partition, a server)."""

    total: int | None = None
    initial: int = 0  # done by an earlier run: counts towards done, not towards rates
    done: int = 0
    counters: dict[str, float | None] = field(default_factory=dict)  # a None gauge shows "–"

    def add(self, n: int, increments: dict[str, float]) -> None:
        self.done += n
        counters = self.counters
        for name, inc in increments.items():
            counters[name] = (counters.get(name) or 0) + inc


@dataclass(frozen=True)
class LineFigures:
    """What one line shows, derived from its counts; None where there is nothing to show."""

    done: int
    total: int | None
    rate: float  # items per second done by this run
    tok_rate: float | None  # from the `tokens` counter
    mean_tokens: float | None  # tokens per item that produced output
    in_flight: float | None  # the `in_flight` gauge
    errors: float
    retries: float | None
    truncation: float | None  # fraction of items with output that were `truncated`
    eta: float | None  # seconds

    @property
    def percent(self) -> float | None:
        return 100 * self.done / self.total if self.total else None


def figures(tally: Tally, elapsed: float) -> LineFigures:
    counters = dict(tally.counters)  # one C-level copy: the live thread reads it concurrently
    done, total = tally.done, tally.total
    per_second = 1 / elapsed if elapsed > 0 else 0.0
    rate = (done - tally.initial) * per_second
    # Skipped items (never sent, or given up on) have no output: they would dilute the means.
    with_output = done - tally.initial - (counters.get("skipped") or 0)
    tokens, truncated = counters.get("tokens"), counters.get("truncated")
    return LineFigures(
        done=done,
        total=total,
        rate=rate,
        tok_rate=None if tokens is None else tokens * per_second,
        mean_tokens=tokens / with_output if tokens is not None and with_output > 0 else None,
        in_flight=counters.get("in_flight"),
        errors=counters.get("errors") or 0,
        retries=counters.get("retries"),
        truncation=truncated / with_output if truncated is not None and with_output > 0 else None,
        eta=(total - done) / rate if total and rate > 0 and done < total else None,
    )


def row_name(key: str) -> tuple[str, str]:
    """'server:http://a:30000' -> ('server', 'http://a:30000'); rows group by the prefix."""
    group, sep, name = printable(key).partition(":")
    return (group, name) if sep else ("", group)


def live_cells(f: LineFigures, unit: str) -> dict[str, str | None]:
    """One row of the live table, as text; None leaves a cell (or a whole column) empty."""

    def maybe(value: float | None, fmt: Callable[[float], str]) -> str | None:
        return None if value is None else fmt(value)

    return {
        "done": f"{f.done:,}" + (f"/{f.total:,}" if f.total else ""),
        "%": maybe(f.percent, lambda p: f"{p:.1f}%"),
        f"{unit}/s": human_count(f.rate),
        "tok/s": maybe(f.tok_rate, human_count),
        "mean tok": maybe(f.mean_tokens, lambda m: f"{round(m):,}"),
        "in flight": maybe(f.in_flight, plain_number),
        "errors": plain_number(f.errors),
        "retries": maybe(f.retries, plain_number),
        "trunc": maybe(f.truncation, lambda t: f"{100 * t:.1f}%"),
        "ETA": maybe(f.eta, duration),
    }


def summary_cells(f: LineFigures, unit: str) -> dict[str, object]:
    """One row of the final table, as numbers that table() right-aligns."""

    def figure(x: float | None) -> float | int | None:
        return None if x is None else round(x) if abs(x) >= 100 else round(x, 2)

    return {
        "done": f.done,
        "total": f.total,
        "%": figure(f.percent),
        f"{unit}/s": figure(f.rate),
        "tok/s": figure(f.tok_rate),
        "mean tok": None if f.mean_tokens is None else round(f.mean_tokens),
        "errors": figure(f.errors),
        "retries": figure(f.retries),
        "trunc %": None if f.truncation is None else round(100 * f.truncation, 2),
    }


def shown_columns(rows: Iterable[Mapping[str, object]], always: Iterable[str]) -> list[str]:
    """The columns worth a place: those always shown, and those with a value in some row."""
    rows = list(rows)
    keep = set(always)
    for row in rows:
        keep.update(name for name, value in row.items() if value is not None)
    return [name for name in rows[0] if name in keep] if rows else []


# On a terminal too narrow for every column of the live table, these go first, in this order.
_DROPPED_FIRST = ("retries", "%", "in flight", "trunc", "mean tok", "tok/s", "ETA")


def fit_columns(headers: list[str], widths: dict[str, int], room: int) -> list[str]:
    """The headers whose columns fit in room, dropping the least needed ones."""
    for name in _DROPPED_FIRST:
        if sum(widths[h] + 2 for h in headers) <= room:
            break
        headers = [h for h in headers if h != name]
    return headers

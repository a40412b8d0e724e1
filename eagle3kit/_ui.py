"""Everything a person or a script sees: messages, tables, JSON and progress.

Human output goes to stderr and machine output (``--json``) to stdout, so piping a command's
JSON never picks up progress or warnings. This is the only module that imports rich, and it does
so inside functions: importing it must stay free for commands that never draw anything.

Text from data reaches the terminal only through eagle3kit._text's `printable` (a control
character in it is written as visible text): every function here that prints applies it, so
no caller can forget. What a progress display shows is worked out in
eagle3kit._progress_figures; here it is drawn.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from eagle3kit._options import OutputOptions
from eagle3kit._progress_figures import (
    LineFigures,
    Tally,
    figures,
    fit_columns,
    live_cells,
    row_name,
    shown_columns,
    summary_cells,
)
from eagle3kit._text import duration, human_count, json_for_terminal, plain_number, printable

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.live import Live


_MARKS = {True: ("✓", "green"), False: ("✗", "bold red"), None: ("–", "dim")}
# An operator scans a log for errors first, so "errors 0" is worth its place in every line.
_ALWAYS_SHOWN = ("errors",)
# While a live display runs, everything drawn must go through its console: rich lets a second
# console write straight to the terminal, through the bar, instead of above it.
_live_console: Console | None = None


def is_terminal() -> bool:
    """Whether stderr, where humans read, is an interactive terminal (tmux included)."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # stderr is None (pythonw) or already closed
        return False


def _quiet(opts: OutputOptions | None) -> bool:
    return opts is not None and opts.quiet


def _console() -> Console:
    if _live_console is not None:
        return _live_console
    from rich.console import Console

    # Built per call so it follows sys.stderr as it is now (pytest swaps it). Markup and emoji
    # are off because paths and prompts can contain "[...]" and ":name:". Off a terminal rich
    # would wrap at 80 columns and cut table cells; logs have no width, so give them room.
    width = None if is_terminal() else 200
    return Console(stderr=True, markup=False, emoji=False, highlight=False, width=width)


def _tagged(tag: str, style: str, msg: str) -> None:
    msg = printable(msg, one_line=False)
    if not is_terminal():  # logs get the bare line: no rich, no wrapping, no escape codes
        print(f"{tag}: {msg}", file=sys.stderr, flush=True)
        return
    from rich.text import Text

    _console().print(Text.assemble((f"{tag}:", style), " ", msg), soft_wrap=True)


def _set_live_console(console: Console | None) -> None:
    global _live_console
    _live_console = console


def info(msg: str, opts: OutputOptions | None = None) -> None:
    """A line for the person watching; dropped under --quiet."""
    if not _quiet(opts):
        print(printable(msg, one_line=False), file=sys.stderr, flush=True)


def warn(msg: str) -> None:
    """'warning: ...' on stderr, even under --quiet."""
    _tagged("warning", "bold yellow", msg)


def warn_all(messages: list[str]) -> None:
    """Each warning a reader or writer of format/ returned (format/ prints nothing)."""
    for msg in messages:
        warn(msg)


def error(msg: str) -> None:
    """'error: ...' on stderr, even under --quiet; callers show no traceback for expected errors."""
    _tagged("error", "bold red", msg)


def print_json(obj: object) -> None:
    """The command's result as indented JSON on stdout, numpy values and odd keys included."""
    import orjson

    flags = orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
    data = orjson.dumps(obj, option=flags | orjson.OPT_APPEND_NEWLINE, default=str).decode()
    # orjson escapes C0 controls but, as JSON allows, writes DEL, C1 and the bidi controls raw.
    sys.stdout.write(json_for_terminal(data))
    sys.stdout.flush()


def _cell(value: object) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    return printable(value)


def table(
    title: str,
    columns: list[str],
    rows: Sequence[Sequence[object]],
    opts: OutputOptions | None = None,
    fold: bool = False,
) -> None:
    """A titled table on stderr; numeric columns are right-aligned so figures line up.

    `fold` breaks a cell's over-long words across lines instead of cutting them with an
    ellipsis: for cells that must stay whole, such as command lines."""
    if _quiet(opts):
        return
    from rich.table import Table

    grid = Table(title=printable(title), title_justify="left")
    for i, name in enumerate(columns):
        values = [r[i] for r in rows if r[i] is not None]
        numeric = bool(values) and all(isinstance(v, int | float) for v in values)
        grid.add_column(
            printable(name),
            justify="right" if numeric else "left",
            overflow="fold" if fold else "ellipsis",
        )
    for row in rows:
        grid.add_row(*(_cell(v) for v in row))
    _console().print(grid)


def checklist(items: list[tuple[bool | None, str, str]], opts: OutputOptions | None = None) -> None:
    """Numbered '1. ✓ name  detail' lines: True passed, False failed, None skipped."""
    if _quiet(opts) or not items:
        return
    from rich.text import Text

    console = _console()
    items = [(ok, printable(name), printable(detail)) for ok, name, detail in items]
    num_width = len(str(len(items)))
    name_width = max(len(name) for _, name, _ in items)
    for i, (ok, name, detail) in enumerate(items, 1):
        mark, style = _MARKS[ok]
        line = Text.assemble(f"{i:>{num_width}}. ", (mark, style), f" {name:<{name_width}}")
        if detail:
            line.append(f"  {detail}")
        line.rstrip()  # a name with no detail leaves padding behind
        console.print(line, soft_wrap=True)


def kv(title: str, pairs: Sequence[tuple[str, object]], opts: OutputOptions | None = None) -> None:
    """A title and an aligned 'key  value' block, for info-style summaries."""
    if _quiet(opts):
        return
    from rich.text import Text

    console = _console()
    console.print(Text(printable(title), style="bold"), soft_wrap=True)
    pairs = [(printable(key), value) for key, value in pairs]
    key_width = max((len(k) for k, _ in pairs), default=0)
    for key, value in pairs:
        console.print(Text(f"  {key:<{key_width}}  {_cell(value)}"), soft_wrap=True)


class Progress:
    """One set of running figures, drawn live on a terminal or logged as plain status lines.

    ``add`` counts finished work and accumulates counters (tokens, errors, retries, truncated,
    skipped...); ``set`` overwrites gauges (in_flight...). ``initial`` is work finished by an
    earlier run (resume): it counts towards done/total but not towards this run's rate.

    Rows break the figures down, e.g. ``"partition:math"`` or ``"server:http://a:30000"``; the
    prefix before the first ':' groups them. ``add(..., rows=...)`` counts into the whole run and
    into each named row; ``set(..., rows=...)`` sets the gauges of the named rows only (the
    run's own in_flight is set by a call without rows). The live display shows one table row
    per row; plain status lines carry the whole run's figures only.
    """

    def __init__(
        self,
        label: str,
        total: int | None,
        opts: OutputOptions,
        unit: str = "samples",
        clock: Callable[[], float] = time.monotonic,
        initial: int = 0,
    ) -> None:
        self.label, self.opts, self.unit = printable(label), opts, printable(unit)
        self.mode = "off"  # "live", "plain" or "off"; chosen on __enter__
        self._clock = clock
        self._all = Tally(total=total, initial=initial, done=initial)
        self._rows: dict[str, Tally] = {}
        self._start = self._last_line = clock()
        self._end: float | None = None
        self._live: Live | None = None

    def __enter__(self) -> Progress:
        self._start = self._last_line = self._clock()
        if self.opts.quiet:
            self.mode = "off"
        elif is_terminal() and not self.opts.no_progress:
            self.mode = "live"
            self._start_live()
        else:
            self.mode = "plain"
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        self._end = self._clock()
        if self._live is not None:
            self._live.stop()
            self._live = None
            _set_live_console(None)
        if self.mode != "off":  # always, so a log ends with the totals
            line = self.status_line()
            if exc_type is not None:
                line += f" (stopped: {exc_type.__name__})"
            print(line, file=sys.stderr, flush=True)

    # Recording ------------------------------------------------------------------------------
    def add(self, n: int = 1, *, rows: Sequence[str] = (), **increments: float) -> None:
        """Record n more finished items; each counter grows by its increment, in each row too."""
        self._all.add(n, increments)
        for key in (rows,) if isinstance(rows, str) else rows:
            self._row(key).add(n, increments)
        self._tick()

    def set(self, rows: Sequence[str] = (), /, **values: float | None) -> None:
        """Overwrite gauges that go up and down, such as in_flight: the run's, or the rows'.
        None shows the gauge as "–": not measured yet. (`rows` is positional only, so any
        gauge name, taken from a dict, is a gauge.)"""
        if not rows:
            self._all.counters.update(values)
        for key in (rows,) if isinstance(rows, str) else rows:
            self._row(key).counters.update(values)
        self._tick()

    def set_total(self, row: str, total: int | None, *, initial: int = 0) -> None:
        """A row's total (partitions know theirs up front) and its work from an earlier run."""
        tally = self._row(row)
        tally.total = total
        tally.done += initial - tally.initial
        tally.initial = initial

    def _row(self, key: str) -> Tally:
        tally = self._rows.get(key)
        if tally is None:
            tally = self._rows[key] = Tally()
        return tally

    # Reading --------------------------------------------------------------------------------
    @property
    def total(self) -> int | None:
        return self._all.total

    @total.setter
    def total(self, value: int | None) -> None:
        self._all.total = value

    @property
    def done(self) -> int:
        return self._all.done

    @property
    def counters(self) -> dict[str, float | None]:
        return dict(self._all.counters)

    @property
    def rows(self) -> list[str]:
        """Row keys in display order: grouped by prefix, each group in order of appearance."""
        groups: dict[str, list[str]] = {}
        for key in list(self._rows):  # a C-level copy: rows appear while the live thread reads
            groups.setdefault(row_name(key)[0], []).append(key)
        return [key for keys in groups.values() for key in keys]

    @property
    def elapsed(self) -> float:
        """Seconds since __enter__, frozen at __exit__."""
        end = self._end if self._end is not None else self._clock()
        return max(end - self._start, 0.0)

    @property
    def rate(self) -> float:
        """Items per second done by this run."""
        return self.figures().rate

    def figures(self, row: str | None = None) -> LineFigures:
        """The derived figures of the whole run, or of one row."""
        return figures(self._all if row is None else self._rows[row], self.elapsed)

    def status_line(self) -> str:
        """'convert 1,200/5,000 (24.0%) 300 samples/s 312k tok/s errors 0 mean 1,040 tok ...'."""
        f = self.figures()
        counters = self.counters
        parts = [self.label]
        if f.total:
            parts.append(f"{f.done:,}/{f.total:,} ({f.percent:.1f}%)")
        else:
            parts.append(f"{f.done:,} {self.unit}")
        parts.append(f"{human_count(f.rate)} {self.unit}/s")
        if f.tok_rate is not None:
            parts.append(f"{human_count(f.tok_rate)} tok/s")
        for name, value in {**dict.fromkeys(_ALWAYS_SHOWN, 0.0), **counters}.items():
            if value is None:  # a gauge with no reading yet (train's AL before evaluating)
                parts.append(f"{name} –")
            elif name == "truncated":  # shown even at 0: a clean run is worth knowing about
                share = "" if f.truncation is None else f" ({100 * f.truncation:.1f}%)"
                parts.append(f"truncated {plain_number(value)}{share}")
            elif name != "tokens" and (value or name in _ALWAYS_SHOWN):
                parts.append(f"{name} {plain_number(value)}")
        if f.mean_tokens is not None:
            parts.append(f"mean {round(f.mean_tokens):,} tok")
        parts.append(f"elapsed {duration(self.elapsed)}")
        if f.eta is not None:
            parts.append(f"ETA {duration(f.eta)}")
        return " ".join(parts)

    @property
    def columns(self) -> list[str]:
        """Headers for summary_rows(): ``table(title, p.columns, p.summary_rows())``."""
        return self._summary()[0]

    def summary_rows(self) -> list[list[object]]:
        """The final table: one row per row key (group, name, figures...), then the total."""
        return self._summary()[1]

    def _summary(self) -> tuple[list[str], list[list[object]]]:
        named = [(*row_name(key), self.figures(key)) for key in self.rows]
        named.append(("total", "", self.figures()))
        cells = [summary_cells(f, self.unit) for _, _, f in named]
        headers = shown_columns(cells, ("done", f"{self.unit}/s", "errors"))
        rows = [[g, n, *(c[h] for h in headers)] for (g, n, _), c in zip(named, cells, strict=True)]
        return ["", "", *headers], rows

    # Drawing --------------------------------------------------------------------------------
    def _tick(self) -> None:
        # Plain mode has no thread: the work's own calls drive the log, at most once per interval.
        if self.mode != "plain":
            return
        now = self._clock()
        if now - self._last_line >= self.opts.log_every:
            self._last_line = now
            print(self.status_line(), file=sys.stderr, flush=True)

    def _start_live(self) -> None:
        from rich.live import Live

        console = _console()
        # stdout stays out of the live display: it carries --json output, never for the screen.
        self._live = Live(
            console=console,
            get_renderable=self._render,
            refresh_per_second=4,
            transient=True,
            redirect_stdout=False,
        )
        self._live.start()
        _set_live_console(console)

    def _render(self) -> RenderableType:
        from rich.console import Group

        width = self._live.console.width if self._live else 80
        overall = self._render_overall(width)
        rows = self.rows
        return Group(overall, self._render_rows(rows, width)) if rows else overall

    def _render_overall(self, width: int) -> RenderableType:
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        line = Text(self.status_line())  # too long, it wraps at a space rather than lose the ETA
        if width < 40:
            return line
        # The figures matter more than the bar: it only takes the room they leave.
        bar = ProgressBar(total=self.total, completed=self.done)
        grid = Table.grid(padding=(0, 1))
        grid.add_column(width=max(10, min(30, width - len(line) - 1)))
        grid.add_column()
        grid.add_row(bar, line)
        return grid

    def _render_rows(self, keys: list[str], width: int) -> RenderableType:
        from rich import box
        from rich.table import Table

        cells = [live_cells(self.figures(key), self.unit) for key in keys]
        names = [row_name(key) for key in keys]
        # Figures keep their width (headers may wrap at a space) and names are cut; on a narrow
        # terminal the least needed columns go. Each column takes its width + 2; the name >= 10.
        widths = {
            h: max(len(w) for w in (*h.split(), *(r[h] or "" for r in cells))) for h in cells[0]
        }
        room = width - max(len(g) for g, _ in names) - 17
        grid = Table(box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True)
        grid.add_column("", style="dim", no_wrap=True)
        grid.add_column("", overflow="ellipsis", min_width=10, max_width=40)
        headers = fit_columns(
            shown_columns(cells, ("done", f"{self.unit}/s", "errors")), widths, room
        )
        for header in headers:
            grid.add_column(header, justify="right", min_width=widths[header])
        previous = None
        for (group, name), row in zip(names, cells, strict=True):
            shown_group, previous = ("" if group == previous else group), group
            grid.add_row(shown_group, name, *(row[h] or "" for h in headers))
        return grid

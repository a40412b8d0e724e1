"""Everything a person or a script sees: messages, tables, JSON and progress.

Human output goes to stderr and machine output (``--json``) to stdout, so piping a command's
JSON never picks up progress or warnings. This is the only module that imports rich, and it does
so inside functions: importing it must stay free for commands that never draw anything.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from eagle3kit.errors import UserError

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.live import Live

_MARKS = {True: ("✓", "green"), False: ("✗", "bold red"), None: ("–", "dim")}
# An operator scans a log for errors first, so "errors 0" is worth its place in every line.
_ALWAYS_SHOWN = ("errors",)
# While a live display runs, everything drawn must go through its console: rich lets a second
# console write straight to the terminal, through the bar, instead of above it.
_live_console: Console | None = None


@dataclass
class OutputOptions:
    """The shared output flags; cli.py builds one and every stage config carries it."""

    json: bool = False  # machine output on stdout
    quiet: bool = False  # only warnings and errors on stderr
    no_progress: bool = False  # no live display; plain status lines still appear
    log_every: float = 30.0  # seconds between plain status lines

    def __post_init__(self) -> None:
        if not self.log_every > 0:  # written this way so NaN is refused too
            raise UserError(f"--log-every must be > 0 seconds (got {self.log_every})")


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
        print(msg, file=sys.stderr, flush=True)


def warn(msg: str) -> None:
    """'warning: ...' on stderr, even under --quiet."""
    _tagged("warning", "bold yellow", msg)


def error(msg: str) -> None:
    """'error: ...' on stderr, even under --quiet; callers show no traceback for expected errors."""
    _tagged("error", "bold red", msg)


def print_json(obj: object) -> None:
    """The command's result as indented JSON on stdout, numpy values and odd keys included."""
    import orjson

    flags = orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
    data = orjson.dumps(obj, option=flags | orjson.OPT_APPEND_NEWLINE, default=str)
    sys.stdout.write(data.decode())
    sys.stdout.flush()


def _cell(value: object) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def table(
    title: str, columns: list[str], rows: list[list[object]], opts: OutputOptions | None = None
) -> None:
    """A titled table on stderr; numeric columns are right-aligned so figures line up."""
    if _quiet(opts):
        return
    from rich.table import Table

    grid = Table(title=title, title_justify="left")
    for i, name in enumerate(columns):
        values = [r[i] for r in rows if r[i] is not None]
        numeric = bool(values) and all(isinstance(v, int | float) for v in values)
        grid.add_column(name, justify="right" if numeric else "left")
    for row in rows:
        grid.add_row(*(_cell(v) for v in row))
    _console().print(grid)


def checklist(items: list[tuple[bool | None, str, str]], opts: OutputOptions | None = None) -> None:
    """Numbered '1. ✓ name  detail' lines: True passed, False failed, None skipped."""
    if _quiet(opts) or not items:
        return
    from rich.text import Text

    console = _console()
    num_width = len(str(len(items)))
    name_width = max(len(name) for _, name, _ in items)
    for i, (ok, name, detail) in enumerate(items, 1):
        mark, style = _MARKS[ok]
        line = Text.assemble(f"{i:>{num_width}}. ", (mark, style), f" {name:<{name_width}}")
        if detail:
            line.append(f"  {detail}")
        line.rstrip()  # a name with no detail leaves padding behind
        console.print(line, soft_wrap=True)


def kv(title: str, pairs: list[tuple[str, object]], opts: OutputOptions | None = None) -> None:
    """A title and an aligned 'key  value' block, for info-style summaries."""
    if _quiet(opts):
        return
    from rich.text import Text

    console = _console()
    console.print(Text(title, style="bold"), soft_wrap=True)
    key_width = max((len(k) for k, _ in pairs), default=0)
    for key, value in pairs:
        console.print(Text(f"  {key:<{key_width}}  {_cell(value)}"), soft_wrap=True)


def _si(x: float) -> str:
    """312000 -> '312k': rates are read at a glance, not to the last digit."""
    suffix = ""
    for scale, name in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= scale:
            x, suffix = x / scale, name
            break
    return f"{x:.{0 if x >= 100 else 1 if x >= 10 else 2}f}{suffix}"


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _number(v: float) -> str:
    return f"{int(v):,}" if float(v).is_integer() else f"{v:.3g}"


class Progress:
    """One set of running figures, drawn live on a terminal or logged as plain status lines.

    ``add`` counts finished work and accumulates counters (tokens, errors, retries...);
    ``set`` overwrites gauges (in_flight...). ``initial`` is work finished by an earlier run
    (resume): it counts towards done/total but not towards this run's rate.
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
        self.label, self.total, self.opts, self.unit = label, total, opts, unit
        self.mode = "off"  # "live", "plain" or "off"; chosen on __enter__
        self._clock = clock
        self._initial = self._done = initial
        self._counters: dict[str, float] = {}
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

    def add(self, n: int = 1, **increments: float) -> None:
        """Record n more finished items; each counter grows by its increment."""
        self._done += n
        for name, inc in increments.items():
            self._counters[name] = self._counters.get(name, 0) + inc
        self._tick()

    def set(self, **values: float) -> None:
        """Overwrite gauges that go up and down, such as in_flight."""
        self._counters.update(values)
        self._tick()

    @property
    def done(self) -> int:
        return self._done

    @property
    def counters(self) -> dict[str, float]:
        return dict(self._counters)

    @property
    def elapsed(self) -> float:
        """Seconds since __enter__, frozen at __exit__."""
        end = self._end if self._end is not None else self._clock()
        return max(end - self._start, 0.0)

    @property
    def rate(self) -> float:
        """Items per second done by this run."""
        elapsed = self.elapsed
        return (self._done - self._initial) / elapsed if elapsed > 0 else 0.0

    def status_line(self) -> str:
        """'convert 1,200/5,000 (24.0%) 310 samples/s 312k tok/s errors 0 elapsed 4s ETA 12s'."""
        counters = dict(self._counters)  # one C-level copy: the live thread reads it concurrently
        elapsed, rate, done, total = self.elapsed, self.rate, self._done, self.total
        parts = [self.label]
        if total:
            parts.append(f"{done:,}/{total:,} ({100 * done / total:.1f}%)")
        else:
            parts.append(f"{done:,} {self.unit}")
        parts.append(f"{_si(rate)} {self.unit}/s")
        if "tokens" in counters:
            parts.append(f"{_si(counters['tokens'] / elapsed if elapsed > 0 else 0.0)} tok/s")
        for name, value in {**dict.fromkeys(_ALWAYS_SHOWN, 0.0), **counters}.items():
            if name != "tokens" and (value or name in _ALWAYS_SHOWN):
                parts.append(f"{name} {_number(value)}")
        parts.append(f"elapsed {_duration(elapsed)}")
        if total and rate > 0 and done < total:
            parts.append(f"ETA {_duration((total - done) / rate)}")
        return " ".join(parts)

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
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        line = Text(self.status_line(), no_wrap=True, overflow="ellipsis")
        # The figures matter more than the bar: it only takes the room they leave.
        room = (self._live.console.width if self._live else 80) - len(line) - 1
        if room < 10:
            return line
        grid = Table.grid(padding=(0, 1))
        grid.add_row(ProgressBar(total=self.total, completed=self._done, width=min(room, 30)), line)
        return grid

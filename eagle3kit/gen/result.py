"""What a gen run reports: `GenResult`, shown as a table (and as JSON under --json)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from eagle3kit import _ui
from eagle3kit.gen.config import GenConfig


@dataclass
class GenResult:
    output: str
    total: int
    """Samples the dataset holds for these prompts when the run ends."""
    previously_done: int
    written: int
    truncated: int
    skipped: int
    failed: int
    retries: int
    violations: int
    duplicates: int
    stopped: bool
    """True when a signal stopped the run before everything was done."""
    elapsed: float
    resume_command: str
    filtered: int = 0
    """Stored with a `filtered:` finish reason (e.g. --min-completion-tokens): kept, counted."""
    bad_lines: int = 0
    """Malformed prompt records left out under --skip-bad-lines."""
    generating_s: float = 0.0
    """Seconds from the first request sent to the last answer recorded: `elapsed` less the
    start-up (connecting, checks, opening the dataset) and the final commit (plan uses it)."""
    retried_failed: int = 0
    """Samples an earlier run recorded as skipped:failed that this run tried again."""
    reprobes: int = 0
    """Times a server was probed again (after it went away, dropped a connection, or on the
    periodic check) to see that it still serves the run's model."""
    exit_code: int = 0
    """0, or 130 (SIGINT) / 143 (SIGTERM) when a signal stopped the run."""


def report(result: GenResult, cfg: GenConfig) -> None:
    opts = cfg.output
    if opts.json:
        _ui.print_json(asdict(result))
    _ui.kv(
        "gen",
        [
            ("dataset", result.output),
            (
                "samples",
                f"{result.previously_done + result.written:,}/{result.total:,} "
                f"({result.written:,} this run)",
            ),
            ("truncated", f"{result.truncated:,}"),
            ("filtered", f"{result.filtered:,}"),
            ("skipped", f"{result.skipped:,} ({result.failed:,} failed after retries)"),
            ("retries", f"{result.retries:,}"),
            *(
                [("retried failed", f"{result.retried_failed:,} from an earlier run")]
                if result.retried_failed
                else []
            ),
            ("invariant violations", f"{result.violations:,}"),
            ("duplicate prompts", f"{result.duplicates:,} generated once"),
            *(
                [("malformed prompt lines", f"{result.bad_lines:,} left out")]
                if result.bad_lines
                else []
            ),
            ("elapsed", f"{result.elapsed:.1f}s"),
        ],
        opts,
    )
    if result.stopped:
        _ui.warn(f"stopped before the end; continue with: {result.resume_command}")

"""What one `eagle3kit convert` did, for --json and the caller."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ConvertResult:
    direction: str
    written: int
    skipped_existing: int = 0
    bad_lines: int = 0
    dst: str = ""

"""What one `eagle3kit extract` did (this rank), for --json and the caller."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ExtractResult:
    output: str
    total: int
    """Samples in the token dataset."""
    previously_done: int
    written: int
    skipped: dict[str, str]
    """Sample id -> why it was left out (NaN states, longer than the target's context...)."""
    tokens: int
    """Tokens written by this run (this rank)."""
    elapsed: float
    tokens_per_s: float
    cpu_seconds: float
    """Process CPU time of the extraction (all threads): steadier than elapsed on a busy host."""
    estimate_bytes: int
    free_bytes: int
    codec: str
    layer_ids: list[int]
    dry_run: bool = False
    rank: int = 0
    world: int = 1

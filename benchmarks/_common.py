"""What the benchmark scripts share: where the checkout is, and the way to the helpers they
drive that live beside the tests (the fake servers, the real tokenizers, the fitted drafter):
helper modules of tests/, never a test module. Not a benchmark: it has no command line."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"


def with_test_helpers(*more: Path) -> None:
    """Put tests/ (and `more`, e.g. tests/vllm) and the checkout on sys.path: the helpers, and
    eagle3kit itself when it is not installed."""
    for path in (REPO, TESTS, *more):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))

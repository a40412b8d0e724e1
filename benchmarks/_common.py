"""What the benchmark scripts share: where the checkout is, and the way to the helpers they
drive, which the tests use too (the fake servers, the real tokenizers, the fitted drafter, the
vLLM launcher): the modules of testkit/, never a module of tests/. Not a benchmark: it has no
command line."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTKIT = REPO / "testkit"
DATA = REPO / "tests" / "data"
"""The test data (prompt sets, tokenizer files): read as files, never imported."""


def with_testkit() -> None:
    """Put testkit/ and the checkout on sys.path: the shared helpers, and eagle3kit itself
    when it is not installed."""
    for path in (REPO, TESTKIT):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))

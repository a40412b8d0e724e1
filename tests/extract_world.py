"""extract's tiny world: a tiny target and a token dataset of random ids (`build_tiny`, once
per process), and the helpers its tests run the command with. For the extract, vLLM-extract
and signal tests, and the one-line refusals gen and train check; not a test module."""

from __future__ import annotations

import os
from functools import cached_property
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from eagle3kit._ui import OutputOptions
from eagle3kit.cli import app
from eagle3kit.format import (
    DatasetWriter,
    TokenSample,
)
from eagle3kit.tiny import make_target, make_tokenizer

N_SAMPLES = 24
QUIET = OutputOptions(quiet=True)


def write_tokens(
    path: Path, tokenizer: Path | None, n: int = N_SAMPLES, top: int = 1000, seed: int = 0
) -> Path:
    """A token dataset of `n` random samples (5-60 tokens, ids below `top`)."""
    rng = np.random.default_rng(seed)
    with DatasetWriter(path, config={"stage": "test"}, commit_every=7) as writer:
        if tokenizer is not None:
            writer.store_files("tokenizer", sorted(p for p in tokenizer.iterdir() if p.is_file()))
        for i in range(n):
            length = int(rng.integers(5, 60))
            split = int(rng.integers(1, length))
            ids = rng.integers(0, top, length).tolist()
            writer.add(
                TokenSample(
                    f"s{i:03d}", ids[:split], ids[split:], partition=("math", "code")[i % 2]
                )
            )
    return path


class Tiny:
    """A tokenizer, an 8-layer hidden-64 Llama target and a token dataset; Qwen3 on demand."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.tokenizer = make_tokenizer(root / "tokenizer")
        self.llama = make_target(root / "llama", self.tokenizer, arch="llama")
        self.tokens = write_tokens(root / "tokens", self.tokenizer)

    @cached_property
    def qwen3(self) -> Path:
        return make_target(self.root / "qwen3", self.tokenizer, arch="qwen3", seed=1)


_BUILT: list[Tiny] = []


def build_tiny(factory: pytest.TempPathFactory) -> Tiny:
    """One Tiny per session, whichever test module asks first (test_extract_vllm too)."""
    if not _BUILT:
        _BUILT.append(Tiny(factory.mktemp("extract-tiny")))
    return _BUILT[0]


def cli_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE3KIT_")}
    env["OMP_NUM_THREADS"] = "1"
    return env


def refused(*args: str) -> str:
    """Run the CLI in-process; it must exit 2 with one 'error:' line and no traceback."""
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = [line for line in result.output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in result.output, result.output
    return errors[0]

"""A stop signal can land between any two lines of the writer; what it commits stays whole.

Stages turn SIGTERM into a KeyboardInterrupt raised wherever the main thread is (`_signals`),
and the writer then commits what it holds. CI once caught a SIGTERM inside `add`, after the
sample's tokens were packed and before its partition was counted: close() committed a shard
whose manifest said 441 tokens and whose partitions added up to 432, and the dataset no longer
opened. Here a trace function raises KeyboardInterrupt at the k-th line the writer runs, for
every k through a whole run of adds and commits, and each time the writer is closed as the
stages close it: the dataset must open, verify, hold each sample at most once and read every
one back as it was added.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import pytest
from shardcraft import HIDDEN_LAYOUT, token_samples

from eagle3kit.format import (
    Dataset,
    DatasetWriter,
    HiddenDataset,
    HiddenSample,
    HiddenWriter,
    TokenSample,
)

FORMAT_DIR = str(Path(__file__).resolve().parents[1] / "eagle3kit" / "format")


def hidden_samples(n: int) -> list[HiddenSample]:
    rng = np.random.default_rng(0)
    h, a = HIDDEN_LAYOUT["hidden_size"], len(HIDDEN_LAYOUT["layer_ids"])
    return [
        HiddenSample(
            f"h{i}",
            np.arange(2 + i % 3, dtype=np.int32) + i,
            np.ones(2 + i % 3, np.uint8),
            rng.standard_normal((2 + i % 3, a * h), np.float32),
            rng.standard_normal((2 + i % 3, h), np.float32),
            prompt_len=1,
            partition="a" if i % 2 else "b",
        )
        for i in range(n)
    ]


def interrupt_at_line(k: int, body: Callable[[], None]) -> bool:
    """Run `body`, raising KeyboardInterrupt at the k-th line run inside eagle3kit/format/;
    True when it was raised (False: the body ran fewer than k such lines)."""
    seen = 0

    def local(frame: FrameType, event: str, _arg: Any) -> Any:
        nonlocal seen
        if event == "line":
            seen += 1
            if seen == k:
                raise KeyboardInterrupt
        return local

    def tracer(frame: FrameType, event: str, _arg: Any) -> Any:
        return local if frame.f_code.co_filename.startswith(FORMAT_DIR) else None

    sys.settrace(tracer)
    try:
        body()
    except KeyboardInterrupt:
        return True
    finally:
        sys.settrace(None)
    return False


def token_writer(path: Path) -> DatasetWriter:
    return DatasetWriter(path, commit_every=3, config={"stage": "test"})


def hidden_writer(path: Path) -> DatasetWriter:
    return HiddenWriter(path, layout=HIDDEN_LAYOUT, codec="raw", commit_every=3)


def token_same(got: TokenSample, want: TokenSample) -> bool:
    return (list(got.prompt_ids), list(got.completion_ids), got.partition, got.finish_reason) == (
        list(want.prompt_ids),
        list(want.completion_ids),
        want.partition,
        want.finish_reason,
    )


def hidden_same(got: HiddenSample, want: HiddenSample) -> bool:
    bf16 = np.float32  # stored as bf16: compare at that precision
    return (
        list(got.input_ids) == list(want.input_ids)
        and got.partition == want.partition
        and np.allclose(np.asarray(got.aux, bf16), want.aux, rtol=1e-2, atol=1e-2)
        and np.allclose(np.asarray(got.last, bf16), want.last, rtol=1e-2, atol=1e-2)
    )


KINDS = {
    "tokens": (token_writer, token_samples, Dataset, token_same),
    "hidden": (hidden_writer, hidden_samples, HiddenDataset, hidden_same),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_an_interrupt_at_any_line_of_the_writer_leaves_a_whole_dataset(
    tmp_path: Path, kind: str
) -> None:
    make_writer, make_samples, reader, same = KINDS[kind]
    samples = make_samples(8)
    by_id = {s.sample_id: s for s in samples}
    k, tried = 0, 0
    while True:
        k += 1
        path = tmp_path / f"run{k}"
        writer = make_writer(path)

        def add_all(writer: DatasetWriter = writer) -> None:
            for sample in samples:
                writer.add(sample)

        hit = interrupt_at_line(k, add_all)
        writer.close()  # what `with` does on a KeyboardInterrupt, and every stage with it
        if not hit:
            break
        tried += 1
        ds = reader(path)
        assert ds.verify() == [], f"interrupted at line {k}"
        ids = list(ds.sample_ids())
        assert len(ids) == len(set(ids)), f"interrupted at line {k}: a sample twice"
        for i in range(len(ds)):
            got = ds[i]
            assert same(got, by_id[got.sample_id]), f"interrupted at line {k}: {got.sample_id}"
    assert tried > 100  # every line of 8 adds and their commits was a place to stop

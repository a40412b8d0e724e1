"""Random token samples as a JSONL source for convert, with each one's canonical record to
compare against: for the crash tests and the convert rerun benchmark. Not a test module."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson

from eagle3kit.convert.jsonl import record_to_sample, sample_to_record
from eagle3kit.format import TokenSample

PARTITIONS = ("math", "code", "chat", "tool-use")
FINISH = ("stop", "length", "abort")


def _record(rng: np.random.Generator, i: int) -> dict:
    """One JSONL record; some carry a custom loss mask and the optional provenance keys."""
    total = int(rng.integers(50, 401))
    prompt_len = int(rng.integers(1, total))
    tokens = rng.integers(0, 151_000, total).tolist()
    record: dict = {
        "sample_id": rng.bytes(12).hex(),
        "prompt_ids": tokens[:prompt_len],
        "completion_ids": tokens[prompt_len:],
        "finish_reason": FINISH[int(rng.choice(3, p=[0.8, 0.15, 0.05]))],
        "partition": PARTITIONS[int(rng.integers(len(PARTITIONS)))],
        "metadata": {"line": i, "note": "ünïcode ✓"} if i % 5 == 0 else {"line": i},
    }
    if i % 9 == 0:
        # A mask with loss on a few arbitrary runs, e.g. a multi-turn sample's earlier answers.
        mask = np.zeros(total, np.uint8)
        for start in rng.integers(0, total, 3):
            mask[start : start + int(rng.integers(1, 40))] = 1
        record["loss_mask"] = mask.tolist()
    if i % 4 == 0:
        record["source"] = {"file": "prompts.jsonl", "line": i, "turn": 0}
        record["server"] = {"url": "http://127.0.0.1:30000", "engine": "sglang"}
        record["latency"] = float(rng.uniform(0.1, 90.0))
        record["counts"] = {"cached_tokens": int(rng.integers(0, prompt_len))}
    return record


def canonical(sample: TokenSample) -> dict:
    """A sample as a plain record, the loss mask always dense.

    The reader gives None for a mask equal to the default (completion positions), so a dense
    mask is the only form in which a source line and the stored sample compare exactly.
    """
    record = sample_to_record(sample)
    record["loss_mask"] = sample.dense_loss_mask().tolist()
    return record


def write_source(path: Path, n: int, seed: int) -> dict[str, dict]:
    """Write `n` random samples as JSONL; return their canonical records by id."""
    rng = np.random.default_rng(seed)
    expected: dict[str, dict] = {}
    with open(path, "wb") as f:
        for i in range(n):
            record = _record(rng, i)
            f.write(orjson.dumps(record) + b"\n")
            expected[record["sample_id"]] = canonical(record_to_sample(record))
    assert len(expected) == n, "random ids collided; pick another seed"
    return expected

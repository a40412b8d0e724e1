"""Shards from elsewhere: intact checksums, hostile contents (issue 25, items 10 and 11).

Each dataset here is written by the real writer, then one shard is rewritten with other
contents and both its checksums recomputed, so only the readers' own checks stand between
it and a traceback or an exhausted memory. `eagle3kit info` and `eagle3kit validate` run as
real subprocesses: each case must end in a named problem (info exit 1, validate's integrity
row) and never in a traceback; a decompression bomb must not cost its expanded size.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from shardcraft import Arrays, bomb, rewrite, token_dataset, zst

CLI_TIMEOUT_S = 120
BOMB_BYTES = 512 << 20
"""What the bomb's metadata frame expands to: far past the peak memory the test allows."""
PEAK_RSS_LIMIT_MB = 300


def cli(*args: str | Path) -> tuple[subprocess.CompletedProcess[str], int]:
    """Run eagle3kit under a fresh Python whose only child it is, so the peak resident size
    its getrusage reports is eagle3kit's alone (MiB)."""
    wrapper = (
        "import json, resource, subprocess, sys; "
        "r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
        "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss; "
        "print(json.dumps([r.returncode, r.stdout, r.stderr, peak]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", wrapper, sys.executable, "-m", "eagle3kit", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=True,
    )
    code, out, err, peak_kib = json.loads(done.stdout)
    return subprocess.CompletedProcess(args, code, out, err), peak_kib // 1024


def info_problems(ds: Path) -> list[str]:
    result, _ = cli("info", ds, "--json")
    assert "Traceback" not in result.stderr
    assert result.returncode == 1, result.stderr
    return json.loads(result.stdout)["problems"]


def validate_integrity(ds: Path, code: int = 2) -> str:
    result, _ = cli("validate", ds, "--json")
    assert "Traceback" not in result.stderr
    assert result.returncode == code, result.stderr
    report = json.loads(result.stdout)
    return next(c for c in report["checks"] if c["name"] == "integrity")["detail"]


def _meta(data: bytes) -> Callable[[Arrays, dict], None]:
    return lambda a, m: a.update(meta_zst=zst(data))


def _span_offsets_one_short(a: Arrays, m: dict) -> None:
    a["loss_span_offsets"][-1] -= 1


def _drop_an_id(a: Arrays, m: dict) -> None:
    ids = a["sample_ids"].tobytes().split(b"\n")
    a["sample_ids"] = np.frombuffer(b"\n".join(ids[:-1]), np.uint8)


def _offsets_backwards(a: Arrays, m: dict) -> None:
    a["offsets"][1], a["offsets"][2] = a["offsets"][2], a["offsets"][1]


def _prompt_too_long(a: Arrays, m: dict) -> None:
    a["prompt_lens"][0] = 10_000


def _partition_past_the_list(a: Arrays, m: dict) -> None:
    a["partition_index"][1] = 7


def _span_outside(a: Arrays, m: dict) -> None:
    a["loss_spans"][0] = [-3, 2]


def _tokens_as_floats(a: Arrays, m: dict) -> None:
    a["tokens"] = a["tokens"].astype(np.float32)


INCONSISTENT: dict[str, tuple[Callable[[Arrays, dict], None], str]] = {
    # name: (the edit, what the problem says)
    "span offsets one short": (_span_offsets_one_short, "loss span offsets do not cover"),
    "metadata not JSON": (_meta(b'[{"finish_reason": "stop"}'), "metadata is not JSON"),
    "metadata not objects": (_meta(b"[1, 2, 3, 4]"), "sample 0's metadata is not an object"),
    "metadata one short": (
        _meta(b'[{"finish_reason": "stop"}]'),
        "metadata is not a list of 4 objects",
    ),
    "metadata field of the wrong type": (
        _meta(b"[" + b",".join([b'{"finish_reason": "stop", "metadata": 5}'] * 4) + b"]"),
        "sample 0's metadata has a metadata that is int",
    ),
    "a sample id missing": (_drop_an_id, "holds 3 sample ids for 4 samples"),
    "offsets not ascending": (_offsets_backwards, "offsets do not cover"),
    "prompt longer than its sample": (_prompt_too_long, "prompt length is negative or longer"),
    "partition index past the list": (_partition_past_the_list, "partition index points past"),
    "loss span outside its sample": (_span_outside, "a loss span lies outside its sample"),
    "tokens of another dtype": (_tokens_as_floats, "tensor 'tokens' is F32"),
}


@pytest.mark.parametrize("case", INCONSISTENT)
def test_inconsistent_contents_are_named_problems(tmp_path: Path, case: str) -> None:
    edit, says = INCONSISTENT[case]
    ds = token_dataset(tmp_path / "ds")
    shard = rewrite(ds, 1, edit)

    problems = info_problems(ds)
    assert len(problems) == 1 and str(shard) in problems[0] and says in problems[0], problems
    detail = validate_integrity(ds)
    assert str(shard) in detail and says in detail, detail


def test_a_sample_id_in_two_shards_is_a_problem_for_info(tmp_path: Path) -> None:
    ds = token_dataset(tmp_path / "ds")

    def reuse_an_id(a: Arrays, m: dict) -> None:
        ids = a["sample_ids"].tobytes().split(b"\n")
        a["sample_ids"] = np.frombuffer(b"\n".join([b"s000", *ids[1:]]), np.uint8)

    shard = rewrite(ds, 2, reuse_an_id)
    problems = info_problems(ds)
    assert len(problems) == 1 and str(shard) in problems[0], problems
    assert "sample id 's000' is also in" in problems[0]
    # validate's integrity row counts it as a duplicate; its other checks still run.
    assert "duplicate sample ids" in validate_integrity(ds, code=1)


@pytest.mark.parametrize("stated", [True, False], ids=["size-stated", "size-unstated"])
def test_a_metadata_decompression_bomb_is_refused_within_bounded_memory(
    tmp_path: Path, stated: bool
) -> None:
    """The issue's reproduction: the metadata frame is valid JSON padded with whitespace,
    checksums recomputed; info used to expand all of it (2.1 GB) and report no problem."""
    ds = token_dataset(tmp_path / "ds")
    objects = b"[" + b",".join([b'{"finish_reason": "stop"}'] * 4) + b"]"
    frame = bomb(objects, BOMB_BYTES, stated)
    assert len(frame) < BOMB_BYTES // 1000
    shard = rewrite(ds, 1, lambda a, m: a.update(meta_zst=frame))

    for command in ("info", "validate"):
        result, peak_mb = cli(command, ds, "--json")
        assert "Traceback" not in result.stderr
        assert peak_mb < PEAK_RSS_LIMIT_MB, (command, peak_mb)
        assert result.returncode == (1 if command == "info" else 2), result.stderr
        shown = result.stdout
        assert str(shard) in shown and "metadata frame decompresses past its bound of" in shown


def test_the_writer_refuses_metadata_past_the_readers_bound(tmp_path: Path) -> None:
    """Readers bound the metadata frame by a share per sample and per token: the writer
    refuses a sample beyond its share, so it never writes a shard readers refuse."""
    from eagle3kit.format import DatasetWriter, TokenSample

    with DatasetWriter(tmp_path / "ds", config={"stage": "test"}) as writer:
        writer.add(TokenSample("ok", [1] * 100, [2], metadata={"text": "x" * 70_000}))
        with pytest.raises(ValueError, match="over the format's limit of"):
            writer.add(TokenSample("big", [1], [2], metadata={"text": "x" * 70_000}))

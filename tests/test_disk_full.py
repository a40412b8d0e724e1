"""A disk that fills up during `eagle3kit convert`: a clear error, nothing committed lost.

A real full disk cannot be arranged in a test, but RLIMIT_FSIZE gives the same failure at a
chosen size: once a write would make any one file larger than the limit, write() fails with
EFBIG (SIGXFSZ is ignored, so the process is not killed instead). The limit is set in the
child only, so the kernel, not a mock, fails the write, at whatever point the format code has
reached: sealing a shard, committing the manifest, or setting the dataset up.

Each case holds the CLI to DESIGN.md's promise: exit 2 with one `error:` line that says there
is no space and names the file, no traceback; the dataset still opens and verifies with every
sample committed before the failure; the same command without the limit then completes with
every source sample exactly once, and no debris is left behind.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pytest
from file_limits import limit_file_size

from eagle3kit.format import Dataset, is_dataset
from eagle3kit.format.layout import MANIFEST, OWNER, SHARD_DIR

CLI_TIMEOUT_S = 120


def convert(
    src: Path, dst: Path, *flags: str, limit: int | None = None
) -> subprocess.CompletedProcess[str]:
    # stdout and stderr are pipes, not files, so the limit never applies to them.
    return subprocess.run(
        [sys.executable, "-m", "eagle3kit", "convert", str(src), str(dst), "--no-progress", *flags],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        preexec_fn=None if limit is None else limit_file_size(limit),
    )


@dataclass
class Case:
    records: list[dict]
    flags: tuple[str, ...]
    limit: int
    failing_file: Callable[[Path], Path | None]
    """The file the error names, given the dataset dir (None: any shard)."""
    committed: int | None
    """Samples committed when the limit hits, when the case makes that exact."""
    orphans: int
    """Sealed shards the failure leaves uncommitted (ignored, then removed by the rerun)."""


def _record(i: int, n_completion: int) -> dict:
    return {
        "sample_id": f"s-{i:05d}",
        "prompt_ids": [1000 + i, 7, 8, 9],
        "completion_ids": [(i * 31 + k) % 150_000 for k in range(n_completion)],
        "partition": "long" if n_completion > 100 else "short",
    }


def _shard_case() -> Case:
    # 30 small samples fit in 3 small shards; the 4th shard holds 10 samples of 2,000 tokens
    # (~80 KB) and passes the 40 KB limit halfway through sealing it.
    records = [_record(i, 8) for i in range(30)] + [_record(i, 2000) for i in range(30, 60)]
    return Case(records, ("--commit-every", "10"), 40_000, lambda dst: None, 30, 0)


def _manifest_case() -> Case:
    # Shards stay under 1 KB, but each commit adds an entry to the manifest, which outgrows
    # the limit after a dozen commits: the shard is sealed, its commit fails.
    records = [_record(i, 5) for i in range(100)]
    return Case(records, ("--commit-every", "2"), 8_000, lambda dst: dst / MANIFEST, None, 1)


def _setup_case() -> Case:
    # Not even the owner file fits: the run fails before the dataset exists.
    records = [_record(i, 5) for i in range(10)]
    return Case(records, (), 64, lambda dst: dst / OWNER, 0, 0)


CASES = {
    "sealing a shard": _shard_case,
    "committing the manifest": _manifest_case,
    "creating the dataset": _setup_case,
}


def _write_source(path: Path, records: list[dict]) -> None:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))


def _assert_holds_exactly(dst: Path, records: list[dict]) -> None:
    """The dataset verifies clean and holds these records, in order, each once."""
    ds = Dataset(dst)
    assert ds.verify() == []
    ids = list(ds.sample_ids())
    assert ids == [r["sample_id"] for r in records]
    assert len(set(ids)) == len(ids)
    for i, record in enumerate(records):
        sample = ds[i]
        assert sample.sample_id == record["sample_id"]
        assert np.array_equal(sample.prompt_ids, record["prompt_ids"])
        assert np.array_equal(sample.completion_ids, record["completion_ids"])
        assert sample.partition == record["partition"]


def _assert_one_clear_error(
    result: subprocess.CompletedProcess[str], file: Path | None, dst: Path
) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert "no space left" in errors[0]
    assert "rerun the same command" in errors[0]  # says what to do about it
    if file is None:
        assert f"{dst / SHARD_DIR}/" in errors[0] and ".safetensors" in errors[0]
    else:
        assert f"error: {file}: " in errors[0]


@pytest.mark.parametrize("where", CASES)
def test_disk_full_loses_nothing_and_the_rerun_completes(tmp_path: Path, where: str):
    case = CASES[where]()
    src, dst = tmp_path / "src.jsonl", tmp_path / "ds"
    _write_source(src, case.records)

    failed = convert(src, dst, *case.flags, limit=case.limit)
    _assert_one_clear_error(failed, case.failing_file(dst), dst)

    committed = 0
    if is_dataset(dst):
        ds = Dataset(dst)
        committed = len(ds)
        assert 0 < committed < len(case.records)
        # Commits are whole: a commit_every multiple of samples, all from the start.
        assert committed % int(case.flags[1]) == 0
        _assert_holds_exactly(dst, case.records[:committed])
        temps, orphans = ds.stray_files()
        assert temps == []  # a failed write removes its own temp file
        assert len(orphans) == case.orphans
    if case.committed is not None:
        assert committed == case.committed

    # Still full: the same command fails the same clear way and loses nothing more.
    again = convert(src, dst, *case.flags, limit=case.limit)
    assert again.returncode == 2 and "Traceback" not in again.stderr
    assert "no space left" in again.stderr
    if is_dataset(dst):
        assert len(Dataset(dst)) >= committed
        assert Dataset(dst).verify() == []

    # Space freed: the same command finishes the job, each sample exactly once.
    done = convert(src, dst, *case.flags, "--json")
    assert done.returncode == 0, done.stderr
    result = orjson.loads(done.stdout)
    assert result["bad_lines"] == 0
    assert result["written"] + result["skipped_existing"] == len(case.records)
    _assert_holds_exactly(dst, case.records)
    assert Dataset(dst).stray_files() == ([], [])


def test_disk_full_while_exporting_leaves_no_partial_file(tmp_path: Path):
    """The other direction: a dataset to JSONL. The partial file must not stay behind looking
    like a finished export, and the error is one line, not an OSError traceback."""
    src, dst = tmp_path / "src.jsonl", tmp_path / "ds"
    records = [_record(i, 200) for i in range(50)]
    _write_source(src, records)
    assert convert(src, dst).returncode == 0
    out = tmp_path / "export.jsonl"

    failed = convert(dst, out, limit=20_000)  # the export is ~45 KB
    _assert_one_clear_error(failed, out, dst)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "src.jsonl"]

    assert convert(dst, out).returncode == 0
    assert out.read_bytes().count(b"\n") == len(records)

    unwritable = convert(dst, tmp_path / "no-such-dir" / "export.jsonl")
    assert unwritable.returncode == 2 and "Traceback" not in unwritable.stderr
    assert f"error: {tmp_path / 'no-such-dir' / 'export.jsonl'}: cannot write" in unwritable.stderr

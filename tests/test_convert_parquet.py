"""`eagle3kit convert DS FILE.parquet` and back: token samples as Parquet, where data tools
read them.

Through the real command (a subprocess): a dataset with every optional field goes to Parquet
and back to a second dataset whose JSONL export is byte-identical to the first's; the
Parquet file opens in `datasets.load_dataset("parquet", ...)` and pandas with the JSONL
record's columns and values; a Parquet file that `datasets` itself writes imports to the same
samples; a bad row stops the import naming the file and the row (the rows before it
committed, `--skip-bad-lines` skips and counts it, a rerun continues after the committed
rows); `--partition` exports one partition; and a missing pyarrow is one line naming the
extra to install.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from parquetcraft import BOMB_IDS, bomb_file, ids_bomb_table, write_groups

from eagle3kit.format import MAX_SAMPLE_TOKENS, Dataset, DatasetWriter, TokenSample

CLI_TIMEOUT_S = 60
MEMORY_CAP = 1 << 30
"""Address space for a convert of a Parquet bomb: main needed more than 2 GiB for the
issue's file (a MemoryError traceback under that cap), a healthy import needs under 600 MiB."""
JSON_COLUMNS = ("metadata", "source", "server", "counts")
COLUMNS = [
    "sample_id",
    "prompt_ids",
    "completion_ids",
    "finish_reason",
    "partition",
    "metadata",
    "loss_mask",
    "source",
    "server",
    "latency",
    "counts",
]


def run_cli(*args: str | Path, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "eagle3kit", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        env=env,
    )


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def run_capped(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """The real command with its address space capped at MEMORY_CAP."""
    return subprocess.run(
        [sys.executable, "-m", "eagle3kit", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        preexec_fn=_cap_memory,
    )


def stored_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def ok(*args: str | Path) -> subprocess.CompletedProcess[str]:
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr
    return result


def the_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def _samples() -> list[TokenSample]:
    """Every optional field present somewhere and absent elsewhere, nested metadata, empty
    prompts and completions, non-ASCII partitions, ids near the int32 limit."""
    out = []
    for i in range(13):
        prompt = [] if i == 4 else [1, 2, 2**31 - 1 - i]
        completion = [] if i == 5 else [7 + i, 8, 9]
        out.append(
            TokenSample(
                f"s-{i}",
                prompt,
                completion,
                finish_reason=["stop", "length", ""][i % 3],
                partition=["a", "ç", "数学"][i % 3],
                loss_mask=[1] * len(prompt) + [0] * len(completion) if i % 4 == 0 else None,
                source={"file": "p.jsonl", "line": i} if i % 2 else None,
                server={"url": "http://x", "temperature": 0.6} if i % 3 == 0 else None,
                latency=0.125 * i if i % 5 else None,
                counts={"reasoning": i} if i == 7 else None,
                metadata={"i": i, "nested": {"list": [1, 2.5, None, "ü"]}, "big": 2**62},
            )
        )
    return out


@pytest.fixture
def ds(tmp_path: Path) -> Path:
    with DatasetWriter(tmp_path / "ds", commit_every=4) as writer:
        for sample in _samples():
            writer.add(sample)
    return tmp_path / "ds"


def jsonl_records(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_round_trip_is_lossless_and_datasets_and_pandas_read_it(tmp_path: Path, ds: Path):
    import datasets
    import pandas as pd

    out = tmp_path / "ds.parquet"
    assert "wrote 13 samples" in ok("convert", ds, out).stderr
    assert not list(tmp_path.glob("*.tmp"))  # written beside and renamed over
    ok("convert", out, tmp_path / "ds2")
    ok("convert", ds, tmp_path / "a.jsonl")
    ok("convert", tmp_path / "ds2", tmp_path / "b.jsonl")
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()

    records = jsonl_records(tmp_path / "a.jsonl")
    loaded = datasets.load_dataset(
        "parquet", data_files=str(out), split="train", cache_dir=str(tmp_path / "hf-cache")
    )
    assert loaded.column_names == COLUMNS
    assert len(loaded) == len(records) == 13
    for row, want in zip(loaded, records, strict=True):
        got = {
            k: (orjson.loads(v) if k in JSON_COLUMNS and v is not None else v)
            for k, v in row.items()
            if v is not None
        }
        assert got == want

    frame = pd.read_parquet(out)
    assert list(frame.columns) == COLUMNS
    assert frame["sample_id"].tolist() == [r["sample_id"] for r in records]
    assert [list(ids) for ids in frame["completion_ids"]] == [r["completion_ids"] for r in records]
    assert frame["partition"].tolist() == [r["partition"] for r in records]


def test_a_parquet_file_written_by_datasets_imports_to_the_same_samples(tmp_path: Path, ds: Path):
    import datasets

    ok("convert", ds, tmp_path / "a.jsonl")
    records = jsonl_records(tmp_path / "a.jsonl")
    rows = [{k: r.get(k) for k in COLUMNS} for r in records]
    for row in rows:
        for key in JSON_COLUMNS:
            row[key] = None if row[key] is None else orjson.dumps(row[key]).decode()
    features = datasets.Features(
        {
            "sample_id": datasets.Value("string"),
            "prompt_ids": datasets.Sequence(datasets.Value("int64")),
            "completion_ids": datasets.Sequence(datasets.Value("int64")),
            "finish_reason": datasets.Value("string"),
            "partition": datasets.Value("string"),
            "metadata": datasets.Value("string"),
            "loss_mask": datasets.Sequence(datasets.Value("int64")),
            "source": datasets.Value("string"),
            "server": datasets.Value("string"),
            "latency": datasets.Value("float64"),
            "counts": datasets.Value("string"),
        }
    )
    datasets.Dataset.from_list(rows, features=features).to_parquet(tmp_path / "hf.parquet")

    ok("convert", tmp_path / "hf.parquet", tmp_path / "ds2")
    ok("convert", tmp_path / "ds2", tmp_path / "b.jsonl")
    assert (tmp_path / "b.jsonl").read_bytes() == (tmp_path / "a.jsonl").read_bytes()


def _rows_with_a_bad_one(path: Path, bad_at: int, **bad: object) -> Path:
    rows = [
        {"sample_id": f"id-{i}", "prompt_ids": [1, 2], "completion_ids": [3, i]} for i in range(10)
    ]
    rows[bad_at].update(bad)
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=3)
    return path


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ({"sample_id": "id-\x1b[2J"}, "sample_id holds a control character"),
        ({"completion_ids": [3, -1]}, "completion_ids holds a negative token id (-1)"),
    ],
)
def test_a_bad_row_is_refused_naming_file_and_row_keeping_the_rows_before(
    tmp_path: Path, bad: dict, why: str
):
    src = _rows_with_a_bad_one(tmp_path / "rows.parquet", 6, **bad)
    dst = tmp_path / "ds"

    message = the_error(run_cli("convert", src, dst, "--commit-every", 2))
    assert message.startswith(f"error: {src}: row 6 (counting from 0): {why}"), message
    assert "--skip-bad-lines" in message
    assert list(Dataset(dst).sample_ids()) == [f"id-{i}" for i in range(6)]

    # The rerun continues after the committed rows and skips the bad one when told to.
    result = run_cli("convert", src, dst, "--skip-bad-lines")
    assert result.returncode == 0, result.stderr
    assert "3 samples added, 6 already there, 9 in the dataset" in result.stderr
    assert f"{src}: skipped 1 malformed rows" in result.stderr
    ds = Dataset(dst)
    assert ds.verify() == []
    assert list(ds.sample_ids()) == [f"id-{i}" for i in range(10) if i != 6]


def test_a_parquet_bomb_is_refused_by_row_before_it_is_decoded(tmp_path: Path):
    # The file: one row declaring 20 M ids, a run of one id that zstd and RLE keep
    # in a few bytes. Main decoded it whole (1.1 GB; a MemoryError traceback under a 2 GiB
    # cap, "cannot read the Parquet data" under 1 GiB) or stored an 80 MB dataset.
    src = bomb_file(tmp_path / "bomb.parquet")
    assert src.stat().st_size < 4096
    dst = tmp_path / "ds"

    message = the_error(run_capped("convert", src, dst, "--commit-every", 1))
    assert message.startswith(
        f"error: {src}: row 2 (counting from 0): its row group declares {BOMB_IDS:,} values "
        f"in completion_ids, more than a sample may hold ({MAX_SAMPLE_TOKENS:,} tokens each) "
        "(use --skip-bad-lines"
    ), message
    assert list(Dataset(dst).sample_ids()) == ["id-0", "id-1"]

    result = run_capped("convert", src, dst, "--skip-bad-lines")
    assert result.returncode == 0, result.stderr
    assert f"{src}: skipped 1 malformed rows" in result.stderr
    assert list(Dataset(dst).sample_ids()) == ["id-0", "id-1", "id-3", "id-4"]
    assert stored_bytes(dst) < 1 << 20


def test_a_row_over_the_bound_among_others_is_refused_before_python_sees_it(tmp_path: Path):
    # Three rows in one row group, the middle one past the bound: the group may hold that
    # many ids in all, so it is decoded (in Arrow) and the row refused by its size; its
    # neighbours are stored. Main stored a 3 M-token sample.
    src = write_groups(
        tmp_path / "rows.parquet", [ids_bomb_table(0, [2, MAX_SAMPLE_TOKENS + 1, 2])]
    )
    dst = tmp_path / "ds"
    message = the_error(run_capped("convert", src, dst))
    assert message.startswith(
        f"error: {src}: row 1 (counting from 0): {MAX_SAMPLE_TOKENS + 3:,} tokens, more than "
        f"a sample may hold ({MAX_SAMPLE_TOKENS:,})"
    ), message

    result = run_capped("convert", src, dst, "--skip-bad-lines")
    assert result.returncode == 0, result.stderr
    assert list(Dataset(dst).sample_ids()) == ["id-0", "id-2"]
    assert stored_bytes(dst) < 1 << 20


def test_the_writer_refuses_a_sample_past_the_bound(tmp_path: Path):
    with DatasetWriter(tmp_path / "ds") as writer:
        ids = np.zeros(MAX_SAMPLE_TOKENS, np.int32)
        with pytest.raises(
            ValueError,
            match=f"sample long: {MAX_SAMPLE_TOKENS + 1:,} tokens, more than a sample may hold",
        ):
            writer.add(TokenSample("long", ids, [1]))
        writer.add(TokenSample("at-the-bound", ids[:-1], [1]))
    assert list(Dataset(tmp_path / "ds").sample_ids()) == ["at-the-bound"]


def test_not_a_parquet_file_is_one_line(tmp_path: Path):
    src = tmp_path / "rows.parquet"
    src.write_bytes(b"not parquet at all\n")
    message = the_error(run_cli("convert", src, tmp_path / "ds"))
    assert message.startswith(f"error: {src}: not a readable Parquet file"), message
    assert not (tmp_path / "ds").exists()


ABORTING = Path(__file__).parent / "data" / "parquet" / "aborting_metadata.parquet"


def test_a_file_whose_metadata_aborts_pyarrow_is_one_line(tmp_path: Path):
    # pyarrow itself dies on this file's metadata (no Python error to catch) ...
    walk = (
        "import pyarrow.parquet as pq, sys; m = pq.ParquetFile(sys.argv[1]).metadata\n"
        "[m.row_group(g).column(c) for g in range(m.num_row_groups)"
        " for c in range(m.row_group(g).num_columns)]"
    )
    died = subprocess.run([sys.executable, "-c", walk, ABORTING], capture_output=True, text=True)
    assert died.returncode < 0 and "histogram size mismatch" in died.stderr, died
    # ... and the import names the file and the chunk in one line, leaving nothing behind
    # (nothing else on stderr: not the C++ runtime's words, nor faulthandler's dump).
    loud = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    for skip in ((), ("--skip-bad-lines",)):
        result = run_cli("convert", ABORTING, tmp_path / "ds", *skip, env=loud)
        message = the_error(result)
        assert result.stderr.strip() == message, result.stderr
        assert message == (
            f"error: {ABORTING}: not a readable Parquet file (the Parquet reader aborts on the "
            "metadata of row group 0, column 4: the file is damaged)"
        ), message
        assert not (tmp_path / "ds").exists()


def test_partition_export_holds_only_that_partition(tmp_path: Path, ds: Path):
    out = tmp_path / "c.parquet"
    ok("convert", ds, out, "--partition", "ç")
    table = pq.read_table(out)
    assert table.column_names == COLUMNS
    assert table.column("partition").to_pylist() == ["ç"] * 4
    assert table.column("sample_id").to_pylist() == ["s-1", "s-4", "s-7", "s-10"]
    message = the_error(run_cli("convert", ds, tmp_path / "d.parquet", "--partition", "zz"))
    assert message.startswith("error: --partition zz: not in"), message
    assert not (tmp_path / "d.parquet").exists()


def test_without_pyarrow_the_error_names_the_extra(tmp_path: Path, ds: Path):
    # A pyarrow package that fails to import stands in for one that is not installed.
    fake = tmp_path / "nopyarrow" / "pyarrow"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named pyarrow')\n")
    import os

    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(fake.parent), os.environ.get("PYTHONPATH", "")]),
    }
    message = the_error(run_cli("convert", ds, tmp_path / "x.parquet", env=env))
    assert message == (
        "error: Parquet needs pyarrow, which is not installed: pip install 'eagle3kit[hf]'"
    )
    assert not (tmp_path / "x.parquet").exists()

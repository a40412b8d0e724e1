"""`eagle3kit convert` on bad input and misuse: one clear line, exit 2, nothing lost.

DESIGN.md: "user mistakes and bad inputs end with one clear message naming the flag or the
file and line, and a non-zero exit; no traceback. Nothing already written is lost." These
tests run the real command (a subprocess, so a stray traceback cannot hide) and check the
message, the exit status and what the dataset holds afterwards: a malformed JSONL line stops
the import at `file:line` with the samples before it committed, `--skip-bad-lines` skips and
counts such lines, and the open-mode flags (`--resume`, `--force`, `--overwrite`) and other
misuse are refused by name before anything is written.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import orjson
import prewarmed
import pytest

from eagle3kit.format import Dataset, is_dataset
from eagle3kit.format.layout import MANIFEST, SHARD_DIR

CLI_TIMEOUT_S = 60
COMMIT_EVERY = 2
GOOD_BEFORE = 5  # good lines before the bad one: two whole commits and one pending sample


def run_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prewarmed.argv(), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
    )


def the_error(result: subprocess.CompletedProcess[str]) -> str:
    """The single `error:` line of a failed run, after checking it failed cleanly with 2."""
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def record(i: int, **changes: object) -> dict:
    out: dict = {
        "sample_id": f"id-{i:04d}",
        "prompt_ids": [1, 2, 3 + i],
        "completion_ids": [10 + i, 11, 12],
        "partition": "p" if i % 2 else "q",
    }
    out.update(changes)
    return out


def line(value: object) -> bytes:
    return orjson.dumps(value)


def write_lines(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"".join(x + b"\n" for x in lines))
    return path


def ids_in(dst: Path) -> list[str]:
    ds = Dataset(dst)
    assert ds.verify() == []
    return list(ds.sample_ids())


# Malformed lines ---------------------------------------------------------------------------
# name: (the bad line, a fragment the message must hold to say what is wrong)
BAD_LINES: dict[str, tuple[bytes, str]] = {
    # One line number, the file's: orjson's own "line 2 column 1" (it counts the newline) is
    # not passed on; the column is that of the line.
    "not JSON": (
        b'{"sample_id": "x", "prompt_ids": [1,',
        "invalid JSON (unexpected end of data at column 37)",
    ),
    "not an object": (b"[1, 2, 3]", "expected a JSON object"),
    "missing prompt_ids": (line({"sample_id": "x", "completion_ids": [1]}), "missing prompt_ids"),
    "ids are strings": (
        line(record(99, prompt_ids=[1, "2"])),
        "prompt_ids must be a list of integers",
    ),
    "ids are floats": (
        line(record(99, completion_ids=[1.5])),
        "completion_ids must be a list of integers",
    ),
    "ids are booleans": (
        line(record(99, completion_ids=[True])),
        "completion_ids must be a list of integers",
    ),
    "id above int32": (line(record(99, completion_ids=[5, 2**31])), "2147483648"),
    "id below int32": (line(record(99, prompt_ids=[-(2**31) - 1])), "-2147483649"),
    # orjson reads integers past 64 bits as floats; they must not slip through as ids.
    "id beyond 64 bits": (
        b'{"sample_id": "x", "prompt_ids": [1], '
        b'"completion_ids": [123456789012345678901234567890]}',
        "completion_ids must be a list of integers",
    ),
    "loss_mask too short": (
        line(record(99, loss_mask=[0, 0, 1])),
        "loss_mask has 3 entries for 6 tokens",
    ),
    "loss_mask not 0/1": (line(record(99, loss_mask=[0, 0, 0, 1, 2, 1])), "only 0 and 1"),
    "unknown key": (line(record(99, completions=[1])), "unknown keys completions"),
    "empty sample_id": (line(record(99, sample_id="")), "sample_id must be a non-empty"),
    "latency a string": (line(record(99, latency="3s")), "latency must be a number"),
    "metadata a list": (line(record(99, metadata=[1])), "metadata must be a JSON object"),
}


@pytest.mark.parametrize("kind", BAD_LINES)
def test_a_malformed_line_stops_at_file_and_line_keeping_what_came_before(
    tmp_path: Path, kind: str
):
    bad, why = BAD_LINES[kind]
    good = [record(i) for i in range(10)]
    # A blank line before the bad one: line numbers are the file's, not the record count's.
    lines = [line(r) for r in good[:3]] + [b""] + [line(r) for r in good[3:GOOD_BEFORE]]
    lines += [bad] + [line(r) for r in good[GOOD_BEFORE:]]
    src = write_lines(tmp_path / "src.jsonl", lines)
    bad_lineno = GOOD_BEFORE + 2
    dst = tmp_path / "ds"

    message = the_error(run_cli("convert", src, dst, "--commit-every", COMMIT_EVERY))
    assert message.startswith(f"error: {src}:{bad_lineno}: "), message
    assert why in message
    assert not re.search(r"\bline \d", message), message  # no second, other line number
    assert "--skip-bad-lines" in message  # says how to get past it
    # Every sample before the bad line is committed, the one still pending included.
    assert ids_in(dst) == [r["sample_id"] for r in good[:GOOD_BEFORE]]

    # The same command with --skip-bad-lines finishes, counting the line it skipped.
    done = run_cli(
        "convert", src, dst, "--commit-every", COMMIT_EVERY, "--skip-bad-lines", "--json"
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["bad_lines"] == 1
    assert result["skipped_existing"] == GOOD_BEFORE
    assert result["written"] == len(good) - GOOD_BEFORE
    assert f"{src}: skipped 1 malformed lines" in done.stderr
    assert ids_in(dst) == [r["sample_id"] for r in good]


def test_skip_bad_lines_counts_every_kind_and_keeps_every_good_line(tmp_path: Path):
    lines: list[bytes] = []
    expected: list[dict] = []
    for i, (bad, _) in enumerate(BAD_LINES.values()):
        good = record(i, loss_mask=[1, 0, 1, 0, 1, 1]) if i % 3 == 0 else record(i)
        expected.append(good)
        lines += [line(good), bad]
    src = write_lines(tmp_path / "src.jsonl", lines)
    dst = tmp_path / "ds"

    done = run_cli("convert", src, dst, "--skip-bad-lines", "--json", "--commit-every", "3")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    result = json.loads(done.stdout)
    assert result == {
        "direction": "import",
        "written": len(expected),
        "skipped_existing": 0,
        "bad_lines": len(BAD_LINES),
        "dst": str(dst),
    }
    ds = Dataset(dst)
    assert [s.sample_id for s in ds] == [r["sample_id"] for r in expected]
    for sample, want in zip(ds, expected, strict=True):
        # A rejected line leaves nothing behind: its neighbours' tokens and masks are intact.
        assert np.array_equal(sample.prompt_ids, want["prompt_ids"])
        assert np.array_equal(sample.completion_ids, want["completion_ids"])
        if "loss_mask" in want:
            assert np.array_equal(sample.dense_loss_mask(), want["loss_mask"])


# Open modes and misuse ---------------------------------------------------------------------
@pytest.fixture
def src(tmp_path: Path) -> Path:
    return write_lines(tmp_path / "src.jsonl", [line(record(i)) for i in range(6)])


def test_rerunning_the_same_command_adds_nothing_twice(tmp_path: Path, src: Path):
    dst = tmp_path / "ds"
    assert run_cli("convert", src, dst).returncode == 0
    again = run_cli("convert", src, dst, "--json")
    assert again.returncode == 0
    assert json.loads(again.stdout)["skipped_existing"] == 6
    resumed = run_cli("convert", src, dst, "--resume", "--json")
    assert resumed.returncode == 0 and json.loads(resumed.stdout)["written"] == 0
    assert len(ids_in(dst)) == 6


def test_resume_without_a_dataset_names_resume(tmp_path: Path, src: Path):
    dst = tmp_path / "nothing-here"
    message = the_error(run_cli("convert", src, dst, "--resume"))
    assert "--resume" in message and str(dst) in message
    assert not dst.exists()  # a refused resume creates nothing


def test_resume_and_overwrite_exclude_each_other(tmp_path: Path, src: Path):
    message = the_error(run_cli("convert", src, tmp_path / "ds", "--resume", "--overwrite"))
    assert "--resume" in message and "--overwrite" in message
    assert not (tmp_path / "ds").exists()


def test_another_source_is_refused_naming_force_then_force_continues(tmp_path: Path, src: Path):
    dst = tmp_path / "ds"
    assert run_cli("convert", src, dst).returncode == 0
    manifest_before = (dst / MANIFEST).read_bytes()
    other = write_lines(tmp_path / "other.jsonl", [line(record(i)) for i in range(4, 9)])

    message = the_error(run_cli("convert", other, dst))
    assert "--force" in message and "--overwrite" in message
    assert src.name in message and other.name in message  # it shows what changed
    # A refused run leaves the dataset exactly as it was, manifest included.
    assert (dst / MANIFEST).read_bytes() == manifest_before
    assert len(ids_in(dst)) == 6

    forced = run_cli("convert", other, dst, "--force", "--json")
    assert forced.returncode == 0, forced.stderr
    result = json.loads(forced.stdout)
    assert (result["written"], result["skipped_existing"]) == (3, 2)  # ids 4, 5 are there
    assert ids_in(dst) == [f"id-{i:04d}" for i in range(9)]
    manifest = json.loads((dst / MANIFEST).read_text())
    assert manifest["config"]["source"].endswith(other.name)
    assert manifest["config_history"][-1]["source"].endswith(src.name)


def test_overwrite_starts_afresh(tmp_path: Path, src: Path):
    dst = tmp_path / "ds"
    assert run_cli("convert", src, dst, "--commit-every", "2").returncode == 0
    old_shards = set((dst / SHARD_DIR).iterdir())
    other = write_lines(tmp_path / "other.jsonl", [line(record(i)) for i in range(100, 103)])

    done = run_cli("convert", other, dst, "--overwrite", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["written"] == 3
    assert ids_in(dst) == [f"id-{i:04d}" for i in range(100, 103)]
    assert not old_shards & set((dst / SHARD_DIR).iterdir())  # the old shards are gone
    manifest = json.loads((dst / MANIFEST).read_text())
    assert manifest["config"]["source"].endswith(other.name)
    assert manifest["config_history"] == []  # a new dataset, not a continued one


def test_a_directory_that_is_not_a_dataset_is_refused(tmp_path: Path, src: Path):
    dst = tmp_path / "precious"
    dst.mkdir()
    (dst / "notes.txt").write_text("keep me")
    for flags in ((), ("--overwrite",)):  # not even --overwrite may take it over
        message = the_error(run_cli("convert", src, dst, *flags))
        assert str(dst) in message and "notes.txt" in message
        assert "not an eagle3kit dataset" in message
    assert sorted(p.name for p in dst.iterdir()) == ["notes.txt"]
    assert (dst / "notes.txt").read_text() == "keep me"
    assert not is_dataset(dst)


def test_a_file_as_output_is_refused(tmp_path: Path, src: Path):
    dst = tmp_path / "a-file"
    dst.write_text("x")
    message = the_error(run_cli("convert", src, dst))
    assert str(dst) in message
    assert dst.read_text() == "x"


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--log-every", "0"),
        ("--log-every", "-5"),
        ("--log-every", "nan"),
        ("--commit-every", "0"),
        ("--commit-interval", "0"),
    ],
)
def test_a_bad_flag_value_is_refused_by_name(tmp_path: Path, src: Path, flag: str, value: str):
    dst = tmp_path / "ds"
    message = the_error(run_cli("convert", src, dst, flag, value))
    assert flag in message
    assert not dst.exists()  # refused before anything is written


def test_export_only_flags_on_import_are_refused_by_name(tmp_path: Path, src: Path):
    message = the_error(run_cli("convert", src, tmp_path / "ds", "--partition", "p"))
    assert "--partition" in message


def test_a_missing_source_is_named(tmp_path: Path):
    missing = tmp_path / "missing.jsonl"
    message = the_error(run_cli("convert", missing, tmp_path / "ds"))
    assert str(missing) in message

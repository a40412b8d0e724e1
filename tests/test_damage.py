"""Damaged datasets: every kind of damage is found, named, and contained.

DESIGN.md promises checksums on every shard, readers that refuse a newer format version, and
that a crash never corrupts what was committed. These tests damage a committed dataset of
several shards on purpose (a flipped byte in a shard's data or header, a truncated or deleted
shard, a manifest that is no longer JSON, a marker from a newer release) and hold both faces
of the format to the promise:

- `eagle3kit info` (a real subprocess) names the damaged file on one `error:` line, prints no
  traceback, and exits 1 for a damaged shard (the dataset is still described) or 2 when the
  dataset cannot be used at all;
- `Dataset` raises DatasetError naming the file as soon as the damaged shard is read, while
  every sample of every other shard still reads back exactly as written;
- a writer opening the damaged dataset either refuses with the file's name or continues, but
  never crashes with some other exception and never rewrites the evidence.

Debris from a crash (a `*.tmp` file, a shard sealed but never committed) is the other case:
readers ignore it, `info` warns about each file and still exits 0, the next writer removes it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import prewarmed
import pytest

from eagle3kit.format import Dataset, DatasetError, DatasetWriter, TokenSample
from eagle3kit.format.layout import MANIFEST, MARKER, SHARD_DIR

N_SHARDS = 4
PER_SHARD = 5
DAMAGED = 1  # the shard that gets damaged: one in the middle, with good shards on both sides
CLI_TIMEOUT_S = 60


# A committed dataset ----------------------------------------------------------------------
def _samples() -> list[TokenSample]:
    """Varied samples: two partitions, uneven lengths, a custom mask, metadata on some."""
    out = []
    for i in range(N_SHARDS * PER_SHARD):
        prompt = list(range(100 + i, 107 + 2 * i))
        completion = [50_000 + 3 * i + k for k in range(i % 6 + 1)]
        mask = None
        if i % 4 == 3:
            mask = [1 if k % 3 == 0 else 0 for k in range(len(prompt) + len(completion))]
        out.append(
            TokenSample(
                sample_id=f"sample-{i:03d}",
                prompt_ids=prompt,
                completion_ids=completion,
                finish_reason="length" if i % 5 == 4 else "stop",
                partition="math" if i % 2 else "code",
                loss_mask=mask,
                metadata={"i": i, "tags": ["ü", i]} if i % 3 == 0 else {},
            )
        )
    return out


@dataclass
class Committed:
    path: Path
    samples: list[TokenSample]
    shards: list[Path]
    """In commit order: the manifest's order, so shard k holds samples k*PER_SHARD..."""

    def shard_of(self, index: int) -> int:
        return index // PER_SHARD


@pytest.fixture
def committed(tmp_path: Path) -> Committed:
    path = tmp_path / "ds"
    samples = _samples()
    with DatasetWriter(path, commit_every=PER_SHARD, config={"stage": "test"}) as writer:
        for sample in samples:
            assert writer.add(sample)
    manifest = json.loads((path / MANIFEST).read_text())
    shards = [path / SHARD_DIR / entry["name"] for entry in manifest["shards"]]
    assert len(shards) == N_SHARDS
    return Committed(path, samples, shards)


def assert_same(got: TokenSample, want: TokenSample) -> None:
    assert got.sample_id == want.sample_id
    assert np.array_equal(got.prompt_ids, np.asarray(want.prompt_ids))
    assert np.array_equal(got.completion_ids, np.asarray(want.completion_ids))
    assert np.array_equal(got.dense_loss_mask(), want.dense_loss_mask())
    assert (got.finish_reason, got.partition, got.metadata) == (
        want.finish_reason,
        want.partition,
        want.metadata,
    )


def run_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prewarmed.argv(), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
    )


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def _tensor_span(shard: Path, name: str) -> tuple[int, int]:
    """Absolute [start, end) byte range of tensor `name` in a safetensors file."""
    raw = shard.read_bytes()
    (n,) = struct.unpack_from("<Q", raw, 0)
    start, end = json.loads(raw[8 : 8 + n])[name]["data_offsets"]
    return 8 + n + start, 8 + n + end


def _flip(path: Path, pos: int, mask: int = 0xFF) -> None:
    raw = bytearray(path.read_bytes())
    raw[pos] ^= mask
    path.write_bytes(bytes(raw))


# Shard-level damage: exit 1, the dataset still described ----------------------------------
def _flip_token(shard: Path) -> None:
    start, _ = _tensor_span(shard, "tokens")
    _flip(shard, start + 1, 0x01)  # a token id off by one bit: only a checksum can see it


def _flip_sample_id(shard: Path) -> None:
    # The high bit makes the ASCII id invalid UTF-8: the writer reads ids without checksums.
    start, _ = _tensor_span(shard, "sample_ids")
    _flip(shard, start + 2, 0x80)


def _flip_header_json(shard: Path) -> None:
    (n,) = struct.unpack_from("<Q", shard.read_bytes(), 0)
    _flip(shard, 8 + n // 2)


def _flip_header_length(shard: Path) -> None:
    _flip(shard, 1)  # the u64 header length now points far past the end of the file


def _truncate(shard: Path) -> None:
    shard.write_bytes(shard.read_bytes()[:-7])


def _truncate_to_empty(shard: Path) -> None:
    shard.write_bytes(b"")


def _delete(shard: Path) -> None:
    shard.unlink()


def _fifo(shard: Path) -> None:
    """A FIFO in the shard's place: opened plainly, a read waits for a writer forever."""
    shard.unlink()
    os.mkfifo(shard)


def _link_outside(shard: Path) -> None:
    """The shard moved out of the dataset, a link left in its place: intact bytes, but
    not a file inside the dataset."""
    outside = shard.parent.parent.parent / f"outside-{shard.name}"
    shutil.move(shard, outside)
    shard.symlink_to(outside)


def _folder(shard: Path) -> None:
    shard.unlink()
    shard.mkdir()


SHARD_DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    # name: (how to damage the shard, what the message says about it)
    "flipped data byte": (_flip_token, "checksum"),
    "flipped sample id byte": (_flip_sample_id, "checksum"),
    "flipped header byte": (_flip_header_json, "damaged"),
    "flipped header length": (_flip_header_length, "truncated"),
    "truncated": (_truncate, "truncated"),
    "truncated to nothing": (_truncate_to_empty, "too short"),
    "deleted": (_delete, "missing"),
}
# Not a regular file in a shard's place: the same checks, in one test (each CLI run costs).
NOT_A_FILE: dict[str, tuple[Callable[[Path], None], str]] = {
    "replaced by a FIFO": (_fifo, "a FIFO"),
    "replaced by a link to outside": (_link_outside, "symbolic link"),
    "replaced by a folder": (_folder, "a folder"),
}


@pytest.mark.parametrize("kind", SHARD_DAMAGE)
def test_info_names_a_damaged_shard_and_exits_1(committed: Committed, kind: str):
    damage, why = SHARD_DAMAGE[kind]
    bad = committed.shards[DAMAGED]
    damage(bad)

    result = run_cli("info", committed.path)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    errors = error_lines(result.stderr)
    assert len(errors) == 1, result.stderr
    assert str(bad) in errors[0] and why in errors[0]
    # The rest of the dataset is still described: counts come from the manifest.
    assert f"{N_SHARDS * PER_SHARD} in {N_SHARDS} shards" in result.stderr

    as_json = run_cli("info", committed.path, "--json")
    assert as_json.returncode == 1
    report = json.loads(as_json.stdout)
    assert len(report["problems"]) == 1 and str(bad) in report["problems"][0]
    assert report["samples"] == N_SHARDS * PER_SHARD


@pytest.mark.parametrize("kind", SHARD_DAMAGE)
def test_reader_stops_at_the_damaged_shard_and_keeps_the_others(committed: Committed, kind: str):
    damage, why = SHARD_DAMAGE[kind]
    bad = committed.shards[DAMAGED]
    damage(bad)

    ds = Dataset(committed.path)
    assert len(ds) == len(committed.samples)  # from the manifest, no shard opened
    problems = ds.verify()
    assert len(problems) == 1 and str(bad) in problems[0] and why in problems[0]

    for i, want in enumerate(committed.samples):
        if committed.shard_of(i) == DAMAGED:
            with pytest.raises(DatasetError, match=why) as info:
                ds[i]
            assert str(bad) in str(info.value)
            with pytest.raises(DatasetError, match=why):
                ds.token_view(i)
        else:
            assert_same(ds[i], want)
            view = ds.token_view(i)
            assert np.array_equal(
                view.input_ids, np.concatenate([want.prompt_ids, want.completion_ids])
            )

    # Streaming yields the shards before the damaged one intact, then names the file.
    streamed: list[TokenSample] = []
    with pytest.raises(DatasetError) as info:
        for sample in ds.iter_samples():
            streamed.append(sample)
    assert str(bad) in str(info.value)
    assert len(streamed) == DAMAGED * PER_SHARD
    for got, want in zip(streamed, committed.samples[: len(streamed)], strict=True):
        assert_same(got, want)

    # A partition that also lives in the damaged shard stops there too; nothing silently skips.
    with pytest.raises(DatasetError):
        list(ds.iter_samples("math"))


@pytest.mark.parametrize("kind", SHARD_DAMAGE)
def test_writer_on_a_damaged_dataset_refuses_by_name_or_continues(committed: Committed, kind: str):
    """Resuming must not crash with a stray exception, nor rewrite what is already there."""
    damage, _ = SHARD_DAMAGE[kind]
    bad = committed.shards[DAMAGED]
    damage(bad)
    before = {p: p.read_bytes() for p in committed.shards if p.is_file()}

    extra = TokenSample("extra", [1, 2, 3], [4, 5])
    try:
        with DatasetWriter(
            committed.path, commit_every=PER_SHARD, config={"stage": "test"}
        ) as writer:
            writer.add(extra)
    except DatasetError as exc:
        assert str(bad) in str(exc)
    else:
        # Only damage that needs a checksum to see may go unnoticed by the writer, which
        # reads sample ids only (checking every byte on each resume would cost a full read).
        assert kind == "flipped data byte"
        assert Dataset(committed.path).verify() == [
            f"{bad}: shard damaged (checksum differs from the manifest: contents changed on disk)"
        ]
    assert {p: p.read_bytes() for p in committed.shards if p.is_file()} == before


@pytest.mark.parametrize("kind", NOT_A_FILE)
def test_a_shard_that_is_not_a_regular_file_is_refused_not_waited_on(
    committed: Committed, kind: str
):
    """A FIFO in a shard's place once hung `info` for good (an open waits for a writer); a
    link read a file from outside the dataset. Each is named as a problem at once."""
    damage, why = NOT_A_FILE[kind]
    bad = committed.shards[DAMAGED]
    damage(bad)
    before = {p: p.read_bytes() for p in committed.shards if p.is_file()}

    result = run_cli("info", committed.path, "--no-verify" if kind.endswith("FIFO") else "-q")
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    errors = error_lines(result.stderr)
    assert len(errors) == 1 and str(bad) in errors[0] and why in errors[0], result.stderr
    for verify in (True, False):
        ds = Dataset(committed.path, verify_shards=verify)
        problems = ds.verify() if verify else ds.check_files()
        assert len(problems) == 1 and why in problems[0]
        with pytest.raises(DatasetError, match=why):
            ds[DAMAGED * PER_SHARD]
        assert_same(ds[0], committed.samples[0])
    with pytest.raises(DatasetError, match=why):
        DatasetWriter(committed.path, config={"stage": "test"})
    assert {p: p.read_bytes() for p in committed.shards if p.is_file()} == before


def test_convert_into_a_damaged_dataset_names_the_shard(committed: Committed, tmp_path: Path):
    _flip_sample_id(committed.shards[DAMAGED])
    src = tmp_path / "more.jsonl"
    src.write_text('{"sample_id": "x", "prompt_ids": [1], "completion_ids": [2]}\n')
    result = run_cli("convert", src, committed.path, "--force")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    errors = error_lines(result.stderr)
    assert len(errors) == 1 and str(committed.shards[DAMAGED]) in errors[0]


def test_every_header_bit_flip_is_caught_by_name(committed: Committed):
    """Whatever a flipped bit does to the header (length prefix, JSON syntax, a dtype, a
    shape, an offset, the metadata), reading ends in DatasetError naming the file."""
    bad = committed.shards[DAMAGED]
    original = bad.read_bytes()
    (n,) = struct.unpack_from("<Q", original, 0)
    index = DAMAGED * PER_SHARD
    # Three bits per byte keep this quick and still reach every kind of change: the low bit
    # turns digits into digits (a different offset or dim), 0x20 turns quotes, spaces and
    # letters into control characters or other letters, 0x80 makes invalid UTF-8.
    for pos in range(8 + n):
        for mask in (0x01, 0x20, 0x80):
            raw = bytearray(original)
            raw[pos] ^= mask
            bad.write_bytes(bytes(raw))
            with pytest.raises(DatasetError) as info:
                Dataset(committed.path)[index]
            assert str(bad) in str(info.value), (pos, mask)
    bad.write_bytes(original)
    assert_same(Dataset(committed.path)[index], committed.samples[index])


def test_every_data_byte_flip_is_caught_by_name(committed: Committed):
    bad = committed.shards[DAMAGED]
    original = bad.read_bytes()
    (n,) = struct.unpack_from("<Q", original, 0)
    for pos in range(8 + n, len(original)):
        raw = bytearray(original)
        raw[pos] ^= 0x10
        bad.write_bytes(bytes(raw))
        with pytest.raises(DatasetError, match="checksum") as info:
            Dataset(committed.path)[DAMAGED * PER_SHARD]
        assert str(bad) in str(info.value), pos


HOSTILE_HEADERS: dict[str, Callable[[dict], None]] = {
    # Damage no single bit flip makes, but a bad disk, a bad copy or a hand edit can.
    "offsets are strings": lambda h: h["tokens"].update(
        data_offsets=[str(v) for v in h["tokens"]["data_offsets"]]
    ),
    "offsets are null": lambda h: h["tokens"].update(data_offsets=[None, None]),
    "offsets are floats": lambda h: h["tokens"].update(
        data_offsets=[float(v) for v in h["tokens"]["data_offsets"]]
    ),
    "negative dimension": lambda h: h["offsets"].update(shape=[-h["offsets"]["shape"][0]]),
    "shape is a string": lambda h: h["tokens"].update(shape="12"),
    "entry is a list": lambda h: h.update(tokens=[1, 2]),
    "metadata is a list": lambda h: h.update(__metadata__=["x"]),
    "metadata value is a number": lambda h: h["__metadata__"].update(partitions=7),
    "partitions not JSON": lambda h: h["__metadata__"].update(partitions="[1"),
    "tokens missing": lambda h: h.pop("tokens"),
}


@pytest.mark.parametrize("kind", HOSTILE_HEADERS)
@pytest.mark.parametrize("verify", [True, False], ids=["verify", "no-verify"])
def test_a_hostile_but_parseable_header_is_caught_by_name(
    committed: Committed, kind: str, verify: bool
):
    bad = committed.shards[DAMAGED]
    raw = bad.read_bytes()
    (n,) = struct.unpack_from("<Q", raw, 0)
    header = json.loads(raw[8 : 8 + n])
    HOSTILE_HEADERS[kind](header)
    encoded = orjson.dumps(header)
    encoded += b" " * (-(8 + len(encoded)) % 8)
    bad.write_bytes(struct.pack("<Q", len(encoded)) + encoded + raw[8 + n :])

    # Without checksums the reader still parses the header, so it must still say which file.
    with pytest.raises(DatasetError) as info:
        Dataset(committed.path, verify_shards=verify)[DAMAGED * PER_SHARD]
    assert str(bad) in str(info.value)
    problems = Dataset(committed.path, verify_shards=False).verify()
    assert len(problems) == 1 and str(bad) in problems[0]


# Dataset-level damage: exit 2, nothing to describe ----------------------------------------
def test_invalid_manifest_is_named_and_the_writer_keeps_its_hands_off(committed: Committed):
    manifest = committed.path / MANIFEST
    damaged = manifest.read_bytes()[:-40]  # cut mid-object: no longer JSON
    manifest.write_bytes(damaged)
    shards_before = {p: p.read_bytes() for p in committed.shards}

    result = run_cli("info", committed.path, "--json")
    assert result.returncode == 2
    assert result.stdout == ""  # no half report on stdout for a script to misread
    assert "Traceback" not in result.stderr
    errors = error_lines(result.stderr)
    assert len(errors) == 1 and str(manifest) in errors[0] and "not valid JSON" in errors[0]

    with pytest.raises(DatasetError, match="not valid JSON") as info:
        Dataset(committed.path)
    assert str(manifest) in str(info.value)

    # A writer must refuse rather than start a fresh manifest over the committed shards.
    with pytest.raises(DatasetError, match="not valid JSON"):
        DatasetWriter(committed.path, config={"stage": "test"})
    assert manifest.read_bytes() == damaged
    assert {p: p.read_bytes() for p in committed.shards} == shards_before


# The manifest against itself and against its shards -------------------------------------
def _edit_manifest(path: Path, edit: Callable[[dict], object]) -> bytes:
    manifest = json.loads((path / MANIFEST).read_text())
    edit(manifest)
    (path / MANIFEST).write_text(json.dumps(manifest))
    return (path / MANIFEST).read_bytes()


def _set_name(name: str) -> Callable[[dict], None]:
    def edit(m: dict) -> None:
        m["shards"][DAMAGED]["name"] = name

    return edit


def _outside_name(committed: Committed, where: str) -> str:
    """A copy of a good shard outside shards/, named the way a hostile manifest would."""
    src = committed.shards[DAMAGED]
    if where == "parent":
        shutil.copy(src, committed.path / "stolen.safetensors")
        return "../stolen.safetensors"
    if where == "absolute":
        target = committed.path.parent / "elsewhere.safetensors"
        shutil.copy(src, target)
        return str(target)
    (committed.path / SHARD_DIR / "sub").mkdir()
    shutil.copy(src, committed.path / SHARD_DIR / "sub" / src.name)
    return f"sub/{src.name}"


@pytest.mark.parametrize("where", ["parent", "absolute", "nested"])
def test_a_shard_name_that_is_a_path_is_refused(committed: Committed, where: str):
    """`../x`, `/abs/x` and `sub/x` once read a file from outside shards/ and called it
    valid. A shard name is a plain name inside shards/; anything else is a damaged
    manifest: one message, exit 2, and no writer touches anything."""
    name = _outside_name(committed, where)
    manifest = _edit_manifest(committed.path, _set_name(name))
    data = {
        p: p.read_bytes()
        for p in committed.path.rglob("*")
        if p.is_file() and not p.name.startswith(".")
    }  # the lock's files change

    if where == "parent":
        result = run_cli("info", committed.path)
        assert result.returncode == 2 and "Traceback" not in result.stderr
        errors = error_lines(result.stderr)
        assert len(errors) == 1, result.stderr
        assert str(committed.path / MANIFEST) in errors[0] and repr(name) in errors[0]
        assert "plain file name" in errors[0]
    with pytest.raises(DatasetError, match="plain file name") as refused:
        Dataset(committed.path, verify_shards=False)
    assert repr(name) in str(refused.value)
    with pytest.raises(DatasetError, match="plain file name"):
        DatasetWriter(committed.path, config={"stage": "test"})
    assert (committed.path / MANIFEST).read_bytes() == manifest
    assert {
        p: p.read_bytes()
        for p in committed.path.rglob("*")
        if p.is_file() and not p.name.startswith(".")
    } == data


def _duplicate_shard(m: dict) -> None:
    m["shards"].insert(DAMAGED + 1, dict(m["shards"][DAMAGED]))


def _newer_manifest(m: dict) -> None:
    m["version"] = 99
    m["written_by"] = "9.0.0"


def _shard_counts_only(m: dict) -> None:
    m["shards"][DAMAGED]["tokens"] += 7  # its partitions still add up to the old count


MANIFEST_DAMAGE: dict[str, tuple[Callable[[dict], object], str]] = {
    # name: (edit to the manifest, what the one message says)
    "a shard listed twice": (_duplicate_shard, "listed twice"),
    "a newer version in the manifest only": (_newer_manifest, "eagle3kit 9.0.0"),
    "another kind than the marker": (lambda m: m.update(kind="hidden"), "kind is 'hidden'"),
    "counts that do not add up": (_shard_counts_only, "its partitions add up to"),
    "shards not a list": (lambda m: m.update(shards={"a": 1}), "shards is dict"),
    "a count as a string": (lambda m: m["shards"][0].update(samples="5"), "samples is '5'"),
    "a negative count": (lambda m: m["shards"][0].update(bytes=-1), "bytes is -1"),
    "a boolean count": (lambda m: m["shards"][0].update(tokens=True), "tokens is True"),
    "partitions a list": (lambda m: m["shards"][0].update(partitions=[]), "partitions is not"),
    "finish not counts": (
        lambda m: m["shards"][0]["partitions"]["code"].update(finish=[1]),
        "finish is not",
    ),
    "a checksum as a number": (lambda m: m["shards"][0].update(xxh3=1), "xxh3 is 1"),
    "runs a string": (lambda m: m.update(runs="x"), "runs is str"),
    "config a list": (lambda m: m.update(config=[]), "config is list"),
    "created a string": (lambda m: m.update(created="yesterday"), "created is 'yesterday'"),
    "an entry not an object": (lambda m: m["shards"].append(3), "shards[4] is not an object"),
}


@pytest.mark.parametrize("kind", MANIFEST_DAMAGE)
def test_a_manifest_that_disagrees_with_itself_is_one_message(committed: Committed, kind: str):
    """Once: a shard listed twice read its samples twice with "no problems found", a newer
    version in the manifest was ignored, a wrongly typed field ended in a traceback, exit 1."""
    edit, why = MANIFEST_DAMAGE[kind]
    manifest = _edit_manifest(committed.path, edit)

    with pytest.raises(DatasetError, match=re.escape(why)) as refused:
        Dataset(committed.path, verify_shards=False)
    assert str(committed.path) in str(refused.value)
    with pytest.raises(DatasetError, match=re.escape(why)):
        DatasetWriter(committed.path, config={"stage": "test"})
    assert (committed.path / MANIFEST).read_bytes() == manifest


@pytest.mark.parametrize(
    "kind, args",
    [
        ("a shard listed twice", ("--no-verify", "--json")),
        ("a newer version in the manifest only", ()),
        ("a count as a string", ("--json",)),
        ("created a string", ()),
    ],
)
def test_info_on_a_manifest_that_disagrees_with_itself_exits_2(
    committed: Committed, kind: str, args: tuple[str, ...]
):
    edit, why = MANIFEST_DAMAGE[kind]
    _edit_manifest(committed.path, edit)
    result = run_cli("info", committed.path, *args)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    errors = error_lines(result.stderr)
    assert len(errors) == 1 and why in errors[0], result.stderr


def _edit_counts(key: str, delta: int) -> Callable[[dict], None]:
    """Counts edited consistently (the shard's entry and its partition): the manifest agrees
    with itself, and only the shard itself can tell."""

    def edit(m: dict) -> None:
        entry = m["shards"][DAMAGED]
        part = next(iter(entry["partitions"].values()))
        if key in entry:
            entry[key] += delta
        part[key] += delta
        if key == "samples":
            part["finish"][next(iter(part["finish"]))] += delta

    return edit


@pytest.mark.parametrize("key", ["tokens", "loss_tokens", "completion_tokens", "samples"])
def test_edited_counts_are_caught_by_the_shard_they_describe(committed: Committed, key: str):
    """`info` once reported edited token counts as true. It checks each shard's arrays
    against its manifest entry: the edited shard is a problem named by file, exit 1."""
    _edit_manifest(committed.path, _edit_counts(key, 3))
    bad = committed.shards[DAMAGED]

    if key == "tokens":
        result = run_cli("info", committed.path)
        assert result.returncode == 1, result.stderr
        errors = error_lines(result.stderr)
        assert len(errors) == 1 and str(bad) in errors[0], result.stderr
        assert "the manifest says" in errors[0]
    problems = Dataset(committed.path).verify()
    assert len(problems) == 1 and str(bad) in problems[0]
    with pytest.raises(DatasetError, match=str(bad)):
        list(Dataset(committed.path).iter_samples())


# The marker lost, the manifest intact -----------------------------------------------------
def test_a_lost_marker_is_recovered_and_nothing_is_wiped(committed: Committed, tmp_path: Path):
    """A dataset whose eagle3kit.json is gone (deleted, or not copied) while its manifest
    lists committed shards was called "interrupted before anything was committed"; the
    rerun then started a fresh manifest and deleted every shard as an orphan."""
    marker = (committed.path / MARKER).read_bytes()
    (committed.path / MARKER).unlink()
    shards_before = {p: p.read_bytes() for p in committed.shards}

    result = run_cli("info", committed.path)
    assert result.returncode == 0, result.stderr
    assert "interrupted" not in result.stderr and error_lines(result.stderr) == []
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and str(committed.path / MARKER) in warnings[0]
    assert f"lists {N_SHARDS} committed shards" in warnings[0]
    assert f"{N_SHARDS * PER_SHARD} in {N_SHARDS} shards" in result.stderr
    ds = Dataset(committed.path, warn_stray=False)
    for got, want in zip(ds.iter_samples(), committed.samples, strict=True):
        assert_same(got, want)

    src = tmp_path / "more.jsonl"
    src.write_text('{"sample_id": "more", "prompt_ids": [1], "completion_ids": [2]}\n')
    rerun = run_cli("convert", src, committed.path, "--force", "-q")
    assert rerun.returncode == 0, rerun.stderr
    assert "restored" in rerun.stderr
    assert json.loads((committed.path / MARKER).read_text()) == json.loads(marker)
    assert {p: p.read_bytes() for p in committed.shards} == shards_before
    after = Dataset(committed.path)
    assert len(after) == N_SHARDS * PER_SHARD + 1 and after.verify() == []


def test_a_lost_marker_with_a_newer_manifest_is_still_refused(committed: Committed):
    (committed.path / MARKER).unlink()
    manifest = _edit_manifest(committed.path, _newer_manifest)
    with pytest.raises(DatasetError, match=r"eagle3kit 9\.0\.0"):
        Dataset(committed.path)
    with pytest.raises(DatasetError, match=r"eagle3kit 9\.0\.0"):
        DatasetWriter(committed.path, config={"stage": "test"})
    assert not (committed.path / MARKER).exists()  # not "restored" to an older version
    assert (committed.path / MANIFEST).read_bytes() == manifest


def test_missing_directory_and_non_dataset_exit_2(tmp_path: Path):
    missing = run_cli("info", tmp_path / "nope")
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert error_lines(missing.stderr) == [f"error: {tmp_path / 'nope'}: no such directory"]

    (tmp_path / "plain").mkdir()
    plain = run_cli("info", tmp_path / "plain")
    assert plain.returncode == 2 and "Traceback" not in plain.stderr
    assert "not an eagle3kit dataset" in error_lines(plain.stderr)[0]


def _mark_newer(path: Path, written_by: str | None) -> bytes:
    marker = json.loads((path / MARKER).read_text())
    marker["version"] = 99
    if written_by is None:
        marker.pop("written_by", None)
    else:
        marker["written_by"] = written_by
    (path / MARKER).write_text(json.dumps(marker))
    return (path / MARKER).read_bytes()


def test_a_newer_format_version_says_which_release_reads_it(committed: Committed):
    marker = _mark_newer(committed.path, "9.0.0")
    manifest_before = (committed.path / MANIFEST).read_bytes()

    result = run_cli("info", committed.path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    errors = error_lines(result.stderr)
    assert len(errors) == 1
    message = errors[0]
    assert str(committed.path) in message
    assert "version 99" in message and "eagle3kit 9.0.0" in message
    assert "pip install -U 'eagle3kit>=9.0.0'" in message

    with pytest.raises(DatasetError, match=r"eagle3kit 9\.0\.0"):
        Dataset(committed.path)
    # An old writer must not append to (or "repair") a dataset it cannot read.
    with pytest.raises(DatasetError, match="newer"):
        DatasetWriter(committed.path, config={"stage": "test"})
    assert (committed.path / MARKER).read_bytes() == marker
    assert (committed.path / MANIFEST).read_bytes() == manifest_before


def test_a_newer_format_version_without_written_by_still_gives_a_usable_hint(committed: Committed):
    _mark_newer(committed.path, None)
    with pytest.raises(DatasetError, match="newer") as info:
        Dataset(committed.path)
    message = str(info.value)
    assert "version 99" in message and "pip install -U eagle3kit" in message
    assert ">=a newer" not in message  # no pip command that pip would reject


# Crash debris: warnings, exit 0, removed by the next writer -------------------------------
def _leave_debris(committed: Committed) -> list[Path]:
    """A temp manifest and a temp shard (a crash mid-write) and a sealed, uncommitted shard
    (a crash between sealing and committing), made the way a crashed writer makes them."""
    # A writer that dies right after sealing its shard, before the manifest names it.
    script = textwrap.dedent(f"""
        import os
        from eagle3kit.format import DatasetWriter, TokenSample, writer
        w = DatasetWriter({str(committed.path)!r}, commit_every=100, config={{"stage": "test"}})
        for i in range(3):
            w.add(TokenSample(f"lost-{{i}}", [7, 8, 9], [10]))
        writer.file_lock = lambda path: os._exit(9)  # die the moment the commit starts
        w.commit()
    """)
    died = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=CLI_TIMEOUT_S
    )
    assert died.returncode == 9, died.stderr
    committed_names = {p.name for p in committed.shards}
    orphans = [
        p
        for p in (committed.path / SHARD_DIR).glob("*.safetensors")
        if p.name not in committed_names
    ]
    assert len(orphans) == 1
    # Temp files last: the dying writer's open would have cleared them.
    temp_manifest = committed.path / f"{MANIFEST}.4242.tmp"
    temp_manifest.write_bytes(b'{"format": "eagle3kit-dataset", "shar')
    temp_shard = committed.path / SHARD_DIR / "r0-0badc0de-000000.safetensors.tmp"
    temp_shard.write_bytes(committed.shards[0].read_bytes()[:100])
    return [temp_manifest, temp_shard, orphans[0]]


def test_crash_debris_is_ignored_reported_and_then_removed(committed: Committed):
    debris = _leave_debris(committed)

    ds = Dataset(committed.path)
    assert len(ds) == len(committed.samples)
    assert ds.verify() == []
    for got, want in zip(ds.iter_samples(), committed.samples, strict=True):
        assert_same(got, want)
    temps, orphans = ds.stray_files()
    assert sorted([*temps, *orphans]) == sorted(debris)

    result = run_cli("info", committed.path)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and error_lines(result.stderr) == []
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == len(debris)
    for path in debris:
        assert any(str(path) in w and "ignored" in w for w in warnings), path
    report = json.loads(run_cli("info", committed.path, "--json").stdout)
    assert report["problems"] == [] and len(report["warnings"]) == len(debris)

    # The next writer (a rerun of the same run or any later one) clears the debris first.
    with DatasetWriter(committed.path, config={"stage": "test"}) as writer:
        assert sorted(writer.removed_on_open) == sorted(debris)
        assert writer.add(TokenSample("lost-0", [7, 8, 9], [10]))  # never committed: new
    for path in debris:
        assert not path.exists()
    after = Dataset(committed.path)
    assert len(after) == len(committed.samples) + 1
    assert after.stray_files() == ([], [])
    assert after.verify() == []
    clean = run_cli("info", committed.path)
    assert clean.returncode == 0 and "warning:" not in clean.stderr


def test_copying_a_damaged_dataset_elsewhere_keeps_the_diagnosis(
    committed: Committed, tmp_path: Path
):
    """Messages name the file where it is now, so a moved dataset is diagnosed in place."""
    _truncate(committed.shards[DAMAGED])
    moved = tmp_path / "moved"
    shutil.copytree(committed.path, moved)
    problems = Dataset(moved).verify()
    assert len(problems) == 1
    assert problems[0].startswith(str(moved / SHARD_DIR / committed.shards[DAMAGED].name))

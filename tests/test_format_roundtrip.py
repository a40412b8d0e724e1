"""The token dataset format reads back exactly what was written, by every way of reading it.

Property tests (hypothesis) write arbitrary lists of TokenSample (unicode partitions and ids,
empty prompts and completions, custom loss masks, nested JSON metadata, optional fields
present or None, numpy or list ids) with a random commit size, and check that `Dataset[i]`,
`iter_samples`, `iter_samples(partition)`, `indices`, `token_view`, `sample_ids` and the
manifest's counts all agree with the input, field by field and type for type; and that
`eagle3kit convert` is lossless: export -> import -> export gives the same bytes.

Fixed tests check the format's two outside promises: a shard is a plain safetensors file
(`safetensors.numpy.load_file` reads it, arrays equal to the reader's), and `token_view` hands
out read-only views of the memory-mapped file, not copies. Last, what `add` refuses (a value
the format cannot store) leaves no trace: the samples queued with it still commit.
"""

from __future__ import annotations

import mmap
import string
import struct
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.numpy import load_file

from eagle3kit import convert
from eagle3kit._options import WriteOptions
from eagle3kit._ui import OutputOptions
from eagle3kit.convert import jsonl
from eagle3kit.format import Dataset, DatasetWriter, TokenSample
from eagle3kit.format.layout import SHARD_DIR
from eagle3kit.format.shard import ShardFile

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
# Each example writes whole datasets with fsyncs; keep the count modest so the file stays fast.
PROPERTY_SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@contextmanager
def scratch() -> Iterator[Path]:
    # One directory per hypothesis example: pytest's tmp_path is shared across examples.
    with tempfile.TemporaryDirectory(prefix="e3k-roundtrip-") as d:
        yield Path(d)


# Strategies --------------------------------------------------------------------------------
# Text as JSON carries it: any code point but lone surrogates, which UTF-8 cannot encode.
text = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
tricky_text = st.one_of(text, st.sampled_from(["", " ", "ü", "数学", "a b", "🙂", "\t\r", "\x00"]))
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    text,
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(text, inner, max_size=4)),
    max_leaves=12,
)
json_objects = st.dictionaries(text, json_values, max_size=4)
# An id is any non-empty text without a newline (the shard stores ids newline-joined).
sample_ids = st.text(
    st.characters(exclude_categories=("Cs",), exclude_characters="\n"), min_size=1, max_size=16
)
# convert refuses control characters (C0, DEL, C1: category Cc) in ids, finish reasons and
# partition names at import, so samples that go through JSONL carry none there.
printable_ids = st.text(st.characters(exclude_categories=("Cs", "Cc")), min_size=1, max_size=16)
printable_text = st.one_of(
    st.text(st.characters(exclude_categories=("Cs", "Cc")), max_size=12),
    st.sampled_from(["", " ", "ü", "数学", "a b", "🙂"]),
)


@st.composite
def token_samples(
    draw: st.DrawFn, sample_id: str, low: int, labels: st.SearchStrategy[str] = tricky_text
) -> TokenSample:
    token_lists = st.lists(st.integers(low, INT32_MAX), max_size=12)
    prompt = draw(token_lists)
    completion = draw(token_lists)
    n = len(prompt) + len(completion)
    mask = draw(st.one_of(st.none(), st.lists(st.integers(0, 1), min_size=n, max_size=n)))
    as_numpy = draw(st.booleans())
    dtype = draw(st.sampled_from([np.int32, np.int64, ">i4"]))
    return TokenSample(
        sample_id=sample_id,
        # Arrays of any integer dtype and plain lists are both accepted and must agree.
        prompt_ids=np.asarray(prompt, dtype) if as_numpy else prompt,
        completion_ids=np.asarray(completion, dtype) if as_numpy else completion,
        finish_reason=draw(
            st.one_of(st.sampled_from(["stop", "length", "abort", "filtered:short"]), labels)
        ),
        partition=draw(st.one_of(st.sampled_from(["math", "code", "数学"]), labels)),
        loss_mask=(np.asarray(mask, np.uint8) if as_numpy and mask is not None else mask),
        source=draw(st.one_of(st.none(), json_objects)),
        server=draw(st.one_of(st.none(), json_objects)),
        latency=draw(
            st.one_of(st.none(), st.floats(0, 1e6, allow_nan=False), st.integers(0, 10**6))
        ),
        counts=draw(st.one_of(st.none(), st.dictionaries(text, st.integers(0, 2**40), max_size=3))),
        metadata=draw(json_objects),
    )


@st.composite
def sample_lists(
    draw: st.DrawFn, max_size: int = 14, low: int = 0, printable: bool = False
) -> list[TokenSample]:
    """Samples with unique ids; token ids from `low` up to int32's top (ids are never
    negative: the writer and JSONL import both refuse them). `printable`: no control
    characters in ids, finish reasons and partitions (what convert imports)."""
    ids = draw(st.lists(printable_ids if printable else sample_ids, max_size=max_size, unique=True))
    labels = printable_text if printable else tricky_text
    return [draw(token_samples(i, low, labels)) for i in ids]


# Comparison --------------------------------------------------------------------------------
def exact(value: Any) -> bytes:
    """JSON bytes, so that 1, 1.0 and True (equal in Python) still differ."""
    return orjson.dumps(value)


def assert_same(got: TokenSample, want: TokenSample) -> None:
    assert got.sample_id == want.sample_id
    assert got.prompt_ids.dtype == np.dtype("<i4")  # ids come back as int32 whatever went in
    assert np.array_equal(got.prompt_ids, np.asarray(want.prompt_ids, np.int64))
    assert np.array_equal(got.completion_ids, np.asarray(want.completion_ids, np.int64))
    assert np.array_equal(got.dense_loss_mask(), want.dense_loss_mask())
    # A custom mask equal to the default one reads back as the default (None); any other
    # mask reads back as given.
    assert (got.loss_mask is None) == has_default_mask(want)
    assert got.finish_reason == want.finish_reason
    assert got.partition == want.partition
    for key in ("source", "server", "latency", "counts", "metadata"):
        assert exact(getattr(got, key)) == exact(getattr(want, key)), key


def has_default_mask(sample: TokenSample) -> bool:
    default = np.zeros(sample.num_tokens, np.uint8)
    default[len(sample.prompt_ids) :] = 1
    return sample.loss_mask is None or np.array_equal(sample.loss_mask, default)


def expected_record(sample: TokenSample) -> dict:
    """The JSONL record export should write: a mask only when it is not the default one."""
    record = jsonl.sample_to_record(sample)
    if has_default_mask(sample):
        record.pop("loss_mask", None)
    return record


def write(path: Path, samples: list[TokenSample], commit_every: int) -> None:
    with DatasetWriter(path, commit_every=commit_every) as writer:
        for sample in samples:
            assert writer.add(sample)
            assert not writer.add(sample)  # the same id twice is skipped, not duplicated


def check_reads_back(path: Path, samples: list[TokenSample]) -> None:
    ds = Dataset(path)
    n = len(samples)
    assert len(ds) == n
    assert ds.verify() == []
    assert ds.num_tokens == sum(s.num_tokens for s in samples)
    assert list(ds.sample_ids()) == [s.sample_id for s in samples]

    for i, want in enumerate(samples):
        assert_same(ds[i], want)
        view = ds.token_view(i)
        assert np.array_equal(
            view.input_ids,
            np.concatenate(
                [np.asarray(want.prompt_ids, np.int64), np.asarray(want.completion_ids, np.int64)]
            ),
        )
        assert view.prompt_len == len(want.prompt_ids)
        assert np.array_equal(view.loss_mask, want.dense_loss_mask())
    if n:
        assert_same(ds[-1], samples[-1])  # negative indices count from the end
    with pytest.raises(IndexError):
        ds[n]

    streamed = list(ds.iter_samples())
    assert len(streamed) == n
    for got, want in zip(streamed, samples, strict=True):
        assert_same(got, want)

    partitions = {s.partition for s in samples}
    assert ds.partitions == sorted(partitions)
    assert np.array_equal(ds.indices(), np.arange(n))
    for part in [*partitions, "no-such-partition"]:
        wanted = [i for i, s in enumerate(samples) if s.partition == part]
        assert ds.indices(part).tolist() == wanted
        got = list(ds.iter_samples(part))
        assert len(got) == len(wanted)
        for sample, i in zip(got, wanted, strict=True):
            assert_same(sample, samples[i])

    # The manifest's per-partition counts (what `info` shows without opening a shard).
    stats = ds.partition_stats()
    for part in partitions:
        members = [s for s in samples if s.partition == part]
        finish: dict[str, int] = {}
        for s in members:
            finish[s.finish_reason] = finish.get(s.finish_reason, 0) + 1
        assert stats[part] == {
            "samples": len(members),
            "tokens": sum(s.num_tokens for s in members),
            "loss_tokens": sum(int(s.dense_loss_mask().sum()) for s in members),
            "completion_tokens": sum(len(s.completion_ids) for s in members),
            "finish": finish,
        }


# Properties --------------------------------------------------------------------------------
@PROPERTY_SETTINGS
@given(samples=sample_lists(), commit_every=st.integers(1, 6))
def test_every_sample_reads_back_exactly(samples: list[TokenSample], commit_every: int):
    with scratch() as d:
        write(d / "ds", samples, commit_every)
        check_reads_back(d / "ds", samples)


@PROPERTY_SETTINGS
@given(
    first=sample_lists(max_size=8), second=sample_lists(max_size=8), commit_every=st.integers(1, 4)
)
def test_a_continued_dataset_reads_back_both_runs_once(
    first: list[TokenSample], second: list[TokenSample], commit_every: int
):
    """A second writer on the same dataset skips ids it holds and appends the rest."""
    with scratch() as d:
        write(d / "ds", first, commit_every)
        known = {s.sample_id for s in first}
        with DatasetWriter(d / "ds", commit_every=commit_every) as writer:
            for sample in second:
                assert writer.add(sample) == (sample.sample_id not in known)
        check_reads_back(d / "ds", first + [s for s in second if s.sample_id not in known])


def _quiet() -> OutputOptions:
    return OutputOptions(quiet=True, no_progress=True)


@PROPERTY_SETTINGS
@given(samples=sample_lists(low=0, printable=True), commit_every=st.integers(1, 6))
def test_convert_export_import_export_is_byte_identical(
    samples: list[TokenSample], commit_every: int
):
    with scratch() as d:
        write(d / "a", samples, commit_every)
        convert.run(convert.ConvertConfig(d / "a", d / "a.jsonl", output=_quiet()))
        imported = convert.run(
            convert.ConvertConfig(
                d / "a.jsonl",
                d / "b",
                write=WriteOptions(commit_every=commit_every),
                output=_quiet(),
            )
        )
        assert (imported.written, imported.bad_lines) == (len(samples), 0)
        check_reads_back(d / "b", samples)
        convert.run(convert.ConvertConfig(d / "b", d / "b.jsonl", output=_quiet()))
        assert (d / "b.jsonl").read_bytes() == (d / "a.jsonl").read_bytes()

        # One line per sample, in order, each the sample's record (type for type).
        lines = (d / "a.jsonl").read_bytes().splitlines()
        assert lines == [exact(expected_record(s)) for s in samples]

        # Export of one partition: exactly that partition's lines, in order.
        for part in {s.partition for s in samples}:
            out = d / "part.jsonl"
            convert.run(convert.ConvertConfig(d / "b", out, partition=part, output=_quiet()))
            wanted = [x for x, s in zip(lines, samples, strict=True) if s.partition == part]
            assert out.read_bytes().splitlines() == wanted


# Fixed examples: what outside tools see ----------------------------------------------------
def _fixed_samples() -> list[TokenSample]:
    rng = np.random.default_rng(7)
    out = []
    for i in range(23):
        total = int(rng.integers(0, 40))
        split = int(rng.integers(0, total + 1))
        tokens = rng.integers(0, INT32_MAX, total, dtype=np.int64).tolist()
        mask = rng.integers(0, 2, total).tolist() if i % 4 == 0 else None
        out.append(
            TokenSample(
                f"fixed-{i}",
                tokens[:split],
                tokens[split:],
                loss_mask=mask,
                partition=["a", "b", "ç"][i % 3],
                metadata={"i": i},
            )
        )
    return out


@pytest.fixture
def fixed(tmp_path: Path) -> tuple[Path, list[TokenSample]]:
    samples = _fixed_samples()
    write(tmp_path / "ds", samples, commit_every=5)
    return tmp_path / "ds", samples


def test_shards_are_plain_safetensors(fixed: tuple[Path, list[TokenSample]]):
    path, samples = fixed
    ds = Dataset(path)
    seen: list[str] = []
    for entry in ds.shards:
        shard = path / SHARD_DIR / entry["name"]
        loaded = load_file(str(shard))
        ours = ShardFile(shard)
        assert set(loaded) == set(ours.names())
        for name, array in loaded.items():
            assert array.dtype == ours.array(name).dtype
            assert np.array_equal(array, ours.array(name)), name
        with safe_open(str(shard), framework="np") as f:
            meta = f.metadata()
        assert meta["format"] == "eagle3kit-dataset" and meta["content_xxh3"]
        assert int(meta["samples"]) == entry["samples"]
        partition_names = orjson.loads(meta["partitions"])

        # Everything a sample is can be rebuilt from the safetensors arrays alone.
        ids = loaded["sample_ids"].tobytes().decode().split("\n")
        offsets, prompt_lens = loaded["offsets"], loaded["prompt_lens"]
        for k, sample_id in enumerate(ids):
            want = samples[len(seen) + k]
            assert sample_id == want.sample_id
            start, end = int(offsets[k]), int(offsets[k + 1])
            split = start + int(prompt_lens[k])
            assert loaded["tokens"][start:split].tolist() == list(want.prompt_ids)
            assert loaded["tokens"][split:end].tolist() == list(want.completion_ids)
            assert partition_names[loaded["partition_index"][k]] == want.partition
            mask = np.zeros(end - start, np.uint8)
            first, last = loaded["loss_span_offsets"][k], loaded["loss_span_offsets"][k + 1]
            for span_start, span_end in loaded["loss_spans"][first:last]:
                mask[span_start:span_end] = 1
            assert np.array_equal(mask, want.dense_loss_mask())
        seen += ids
    assert seen == [s.sample_id for s in samples]


def _root(array: np.ndarray) -> object:
    """What an array's memory ultimately belongs to."""
    base: object = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return base.obj if isinstance(base, memoryview) else base


def test_token_view_is_a_read_only_view_of_the_mapped_file(fixed: tuple[Path, list[TokenSample]]):
    path, samples = fixed
    ds = Dataset(path)
    i = next(k for k, s in enumerate(samples) if len(s.prompt_ids) >= 2)
    view = ds.token_view(i)
    ids = view.input_ids
    assert not ids.flags.writeable and not ids.flags.owndata
    assert isinstance(_root(ids), mmap.mmap)
    with pytest.raises(ValueError, match="read-only"):
        ids[0] = 1
    # Which shard holds sample i, from the manifest's counts.
    starts = np.cumsum([0] + [entry["samples"] for entry in ds.shards])
    k = int(np.searchsorted(starts, i, side="right")) - 1
    neighbour = int(starts[k]) if i != starts[k] else int(starts[k]) + 1
    # Two views into one shard share one mapping: no per-sample buffer anywhere.
    assert _root(ds.token_view(neighbour).input_ids) is _root(ids)
    assert _root(ds[i].prompt_ids) is _root(ids)

    # The proof that it is no copy: change the file under it and the view changes too (a
    # shared mapping sees writes through the page cache). The offset comes from the header.
    shard = path / SHARD_DIR / ds.shards[k]["name"]
    raw = shard.read_bytes()
    (header_len,) = struct.unpack_from("<Q", raw, 0)
    tokens_at = 8 + header_len + orjson.loads(raw[8 : 8 + header_len])["tokens"]["data_offsets"][0]
    start_in_shard = int(load_file(str(shard))["offsets"][i - int(starts[k])])
    offset = tokens_at + 4 * start_in_shard
    before = int(ids[0])
    with open(shard, "r+b") as f:
        f.seek(offset)
        f.write(np.array([before ^ 0x5A5A], "<i4").tobytes())
    assert int(ids[0]) == before ^ 0x5A5A
    assert int(ds[i].prompt_ids[0]) == before ^ 0x5A5A  # the reader hands out the same bytes
    assert int(ids[1]) == int(samples[i].prompt_ids[1])


# What add refuses leaves no trace -----------------------------------------------------------
UNSTORABLE: dict[str, dict[str, Any]] = {
    "id past int32 in a list": {"completion_ids": [1, 2**31]},
    "id past int32 in an int64 array": {"prompt_ids": np.array([5, 2**31], np.int64)},
    "negative past int32 in an array": {"prompt_ids": np.array([-(2**31) - 1], np.int64)},
    "uint32 past int32": {"prompt_ids": np.array([4_000_000_000], np.uint32)},
    "float ids in an array": {"completion_ids": np.array([1.0, 2.5])},
    "float ids in a list": {"completion_ids": [1.0]},
    "metadata int past 64 bits": {"metadata": {"x": 2**70}},
    "metadata not JSON": {"metadata": {"x": {1, 2}}},
    "server not JSON": {"server": {"when": object()}},
    "partition not a string": {"partition": 3},
    "mask of wrong length": {"loss_mask": [1]},
    "mask not 0/1": {"loss_mask": [0, 2, 1]},
}


@pytest.mark.parametrize("kind", UNSTORABLE)
def test_add_refuses_what_cannot_be_stored_and_keeps_the_rest(tmp_path: Path, kind: str):
    good = [TokenSample(f"g{i}", [1, i], [2], metadata={"i": i}) for i in range(4)]
    fields: dict[str, Any] = {"prompt_ids": [1, 2], "completion_ids": [3]}
    bad = TokenSample("bad", **{**fields, **UNSTORABLE[kind]})
    with DatasetWriter(tmp_path / "ds", commit_every=3) as writer:
        writer.add(good[0])
        writer.add(good[1])
        with pytest.raises((ValueError, TypeError)):
            writer.add(bad)  # refused at once, naming nothing but itself...
        assert writer.pending == 2
        writer.add(good[2])  # ...so the commit this triggers still works
        writer.add(good[3])
    check_reads_back(tmp_path / "ds", good)
    assert "bad" not in set(Dataset(tmp_path / "ds").sample_ids())


def test_add_snapshots_the_sample(tmp_path: Path):
    """A caller reusing its dicts and lists after add() cannot change what gets committed."""
    metadata: dict[str, Any] = {"turn": 1}
    prompt = [1, 2, 3]
    with DatasetWriter(tmp_path / "ds", commit_every=100) as writer:
        writer.add(TokenSample("s", prompt, [4], metadata=metadata))
        metadata["turn"] = 2
        prompt[0] = 99
    got = Dataset(tmp_path / "ds")[0]
    assert got.metadata == {"turn": 1} and got.prompt_ids.tolist() == [1, 2, 3]


def test_after_a_failed_commit_no_later_sample_is_committed(tmp_path: Path):
    """A background commit's error surfaces in whichever call commits next; gen's committer
    met it, and before the run was torn down another slot's add() committed the samples that
    came after, so the soak stored turn 1 of two conversations whose turn 0 was lost. Once a
    commit failed, every later commit, add and close fails the same way."""
    from eagle3kit.format import DatasetError
    from eagle3kit.format._io import tmp_path as temp_name
    from eagle3kit.format.layout import MANIFEST

    out = tmp_path / "ds"
    writer = DatasetWriter(out, commit_every=100)
    blocker = temp_name(out / MANIFEST)  # the manifest's next version cannot be written
    blocker.mkdir()
    writer.add(TokenSample("turn0", [1, 2], [3]))
    writer.commit(wait=False)
    with pytest.raises(DatasetError, match="manifest"):
        writer.commit()
    blocker.rmdir()  # the disk has room again
    with pytest.raises(DatasetError, match="an earlier commit failed") as later:
        writer.add(TokenSample("turn1", [1, 2, 3, 4], [5]))
    assert "manifest" in str(later.value)
    for again in (writer.commit, writer.close):
        with pytest.raises(DatasetError, match="an earlier commit failed"):
            again()
    assert len(Dataset(out)) == 0
    with DatasetWriter(out) as rerun:  # the lock is free; nothing is held as done
        assert rerun.done_ids == set()
        assert rerun.add(TokenSample("turn0", [1, 2], [3]))
    assert list(Dataset(out).sample_ids()) == ["turn0"]


def test_printable_ids_and_partitions_survive_the_cli(tmp_path: Path):
    """A quick end-to-end check through the same functions the CLI calls, with the ids a
    user most often has (printable ASCII incl. quotes and backslashes)."""
    samples = [
        TokenSample(f'{c}"\\{i}', [i], [i + 1], partition=c)
        for i, c in enumerate(string.printable[:20])
    ]
    write(tmp_path / "a", samples, commit_every=7)
    convert.run(convert.ConvertConfig(tmp_path / "a", tmp_path / "a.jsonl", output=_quiet()))
    convert.run(convert.ConvertConfig(tmp_path / "a.jsonl", tmp_path / "b", output=_quiet()))
    check_reads_back(tmp_path / "b", samples)

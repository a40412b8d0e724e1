"""`DatasetWriter.drop` and `Dataset.ids_with_finish`: how gen retries samples it recorded as
failed. A sample id is stored once, so the old record must leave before the new one comes;
the shards holding such records are rewritten without them under one manifest commit.
"""

from __future__ import annotations

import numpy as np
import pytest

from eagle3kit.format import Dataset, DatasetError, DatasetWriter, TokenSample
from eagle3kit.format import drop as drop_module


def sample(i: int, finish: str = "stop") -> TokenSample:
    completion = [] if finish.startswith("skipped") else [100 + i, 7, 2]
    mask = None if i % 4 else [0, 1, 0] + [1] * len(completion)  # some carry their own mask
    return TokenSample(
        f"s{i:03d}",
        [1, 2, i],
        completion,
        finish_reason=finish,
        partition="even" if i % 2 == 0 else "odd",
        loss_mask=mask,
        source={"line": i},
        server={"url": "u"},
        latency=0.5,
        counts={"completion_tokens": len(completion)},
        metadata={"i": i, "reason": "x"} if finish != "stop" else {"i": i},
    )


def build(path, n: int = 20, failed=(3, 4, 5, 17)) -> list[TokenSample]:
    samples = [sample(i, "skipped:failed" if i in failed else "stop") for i in range(n)]
    with DatasetWriter(path, commit_every=5) as w:
        for s in samples:
            w.add(s)
    return samples


def same(a: TokenSample, b: TokenSample) -> bool:
    return (
        a.sample_id == b.sample_id
        and np.array_equal(a.prompt_ids, b.prompt_ids)
        and np.array_equal(a.completion_ids, b.completion_ids)
        and np.array_equal(a.dense_loss_mask(), b.dense_loss_mask())
        and (a.finish_reason, a.partition, a.source, a.server, a.latency, a.counts, a.metadata)
        == (b.finish_reason, b.partition, b.source, b.server, b.latency, b.counts, b.metadata)
    )


def test_ids_with_finish_reads_only_shards_that_count_one(tmp_path):
    build(tmp_path / "ds")
    ds = Dataset(tmp_path / "ds")
    assert ds.ids_with_finish("skipped:failed") == {"s003", "s004", "s005", "s017"}
    assert ds._open.keys() == {0, 1, 3}  # shards 0-4, 5-9, 15-19 hold one; 10-14 none
    clean = Dataset(tmp_path / "ds")
    assert clean.ids_with_finish("skipped:render_error") == set() and not clean._open


def test_drop_rewrites_the_shards_and_keeps_every_other_sample_as_it_was(tmp_path):
    samples = build(tmp_path / "ds")
    dropped = {"s003", "s004", "s005", "s017", "not-there"}
    with DatasetWriter(tmp_path / "ds") as w:
        assert w.drop(dropped) == 4
        assert not dropped & w.done_ids
        for s in [sample(3), sample(4)]:  # the retried samples come back
            assert w.add(s)
    ds = Dataset(tmp_path / "ds")
    assert ds.verify() == [] and ds.stray_files() == ([], [])
    kept = [s for s in samples if s.sample_id not in dropped]
    assert len(ds) == len(kept) + 2
    stored = {s.sample_id: s for s in ds}
    assert all(same(stored[s.sample_id], s) for s in kept)
    assert same(stored["s003"], sample(3)) and stored["s004"].finish_reason == "stop"
    # The manifest's counts are the shards' own: 18 samples, one finish reason left.
    finish = {}
    for stats in ds.partition_stats().values():
        for reason, n in stats["finish"].items():
            finish[reason] = finish.get(reason, 0) + n
    assert finish == {"stop": 18}
    assert sum(e["samples"] for e in ds.shards) == 18
    assert ds.num_tokens == sum(len(s.prompt_ids) + len(s.completion_ids) for s in ds)


def test_a_shard_whose_every_sample_goes_leaves_the_manifest(tmp_path):
    build(tmp_path / "ds", n=10, failed=range(5))
    with DatasetWriter(tmp_path / "ds") as w:
        assert w.drop({f"s{i:03d}" for i in range(5)}) == 5
    ds = Dataset(tmp_path / "ds")
    assert len(ds.shards) == 1 and len(ds) == 5 and ds.verify() == []
    assert len(list((tmp_path / "ds" / "shards").iterdir())) == 1


def test_queued_samples_are_committed_before_the_rewrite(tmp_path):
    build(tmp_path / "ds", n=5)
    with DatasetWriter(tmp_path / "ds", commit_every=100) as w:
        w.add(sample(30))
        w.add(sample(31, "skipped:failed"))
        assert w.drop({"s031", "s003"}) == 2
    assert sorted(Dataset(tmp_path / "ds").sample_ids()) == ["s000", "s001", "s002", "s004", "s030"]


def test_a_commit_that_fails_leaves_the_dataset_as_it_was(tmp_path, monkeypatch):
    """The rewritten shards are sealed before the manifest names them: when the commit that
    would swap them in fails, the old manifest still holds every sample, and the new shards
    are orphans the next writer removes."""
    samples = build(tmp_path / "ds")

    def full_disk(path, obj):
        raise DatasetError(f"{path}: no space left to write")

    with DatasetWriter(tmp_path / "ds") as w:
        monkeypatch.setattr(drop_module, "write_json_atomic", full_disk)
        with pytest.raises(DatasetError, match="no space left"):
            w.drop({"s003", "s017"})
        monkeypatch.undo()
    ds = Dataset(tmp_path / "ds", warn_stray=False)
    assert ds.verify() == [] and [s.sample_id for s in ds] == [s.sample_id for s in samples]
    temps, orphans = ds.stray_files()
    assert temps == [] and len(orphans) == 2
    DatasetWriter(tmp_path / "ds").close()
    assert Dataset(tmp_path / "ds").stray_files() == ([], [])
    assert len(Dataset(tmp_path / "ds")) == 20

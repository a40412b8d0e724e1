"""Writers keep to the dataset's own directory and delete only the files they make.

A writer opening a dataset removes crash debris (temp files, shards no commit names), and
`--overwrite` removes the dataset's files; both once followed a symlinked `shards/` or
`tokenizer/` out of the directory and removed whatever they found there. Here every such
case is built with real files and links and run through the real CLI: a linked folder is
refused with one message naming it and the way out, and a file the writers did not name
(another tool's weights, a user's notes, another dataset's shards) survives every run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from eagle3kit.format import Dataset, DatasetError, DatasetWriter, TokenSample
from eagle3kit.format.layout import MANIFEST, MARKER, SHARD_DIR

CLI_TIMEOUT_S = 60


def run_cli(*args: str | Path, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "EAGLE3KIT_RUN_ID"}
    return subprocess.run(
        [*prefix, sys.executable, "-m", "eagle3kit", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        env=env,
    )


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def one_error(result: subprocess.CompletedProcess[str], code: int = 2) -> str:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    errors = error_lines(result.stderr)
    assert len(errors) == 1, result.stderr
    return errors[0]


def write_jsonl(path: Path, n: int, tag: str = "s") -> Path:
    with open(path, "wb") as f:
        for i in range(n):
            f.write(
                orjson.dumps(
                    {
                        "sample_id": f"{tag}-{i}",
                        "prompt_ids": [1, 2, 3 + i],
                        "completion_ids": [7, 8 + i],
                        "partition": "p",
                    }
                )
                + b"\n"
            )
    return path


def convert(src: Path, ds: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return run_cli("convert", src, ds, "--commit-every", "4", "-q", *flags)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def write_dataset(src: Path, ds: Path) -> Path:
    """What `convert src ds --commit-every 4` writes, in-process (a CLI run costs a second)."""
    from eagle3kit.convert.jsonl import record_to_sample

    with DatasetWriter(
        ds, config={"stage": "convert", "source": src.name}, commit_every=4
    ) as writer:
        for line in src.read_bytes().splitlines():
            writer.add(record_to_sample(orjson.loads(line)))
    return ds


@pytest.fixture
def made(tmp_path: Path) -> Path:
    """A dataset of 10 samples in 3 shards, and its source tmp_path/src.jsonl."""
    return write_dataset(write_jsonl(tmp_path / "src.jsonl", 10), tmp_path / "ds")


def move_shards_behind_a_link(ds: Path, there: Path) -> None:
    there.mkdir(exist_ok=True)
    for p in (ds / SHARD_DIR).iterdir():
        shutil.move(p, there / p.name)
    (ds / SHARD_DIR).rmdir()
    (ds / SHARD_DIR).symlink_to(there)


# A linked shards/ -------------------------------------------------------------------------
def test_a_linked_shards_folder_is_refused_and_nothing_there_is_touched(made: Path, tmp_path: Path):
    """The issue's repro: shards moved to a folder holding an unrelated model file, shards/
    linked there, convert rerun into the dataset: the unrelated file used to be gone."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "model-00001-of-00002.safetensors").write_bytes(b"someone else's weights")
    move_shards_behind_a_link(made, models)
    # Debris a crash could leave, in the linked folder: a writer must not reach it either.
    (models / "r0-0badc0de-000000.safetensors").write_bytes(b"sealed, never committed")
    (models / "r0-0badc0de-000001.safetensors.tmp").write_bytes(b"half")
    before = snapshot(models)
    manifest = (made / MANIFEST).read_bytes()

    message = one_error(convert(tmp_path / "src.jsonl", made))
    assert f"{made / SHARD_DIR}: a symbolic link (to {models})" in message
    assert "ln -s" in message  # the way out: link the whole dataset directory instead
    with pytest.raises(DatasetError, match="symbolic link"):
        DatasetWriter(made, mode="overwrite", config={"stage": "convert", "source": "src.jsonl"})
    assert snapshot(models) == before
    assert (made / MANIFEST).read_bytes() == manifest

    # Readers say the same (and never call the other files leftovers to be removed).
    assert "symbolic link" in one_error(run_cli("info", made))
    with pytest.raises(DatasetError, match="symbolic link"):
        Dataset(made)

    # The way out works: the whole dataset directory moved and linked.
    (made / SHARD_DIR).unlink()
    (made / SHARD_DIR).mkdir()
    for name in json.loads(manifest)["shards"]:
        shutil.copy(models / name["name"], made / SHARD_DIR / name["name"])
    elsewhere = tmp_path / "disk" / "ds"
    elsewhere.parent.mkdir()
    shutil.move(made, elsewhere)
    made.symlink_to(elsewhere)
    assert convert(tmp_path / "src.jsonl", made).returncode == 0
    assert len(Dataset(made)) == 10
    assert snapshot(models) == before


def test_two_datasets_linked_to_one_folder_cannot_destroy_each_other(tmp_path: Path):
    shared = tmp_path / "shared"
    for name in ("a", "b"):
        write_dataset(write_jsonl(tmp_path / f"{name}.jsonl", 6, tag=name), tmp_path / name)
        move_shards_behind_a_link(tmp_path / name, shared)
    before = snapshot(shared)
    assert len(before) == 4  # two shards of each: to either dataset, two are "orphans"

    for name in ("a", "b"):
        for mode in ("auto", "overwrite"):
            with pytest.raises(DatasetError, match="symbolic link"):
                DatasetWriter(
                    tmp_path / name,
                    mode=mode,
                    config={"stage": "convert", "source": f"{name}.jsonl"},
                )
    assert snapshot(shared) == before
    assert "symbolic link" in one_error(convert(tmp_path / "a.jsonl", tmp_path / "a"))
    assert snapshot(shared) == before


def test_overwrite_never_unlinks_through_a_linked_tokenizer_folder(tmp_path: Path):
    ds = tmp_path / "ds"
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text("{}")
    with DatasetWriter(ds, config={"stage": "test"}) as writer:
        writer.store_files("tokenizer", [tok / "tokenizer.json"])
        writer.add(TokenSample("x", [1], [2]))
    mine = tmp_path / "my-tokenizer"
    mine.mkdir()
    (mine / "tokenizer.json").write_text('{"mine": true}')
    (mine / "notes.txt").write_text("keep")
    shutil.rmtree(ds / "tokenizer")
    (ds / "tokenizer").symlink_to(mine)
    before = snapshot(mine)

    for mode in ("overwrite", "auto"):
        with pytest.raises(DatasetError, match=r"tokenizer: a symbolic link") as refused:
            DatasetWriter(ds, mode=mode, config={"stage": "test"})
        assert "NotADirectory" not in str(refused.value)
    assert snapshot(mine) == before
    assert len(Dataset(ds)) == 1  # refused before anything was wiped


# What a writer removes --------------------------------------------------------------------
def test_a_writer_removes_only_the_debris_it_can_have_made(made: Path):
    """Temp files and uncommitted shards by the writers' own names go; any other file stays,
    wherever it is, even when its name ends in .tmp or .safetensors."""
    shards = made / SHARD_DIR
    committed = {e["name"] for e in json.loads((made / MANIFEST).read_text())["shards"]}
    ours = [
        shards / "r0-0badc0de-000000.safetensors",
        shards / "r3-0badc0de-000012.safetensors.tmp",
        made / f"{MANIFEST}.4242.tmp",
        made / ".owner.json.17.tmp",
    ]
    (made / "tokenizer").mkdir()
    ours.append(made / "tokenizer" / "tokenizer.json.99.tmp")
    (made / "extra").mkdir()
    theirs = [
        shards / "model-00001-of-00002.safetensors",
        shards / "notes.tmp",
        shards / "r0-NOTHEX0-000000.safetensors",
        made / "tokenizer" / "draft.tmp",
        made / "extra" / "draft.tmp",
        made / "extra" / "r0-0badc0de-000000.safetensors",
        made / "results.tmp",
    ]
    for p in [*ours, *theirs]:
        p.write_bytes(b"x")
    outside = made.parent / "outside.safetensors"
    outside.write_bytes(b"not yours")
    (shards / "r0-0badc0de-000002.safetensors").symlink_to(outside)  # a link, not a shard

    temps, orphans = Dataset(made, warn_stray=False).stray_files()
    assert sorted([*temps, *orphans]) == sorted(ours)
    with DatasetWriter(made, config={"stage": "convert", "source": "src.jsonl"}) as writer:
        assert sorted(writer.removed_on_open) == sorted(ours)
    assert not any(p.exists() for p in ours)
    assert all(p.read_bytes() == b"x" for p in theirs)
    assert outside.read_bytes() == b"not yours"
    assert (shards / "r0-0badc0de-000002.safetensors").is_symlink()
    assert committed <= {p.name for p in shards.iterdir()}


def test_overwrite_removes_the_dataset_and_nothing_else(tmp_path: Path):
    ds = tmp_path / "ds"
    tok = tmp_path / "tok"
    tok.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tok / name).write_text(name)
    with DatasetWriter(
        ds, config={"stage": "convert", "source": "src.jsonl"}, commit_every=2
    ) as writer:
        writer.store_files("tokenizer", sorted(tok.iterdir()))
        for i in range(5):
            writer.add(TokenSample(f"old-{i}", [1, 2], [3]))
    old_shards = {p.name for p in (ds / SHARD_DIR).iterdir()}
    assert json.loads((ds / MANIFEST).read_text())["attached"] == {
        "tokenizer": ["tokenizer.json", "tokenizer_config.json"]
    }
    keep = [ds / SHARD_DIR / "README.txt", ds / "tokenizer" / "my-notes.txt", ds / "NOTES.md"]
    for p in keep:
        p.write_text("keep")

    result = convert(write_jsonl(tmp_path / "src.jsonl", 3), ds, "--overwrite")
    assert result.returncode == 0, result.stderr
    assert all(p.read_text() == "keep" for p in keep)
    assert not old_shards & {p.name for p in (ds / SHARD_DIR).iterdir()}
    assert sorted(p.name for p in (ds / "tokenizer").iterdir()) == ["my-notes.txt"]
    assert sorted(s.sample_id for s in Dataset(ds)) == ["s-0", "s-1", "s-2"]


def test_overwrite_is_the_way_out_of_a_damaged_manifest(made: Path, tmp_path: Path):
    (made / MANIFEST).write_bytes(b'{"format": "eagle3kit-dataset", "shards": [')
    (made / SHARD_DIR / "mine.txt").write_text("keep")
    with pytest.raises(DatasetError, match="not valid JSON"):
        DatasetWriter(made, config={"stage": "convert", "source": "src.jsonl"})
    result = convert(tmp_path / "src.jsonl", made, "--overwrite")
    assert result.returncode == 0, result.stderr
    assert len(Dataset(made)) == 10 and Dataset(made).verify() == []
    assert (made / SHARD_DIR / "mine.txt").read_text() == "keep"


def test_a_link_planted_at_a_temp_name_is_not_written_through(made: Path, tmp_path: Path):
    """A writer's temp name is predictable (`manifest.json.<pid>.tmp`): a link planted there
    must not make the writer overwrite the file it points to."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (made / f"{MANIFEST}.{os.getpid()}.tmp").symlink_to(victim)
    with pytest.raises(DatasetError, match="cannot write"):
        DatasetWriter(made, config={"stage": "convert", "source": "src.jsonl"})
    assert victim.read_text() == "precious"
    assert len(Dataset(made, warn_stray=False)) == 10


# A directory that cannot be written -------------------------------------------------------
def read_only(path: Path) -> tuple[str, ...]:
    """A command prefix under which `path` cannot be written: a read-only bind mount in a
    user namespace when running as root (root writes through any mode bits), else chmod."""
    if os.geteuid() != 0:
        for p in [path, *path.rglob("*")]:
            p.chmod(p.stat().st_mode & ~0o222)
        return ()
    if shutil.which("unshare") is None:
        pytest.skip("running as root without unshare: no way to make a read-only directory")
    probe = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True
    )
    if probe.returncode != 0:
        pytest.skip(f"unshare refused here: {probe.stderr.decode().strip()}")
    return (
        "unshare",
        "--user",
        "--map-root-user",
        "--mount",
        "sh",
        "-c",
        f'mount --bind -o ro "{path}" "{path}" && exec "$0" "$@"',
    )


def test_a_read_only_dataset_is_one_message_and_still_readable(made: Path, tmp_path: Path):
    before = snapshot(made)
    prefix = read_only(made)
    message = one_error(run_cli("convert", tmp_path / "src.jsonl", made, "-q", prefix=prefix))
    assert message.startswith(f"error: {made}: cannot write to the dataset")
    assert "writable" in message
    info = run_cli("info", made, prefix=prefix)
    assert info.returncode == 0, info.stderr
    assert snapshot(made) == before


def test_a_file_where_the_dataset_folder_should_be_is_one_message(made: Path, tmp_path: Path):
    shutil.rmtree(made / SHARD_DIR)
    (made / SHARD_DIR).write_text("not a folder")
    with pytest.raises(DatasetError, match=f"{made / SHARD_DIR}: not a folder"):
        DatasetWriter(made, config={"stage": "convert", "source": "src.jsonl"})
    assert (made / MARKER).is_file()

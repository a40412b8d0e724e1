"""train --report-to: each tracker installed here gets a short real run's metrics, read back by
the tracker's own reader; a tracker that raises on every call changes nothing in training.

The tiny target and datasets are conftest's `train_world`.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import prewarmed
import pytest
import torch
from tiny_train import config, env, metrics, train_cmd, weights

from eagle3kit.errors import UserError
from eagle3kit.train import run
from eagle3kit.train import trackers as trackers_module
from eagle3kit.train.loop import TrainLoop

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TIMING = ("time", "elapsed", "tokens_per_s")


def steps_logged(run_dir: Path) -> list[dict]:
    return [m for m in metrics(run_dir) if "loss" in m]


def evals_logged(run_dir: Path) -> list[dict]:
    return [m for m in metrics(run_dir) if "eval" in m]


def test_unknown_tracker_is_refused_naming_the_flag(train_world, tmp_path):
    with pytest.raises(UserError) as caught:
        config(
            train_world, train_world["hidden"], tmp_path / "run", report_to="tensorboard,neptune"
        )
    assert str(caught.value) == (
        "--report-to: unknown tracker neptune (known: none, tensorboard, wandb, mlflow, trackio)"
    )
    cmd = [
        *prewarmed.argv(),
        *train_cmd(train_world, tmp_path / "run", "--report-to", "comet"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: --report-to: unknown tracker comet (known: none, tensorboard, wandb, mlflow, "
        "trackio)"
    ]
    assert not (tmp_path / "run").exists()


def test_tensorboard_reads_back_the_metrics_train_logged(train_world, tmp_path):
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    run(config(train_world, train_world["hidden"], out, report_to="tensorboard"))
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    logged = steps_logged(out)
    assert [m["step"] for m in logged] == [1, 2, 3, 4]
    for key, name in (("train/loss", "loss"), ("train/lr", "lr"), ("train/grad_norm", "grad_norm")):
        read = events.Scalars(key)
        assert [e.step for e in read] == [1, 2, 3, 4]
        assert [e.value for e in read] == pytest.approx([m[name] for m in logged], rel=1e-6)
    accuracy = events.Scalars("train/accuracy_step_2")
    assert [e.value for e in accuracy] == pytest.approx([m["acc_k"][1] for m in logged], rel=1e-6)
    held_out = events.Scalars("eval/acceptance_length")
    assert [e.step for e in held_out] == [m["step"] for m in evals_logged(out)] == [0, 2, 4]
    assert [e.value for e in held_out] == pytest.approx(
        [m["eval"]["predicted_acceptance_length"] for m in evals_logged(out)], rel=1e-6
    )
    assert events.Tags()["tensors"] == ["config/text_summary"]  # the settings, logged once


def test_mlflow_local_store_holds_the_metrics_and_resume_continues_its_run(
    train_world, tmp_path, monkeypatch
):
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    out = tmp_path / "run"
    original, calls = TrainLoop.step, {"n": 0}

    def dies_at_step_3(self, batch):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return original(self, batch)

    monkeypatch.setattr(TrainLoop, "step", dies_at_step_3)
    with pytest.raises(KeyboardInterrupt):
        run(config(train_world, train_world["hidden"], out, report_to="mlflow"))
    recorded = json.loads((out / "run.json").read_text())["trackers"]["mlflow"]
    run_id = recorded["id"]
    assert recorded["uri"] == f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setattr(TrainLoop, "step", original)
    run(config(train_world, train_world["hidden"], out, report_to="mlflow"))  # resumes from step 2
    assert json.loads((out / "run.json").read_text())["trackers"] == {"mlflow": recorded}

    client = MlflowClient()
    history = sorted(client.get_metric_history(run_id, "train/loss"), key=lambda m: m.step)
    logged = steps_logged(out)
    assert [m.step for m in history] == [m["step"] for m in logged] == [1, 2, 3, 4]
    assert [m.value for m in history] == [m["loss"] for m in logged]
    rates = client.get_metric_history(run_id, "eval/accept_rate_1")
    assert sorted(m.step for m in rates) == [0, 2, 4]
    finished = client.get_run(run_id)
    assert finished.info.status == "FINISHED"
    assert finished.data.params["settings.lr"] == "0.003"  # the config, logged once
    assert len(client.search_runs([finished.info.experiment_id])) == 1


def test_wandb_offline_writes_its_run_directory(train_world, tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="the wandb extra is not installed")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    run(config(train_world, train_world["hidden"], out, report_to="wandb"))
    run_id = json.loads((out / "run.json").read_text())["trackers"]["wandb"]
    (run_files,) = (tmp_path / "wandb").glob(f"offline-run-*-{run_id}")
    history = wandb_history(run_files / f"run-{run_id}.wandb")
    logged = steps_logged(out)
    losses = {h["_step"]: h["train/loss"] for h in history if "train/loss" in h}
    assert losses == {m["step"]: m["loss"] for m in logged}
    held_out = {
        h["_step"]: h["eval/acceptance_length"] for h in history if "eval/acceptance_length" in h
    }
    assert held_out == {
        m["step"]: m["eval"]["predicted_acceptance_length"] for m in evals_logged(out)
    }


def wandb_history(path: Path) -> list[dict]:
    """The history rows of a .wandb file: its records (LevelDB's log framing: 32 KiB blocks,
    7-byte headers, records split as FULL/FIRST/MIDDLE/LAST) decoded with wandb's own
    protobuf `Record` (wandb 0.31 keeps its file reader in the Go core, not in Python)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, pieces, rows = 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if left < 7 or (kind == 0 and length == 0):  # a block's zero padding
            pos += left
            continue
        pieces += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            pieces = b""
            if record.WhichOneof("record_type") == "history":
                rows.append(
                    {
                        item.key or "/".join(item.nested_key): json.loads(item.value_json)
                        for item in record.history.item
                    }
                )
    return rows


class Raising:
    """A tracker whose every call raises, as one that cannot reach its server."""

    def __init__(self, *args: object) -> None:
        raise ConnectionError("tracker server unreachable")


class RaisingLater:
    def __init__(self, *args: object) -> None:
        pass

    def start(self, config: dict, resume_id: str | None) -> str | None:
        raise ConnectionError("connection lost")

    log = finish = start


@pytest.mark.parametrize("adapter", [Raising, RaisingLater])
def test_a_failing_tracker_is_warned_once_and_changes_nothing(
    train_world, tmp_path, monkeypatch, capsys, adapter
):
    plain = tmp_path / "plain"
    run(config(train_world, train_world["hidden"], plain))
    capsys.readouterr()
    monkeypatch.setitem(trackers_module.ADAPTERS, "tensorboard", adapter)
    tracked = tmp_path / "tracked"
    run(config(train_world, train_world["hidden"], tracked, report_to="tensorboard"))
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "--report-to tensorboard: ConnectionError" in warnings[0]
    a, b = weights(plain), weights(tracked)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    strip = [
        [{k: v for k, v in m.items() if k not in TIMING} for m in metrics(d)]
        for d in (plain, tracked)
    ]
    assert strip[0] == strip[1]


def test_trackio_local_store_holds_the_metrics(train_world, tmp_path):
    pytest.importorskip("trackio", reason="the trackio extra is not installed")
    out = tmp_path / "run"
    cmd = [
        *prewarmed.argv(),
        *train_cmd(
            train_world,
            out,
            "--max-steps",
            "4",
            "--eval-every",
            "2",
            "--report-to",
            "trackio",
            "--json",
        ),
    ]
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**env(), "TRACKIO_DIR": str(tmp_path / "trackio"), "TRACKIO_PROJECT": "tiny"},
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["steps"] == 4  # stdout stays the result alone
    assert json.loads((out / "run.json").read_text())["trackers"] == {"trackio": "run"}
    probe = (
        "import json, sys; from trackio.sqlite_storage import SQLiteStorage as S; "
        "print(json.dumps(S.get_logs('tiny', 'run')))"
    )
    read = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=300,
        env={**env(), "TRACKIO_DIR": str(tmp_path / "trackio")},
    )
    assert read.returncode == 0, read.stderr
    rows = json.loads(read.stdout.strip().splitlines()[-1])
    losses = {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}
    assert losses == {m["step"]: m["loss"] for m in steps_logged(out)}
    held_out = {
        r["step"]: r["eval/acceptance_length"] for r in rows if "eval/acceptance_length" in r
    }
    assert held_out == {
        m["step"]: m["eval"]["predicted_acceptance_length"] for m in evals_logged(out)
    }


# Whose tracker run it is (issue 38, item 9) ----------------------------------------------------
def test_the_run_identity_is_a_token_of_the_directory_and_its_place(tmp_path, capsys):
    from eagle3kit.train.trackers import TOKEN_FILE, run_identity

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    first = run_identity(run_dir)
    assert first is not None and first == run_identity(run_dir)
    token = run_dir / TOKEN_FILE
    assert token.stat().st_mode & 0o077 == 0  # owner-only
    assert first not in token.read_text()  # the hash, never the token, leaves the directory
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / TOKEN_FILE).write_bytes(token.read_bytes())
    assert run_identity(copy) not in (None, first)  # a copy elsewhere is another run
    capsys.readouterr()
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / TOKEN_FILE).symlink_to(token)  # a link to a real token is not taken
    assert run_identity(linked) is None
    dangling = tmp_path / "dangling"
    dangling.mkdir()
    (dangling / TOKEN_FILE).symlink_to(tmp_path / "outside")
    assert run_identity(dangling) is None
    assert not (tmp_path / "outside").exists()  # nothing written through the link
    warned = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warned) == 2 and f"{TOKEN_FILE} is not the token eagle3kit writes" in warned[0]


def test_mlflow_continues_only_its_own_run_and_stores_in_the_run_by_default(
    train_world, tmp_path, monkeypatch, capsys
):
    """Without MLFLOW_TRACKING_URI the store is RUN/mlflow.db, not the working directory's.
    A run.json edited to name another run in that store (someone's on a shared server), and a
    run directory copied whole, each start a new MLflow run with a note; the other run is
    neither reopened, logged into nor terminated."""
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    run(config(train_world, train_world["hidden"], out, report_to="mlflow", max_steps=2))
    assert (out / "mlflow.db").is_file()
    assert not [p.name for p in tmp_path.iterdir() if p.name in ("mlflow.db", "mlruns")]
    own = json.loads((out / "run.json").read_text())["trackers"]["mlflow"]
    uri = own["uri"]
    assert uri == f"sqlite:///{out / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)

    theirs = client.create_run(
        client.get_run(own["id"]).info.experiment_id, run_name="someone else's"
    ).info.run_id
    client.set_terminated(theirs)
    before = client.get_run(theirs)
    record = json.loads((out / "run.json").read_text())
    record["trackers"] = {"mlflow": {"id": theirs, "uri": uri}}
    (out / "run.json").write_text(json.dumps(record))
    capsys.readouterr()
    run(config(train_world, train_world["hidden"], out, report_to="mlflow", max_steps=2))
    notes = [line for line in capsys.readouterr().err.splitlines() if "--report-to" in line]
    assert notes == [
        f"warning: --report-to mlflow: run.json names MLflow run {theirs}, which "
        "is not this run's own (its tag is not this run directory's identity); "
        "starting a new MLflow run"
    ]
    after = client.get_run(theirs)
    assert (after.info.status, after.info.end_time) == (before.info.status, before.info.end_time)
    assert after.data.metrics == {} and after.data.params == {}
    new = json.loads((out / "run.json").read_text())["trackers"]["mlflow"]["id"]
    assert new not in (theirs, own["id"])

    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    run(config(train_world, train_world["hidden"], copy, report_to="mlflow", max_steps=2))
    copied = json.loads((copy / "run.json").read_text())["trackers"]["mlflow"]
    assert copied["id"] != new and copied["uri"] == f"sqlite:///{copy / 'mlflow.db'}"
    assert "another tracking URI" in capsys.readouterr().err


def test_wandb_resumes_no_id_run_json_names_and_writes_into_the_run(
    train_world, tmp_path, monkeypatch, capsys
):
    pytest.importorskip("wandb", reason="the wandb extra is not installed")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    run(config(train_world, train_world["hidden"], out, report_to="wandb", max_steps=2))
    own = json.loads((out / "run.json").read_text())["trackers"]["wandb"]
    assert list((out / "wandb").glob(f"offline-run-*-{own}"))
    assert not (tmp_path / "wandb").exists()  # not the working directory

    record = json.loads((out / "run.json").read_text())
    record["trackers"] = {"wandb": "theirs1"}
    (out / "run.json").write_text(json.dumps(record))
    capsys.readouterr()
    run(config(train_world, train_world["hidden"], out, report_to="wandb", max_steps=2))
    assert (
        "--report-to wandb: run.json names W&B run theirs1, which is not this run's own"
        in capsys.readouterr().err
    )
    assert not list((out / "wandb").glob("*-theirs1"))
    assert json.loads((out / "run.json").read_text())["trackers"] == {"wandb": own}

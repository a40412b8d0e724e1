"""`train --online --server`: the drafter trains on states fetched from vLLM servers
running extract_hidden_states, here the loopback stand-in (testkit/fake_vllm_hidden.py: the
real tiny target, files written as vLLM writes them). The real engine: tests/vllm/.

The reference for every comparison is `train` on `extract --engine vllm` output of the same
server: the states are the same numbers, so the steps must be too.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from fake_vllm_hidden import FakeVllmHidden
from tiny_train import QUIET, env, losses, torchrun, weights

from eagle3kit import extract
from eagle3kit.errors import UserError
from eagle3kit.extract.vllm import ServerError
from eagle3kit.format import Dataset
from eagle3kit.train import TrainConfig, run
from eagle3kit.train import data as tdata

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SERVED_IDS = [2, 4, 5, 8]
"""The default aux ids of the 8-layer target, then N = 8 for the last pre-norm state."""


@pytest.fixture(scope="module")
def served(train_world, tmp_path_factory):
    """One stand-in server for the module, and the hidden dataset extract reads from it."""
    root = tmp_path_factory.mktemp("served")
    server = FakeVllmHidden(train_world["target"], root / "storage", SERVED_IDS).start()
    hidden = root / "hidden"
    extract.run(
        extract.ExtractConfig(
            train_world["tokens"],
            hidden,
            target=train_world["target"],
            engine="vllm",
            server=server.url,
            concurrency=4,
            hidden_states_dir=root / "storage",
            output=QUIET,
        )
    )
    server.requests.clear()
    yield {"server": server, "storage": root / "storage", "hidden": hidden}
    server.stop()


def options(**kw) -> dict:
    out = dict(
        max_steps=6,
        batch_tokens=128,
        draft_vocab=200,
        eval_split=4,
        eval_every=3,
        checkpoint_every=3,
        lr=3e-3,
        warmup=1,
        device="cpu",
        output=QUIET,
    )
    out.update(kw)
    return out


def online(train_world, servers: list[str], out: Path, storage: Path, **kw) -> TrainConfig:
    return TrainConfig(
        [train_world["tokens"]],
        out,
        train_world["target"],
        online=True,
        servers=servers,
        hidden_states_dir=storage,
        **options(**kw),
    )


def requested(server: FakeVllmHidden) -> Counter:
    return Counter(tuple(r["prompt"]) for r in server.requests)


def plan_samples(train_world, parts: int = 1, **kw) -> list[list[tuple[int, ...]]]:
    """Per step, the token ids of its samples (as trained: truncated), from the plan of
    `parts` micro-batches a step (ranks x --grad-accum)."""
    cfg = online(train_world, ["http://127.0.0.1:9"], Path("unused"), Path("."), **kw)
    sources = [tdata.open_source(train_world["tokens"], 1.0, True)]
    pool = tdata.build_pool(
        sources, tdata.held_out(sources, cfg.eval_split), None, cfg.long_samples
    )
    plan = tdata.make_plan(
        pool, [1.0], cfg.seed, cfg.batch_tokens, parts, cfg.epochs, cfg.max_steps
    )
    out = []
    for step in range(plan.total_steps):
        # as the ranks take them, one after the other
        items = [it for part in tdata.split_parts(plan.step(step)[1], parts) for it in part]
        out.append([tuple(sources[0].tokens(it.index)[0][: it.length].tolist()) for it in items])
    return out


def test_two_servers_train_as_extract_then_train_and_leave_no_file(train_world, served, tmp_path):
    """Two servers (the second a copy on other storage, 2 slots): the same losses, drafter
    and held-out acceptance as offline training on extract's output; every file deleted.
    Offline, --fc-scale auto measures the states; given that number, --server (whose
    default is off) trains alike."""
    offline = run(
        TrainConfig([served["hidden"]], tmp_path / "off", train_world["target"], **options())
    )
    scale = offline.metrics["fc_scale"]
    # The second server writes into a folder inside the first's: one --hidden-states-dir.
    second = served["storage"] / "second"
    other = FakeVllmHidden(train_world["target"], second, SERVED_IDS).start()
    try:
        result = run(
            online(
                train_world,
                [served["server"].url, f"{other.url}@2"],
                tmp_path / "srv",
                served["storage"],
                prefetch=5,
                fc_scale=str(scale),
            )
        )
    finally:
        other.stop()
    assert result.metrics["fc_scale"] == scale
    assert list(second.iterdir()) == []
    second.rmdir()
    assert losses(tmp_path / "srv") == losses(tmp_path / "off")
    a, b = weights(tmp_path / "srv"), weights(tmp_path / "off")
    assert all(np.array_equal(a[k].numpy(), b[k].numpy()) for k in a)
    assert result.eval == offline.eval
    assert served["server"].requests and other.requests  # both took work
    assert list(served["storage"].iterdir()) == []
    stats = result.metrics["served"]
    assert stats["peak_bytes"] > 0 and stats["pauses"] == 0
    info = json.loads((tmp_path / "srv" / "run.json").read_text())
    assert info["mode"] == "online-server"


def test_each_training_sample_is_fetched_once_in_plan_order(train_world, served, tmp_path):
    server = served["server"]
    server.requests.clear()
    run(
        online(
            train_world,
            [f"{server.url}@1"],
            tmp_path / "r",
            served["storage"],
            eval_split=0,
            prefetch=1,
        )
    )
    steps = plan_samples(train_world, eval_split=0)
    order = [ids for step in steps for ids in step]
    # One slot, one sample ahead: the requests are the plan's samples, each once, in the
    # order the steps take them.
    assert [tuple(r["prompt"]) for r in server.requests] == order


def cmd(train_world, out: Path, url: str, *extra: str, storage: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "eagle3kit",
        "train",
        str(train_world["tokens"]),
        str(out),
        "--online",
        "--server",
        url,
        "--hidden-states-dir",
        str(storage),
        "--target",
        str(train_world["target"]),
        "--device",
        "cpu",
        "--batch-tokens",
        "128",
        "--draft-vocab",
        "200",
        "--eval-split",
        "0",
        "--lr",
        "3e-3",
        "--warmup",
        "1",
        "--no-progress",
        *extra,
    ]


@pytest.mark.timeout(900)
def test_sigkill_then_resume_consumes_every_sample_exactly_once(train_world, tmp_path):
    """Counted on the server: the resumed run asks for exactly the samples of the steps
    after the last checkpoint, each once; the killed run asked for those before it (and
    some prefetched ahead, thrown away with the process). The drafter equals one trained
    without the kill."""
    server = FakeVllmHidden(
        train_world["target"], tmp_path / "storage", SERVED_IDS, write_delay_s=0.03
    ).start()
    try:
        args = ["--max-steps", "10", "--checkpoint-every", "2", "--prefetch", "4"]
        proc = subprocess.Popen(
            cmd(
                train_world,
                tmp_path / "cut",
                f"{server.url}@1",
                *args,
                storage=tmp_path / "storage",
            ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env(),
        )
        ckpts = tmp_path / "cut" / "checkpoints"
        deadline = time.monotonic() + 300
        while not (ckpts / "step-00000004").is_dir():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        from eagle3kit.checkpoints.rundir import RunDir

        k = RunDir(tmp_path / "cut").steps()[-1]
        assert 4 <= k < 10
        first = requested(server)
        server.requests.clear()
        done = subprocess.run(
            cmd(
                train_world,
                tmp_path / "cut",
                f"{server.url}@1",
                *args,
                storage=tmp_path / "storage",
            ),
            capture_output=True,
            text=True,
            env=env(),
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        second = requested(server)
    finally:
        server.stop()
    steps = plan_samples(train_world, eval_split=0, max_steps=10)
    before = Counter(ids for step in steps[:k] for ids in step)
    after = Counter(ids for step in steps[k:] for ids in step)
    assert second == after  # exactly what the checkpoint says is left, each once
    assert not first - (before + after) and before <= first  # (<=: Counter inclusion)
    assert before + second == Counter(ids for step in steps for ids in step)
    assert max((before + second).values()) == 1  # every sample exactly once
    whole = tmp_path / "whole"
    reference = FakeVllmHidden(train_world["target"], tmp_path / "storage", SERVED_IDS).start()
    try:
        run(
            online(
                train_world,
                [reference.url],
                whole,
                tmp_path / "storage",
                eval_split=0,
                max_steps=10,
                checkpoint_every=2,
            )
        )
    finally:
        reference.stop()
    a, b = weights(whole), weights(tmp_path / "cut")
    assert all(np.array_equal(a[n].numpy(), b[n].numpy()) for n in a)
    assert losses(tmp_path / "cut") == losses(whole)
    # The killed process's request in flight (one slot) is the only file nobody read.
    assert len(list((tmp_path / "storage").glob("*.safetensors"))) <= 1


def test_a_server_restart_mid_run_pauses_training_and_it_continues(
    train_world, served, tmp_path, capfd
):
    """The server goes away after some requests and comes back on its port 2 s later: the
    run waits, polls /health, resumes, and takes the steps an uninterrupted run takes."""
    storage = tmp_path / "storage"
    first = FakeVllmHidden(train_world["target"], storage, SERVED_IDS).start()
    port = int(first.url.rsplit(":", 1)[1])
    later: list[FakeVllmHidden] = []

    def restart() -> None:
        while len(first.requests) < 12:
            time.sleep(0.01)
        first.stop()
        time.sleep(2.0)
        later.append(FakeVllmHidden(train_world["target"], storage, SERVED_IDS, port=port).start())

    thread = threading.Thread(target=restart, daemon=True)
    thread.start()
    try:
        result = run(online(train_world, [first.url], tmp_path / "r", storage, prefetch=2))
    finally:
        thread.join(timeout=30)
        for s in later:
            s.stop()
    assert later and later[0].requests  # the restarted server did part of the run
    assert result.metrics["served"]["pauses"] >= 1
    err = capfd.readouterr().err
    assert "not answering" in err and "/health is polled" in err and "back; resuming" in err
    reference = run(
        online(train_world, [served["server"].url], tmp_path / "ref", served["storage"], prefetch=2)
    )
    assert losses(tmp_path / "r") == losses(tmp_path / "ref")
    assert result.eval == reference.eval
    assert list(storage.glob("*.safetensors")) == []


def test_a_server_without_the_last_layer_is_refused_at_the_first_sample(train_world, tmp_path):
    server = FakeVllmHidden(train_world["target"], tmp_path / "storage", [2, 4, 5]).start()
    try:
        began = time.monotonic()
        with pytest.raises(ServerError, match=r"eagle_aux_hidden_state_layer_ids = \[2, 4, 5"):
            run(online(train_world, [server.url], tmp_path / "r", tmp_path / "storage"))
        assert time.monotonic() - began < 60
    finally:
        server.stop()
    assert not (tmp_path / "r" / "checkpoints").exists() or not any(
        (tmp_path / "r" / "checkpoints").iterdir()
    )


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"online": False}, "--server applies to --online training"),
        ({"servers": ["http://127.0.0.1:9", "127.0.0.1:9"]}, "the same server is given twice"),
        ({"servers": ["http://127.0.0.1:9@x"]}, "concurrency after @"),
        ({"prefetch": 0}, "--prefetch must be >= 1"),
    ],
)
def test_bad_server_options_are_one_message(train_world, tmp_path, kw, message):
    settings = dict(online=True, servers=["http://127.0.0.1:9"], **options())
    settings.update(kw)
    with pytest.raises(UserError, match=message):
        TrainConfig([train_world["tokens"]], tmp_path / "r", train_world["target"], **settings)


def test_an_unreachable_server_is_one_line_from_the_cli(train_world, tmp_path):
    proc = subprocess.run(
        cmd(train_world, tmp_path / "r", "http://127.0.0.1:9", storage=tmp_path),
        capture_output=True,
        text=True,
        env=env(),
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert "cannot list its models" in proc.stderr and "Traceback" not in proc.stderr
    assert Dataset(train_world["tokens"]).verify() == []  # the input is untouched


@pytest.mark.slow  # a subprocess or a 3 s stall: kept out of the default run
def test_a_stalled_server_pauses_training_and_it_continues(train_world, served, tmp_path, capfd):
    """Requests hang past --request-timeout for 3 s (the engine is stuck; /health still
    answers): the server is paused and retried, the run ends as an uninterrupted one does."""
    storage = tmp_path / "storage"
    server = FakeVllmHidden(train_world["target"], storage, SERVED_IDS).start()

    def stall() -> None:
        while len(server.requests) < 10:
            time.sleep(0.01)
        server.stall_until = time.monotonic() + 3.0

    thread = threading.Thread(target=stall, daemon=True)
    thread.start()
    try:
        began = time.monotonic()
        result = run(
            online(
                train_world, [server.url], tmp_path / "r", storage, prefetch=2, request_timeout=1.0
            )
        )
        took = time.monotonic() - began
    finally:
        thread.join(timeout=30)
        server.stop()
    assert result.metrics["served"]["pauses"] >= 1 and took >= 3.0
    assert "not answering" in capfd.readouterr().err
    run(
        online(train_world, [served["server"].url], tmp_path / "ref", served["storage"], prefetch=2)
    )
    assert losses(tmp_path / "r") == losses(tmp_path / "ref")
    assert list(storage.glob("*.safetensors")) == []


@pytest.mark.slow  # a subprocess or a 3 s stall: kept out of the default run
def test_the_status_line_shows_the_server_side_and_the_trainer_side(train_world, served, tmp_path):
    """Off a terminal, status lines carry the trainer's tok/s beside the servers' served
    tok/s and the share of time the trainer waited: which side is slower (here the server,
    one request at a time with a slow write: the trainer waits)."""
    server = served["server"]
    server.write_delay_s = 0.05  # a slow server: the trainer waits for it
    try:
        proc = subprocess.run(
            cmd(
                train_world,
                tmp_path / "r",
                server.url,
                "--max-steps",
                "6",
                "--log-every",
                "0.2",
                "--concurrency",
                "1",
                storage=served["storage"],
            ),
            capture_output=True,
            text=True,
            env=env(),
            timeout=300,
        )
    finally:
        server.write_delay_s = 0.0
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if "served tok/s" in ln]
    assert lines, proc.stderr[-3000:]
    last = lines[-1]
    trainer = re.search(r"steps/s ([0-9.]+) tok/s", last)
    server_side = re.search(r"served tok/s ([0-9.]+)", last)
    waiting = re.search(r"waiting % ([0-9.]+)", last)
    assert trainer and server_side and waiting, last
    assert float(trainer[1]) > 0 and float(server_side[1]) > 0 and float(waiting[1]) > 0
    assert "states from 1 server(s), 1 requests in flight" in proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(1800)  # torchrun with 2 gloo processes, on busy cores
def test_under_torchrun_each_rank_fetches_its_own_share(train_world, served, tmp_path):
    """Two ranks on one server: every training sample of the plan is asked for exactly once
    over both ranks, and the steps equal one process with --grad-accum 2."""
    server = served["server"]
    server.requests.clear()
    argv = torchrun(
        *cmd(
            train_world, tmp_path / "two", server.url, "--max-steps", "6", storage=served["storage"]
        )[3:]
    )
    proc = subprocess.run(argv, capture_output=True, text=True, env=env(), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    asked = requested(server)
    plan = Counter(
        ids
        for step in plan_samples(train_world, parts=2, eval_split=0, max_steps=6)
        for ids in step
    )
    assert asked == plan and max(asked.values()) == 1
    run(
        online(
            train_world,
            [server.url],
            tmp_path / "one",
            served["storage"],
            eval_split=0,
            grad_accum=2,
        )
    )
    np.testing.assert_allclose(losses(tmp_path / "two"), losses(tmp_path / "one"), rtol=1e-5)

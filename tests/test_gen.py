"""gen end to end against the loopback server: exact ids, resume, faults, errors."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import orjson
import prewarmed
import pytest
from fakeserver import FakeServer
from real_tokenizers import qwen3_tokenizer_dir

from eagle3kit import gen
from eagle3kit._options import WRITE_KEYS, WriteOptions
from eagle3kit._ui import OutputOptions
from eagle3kit.format import Dataset
from eagle3kit.gen.config import ServerSpec

DATA = Path(__file__).parent / "data"
MT_BENCH = DATA / "prompts" / "eagle" / "mt_bench" / "question.jsonl"
GSM8K = DATA / "prompts" / "eagle" / "gsm8k" / "question.jsonl"


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> Path:
    return qwen3_tokenizer_dir(tmp_path_factory.mktemp("tok"))


def small_prompts(tmp_path: Path, n: int = 12, source: Path = MT_BENCH) -> Path:
    lines = source.read_bytes().splitlines()[:n]
    path = tmp_path / "mt_bench.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def config(prompts: Path, out: Path, server: FakeServer, tokenizer: Path, **kw) -> gen.GenConfig:
    kw.setdefault("max_tokens", 64)
    kw.setdefault("commit_every", 5)
    write = WriteOptions(**{k: kw.pop(k) for k in WRITE_KEYS if k in kw})
    return gen.GenConfig(
        [prompts],
        out,
        servers=[ServerSpec(server.url)],
        tokenizer=tokenizer,
        output=OutputOptions(quiet=True),
        write=write,
        **kw,
    )


def check_exact(out: Path, server: FakeServer) -> Dataset:
    """Every generated sample holds exactly what the server's model produces, once."""
    ds = Dataset(out)
    stops = _stops(out)
    ids = list(ds.sample_ids())
    assert len(ids) == len(set(ids))
    for sample in ds:
        if sample.finish_reason.startswith("skipped"):
            continue
        sampling = sample.metadata["sampling"]
        want, finish = server.expected(
            [int(t) for t in sample.prompt_ids],
            max_tokens=sampling["max_tokens"],
            stop_token_ids=stops,
            seed=sampling["seed"],
        )
        assert [int(t) for t in sample.completion_ids] == want, sample.sample_id
        assert sample.finish_reason == finish
    return ds


def _stops(out: Path) -> list[int]:
    from eagle3kit.chat.render import Renderer

    return Renderer.load(out / "tokenizer").stop_token_ids


@pytest.mark.parametrize("api", ["sglang", "vllm"])
def test_gen_stores_the_exact_ids_for_every_turn(tmp_path, qwen3, api):
    prompts = small_prompts(tmp_path, 6)
    with FakeServer(api, tokenizer=qwen3, mean_tokens=20) as server:
        result = gen.run(config(prompts, tmp_path / "ds", server, qwen3, sampling_seed=7))
        ds = check_exact(tmp_path / "ds", server)
    # MT-bench questions have two turns: one sample per turn.
    assert result.total == 12 and len(ds) == 12
    turn2 = [s for s in ds if s.source["turn"] == 1 and s.finish_reason == "stop"]
    assert turn2, "second turns are generated"
    for sample in turn2:
        first = next(
            s for s in ds if s.source["line"] == sample.source["line"] and s.source["turn"] == 0
        )
        # The second prompt conditions on the model's own first answer.
        assert len(sample.prompt_ids) > len(first.prompt_ids) + len(first.completion_ids) - 2
    # The tokenizer and template travel with the dataset.
    assert (tmp_path / "ds" / "tokenizer" / "tokenizer.json").exists()


def test_stored_messages_render_to_the_prompt_ids(tmp_path, qwen3):
    """gen keeps the history each prompt renders, so validate can check the round trip."""
    from eagle3kit import validate

    prompts = small_prompts(tmp_path, 3)
    with FakeServer("vllm", tokenizer=qwen3, mean_tokens=12) as server:
        gen.run(config(prompts, tmp_path / "ds", server, qwen3, system="Be brief."))
    ds = Dataset(tmp_path / "ds")
    turn2 = [s for s in ds if s.source["turn"] == 1 and s.finish_reason == "stop"]
    # user, own answer, user; --system is recorded once in the manifest and added back
    assert turn2 and all(len(s.metadata["messages"]) == 3 for s in turn2)
    report = validate.run(
        validate.ValidateConfig(
            tmp_path / "ds", only=["round_trip"], output=OutputOptions(quiet=True)
        )
    )
    (check,) = report.checks
    assert check.status == "pass" and check.failing == 0
    assert check.total == sum(not s.finish_reason.startswith("skipped") for s in ds)


def test_rerun_sends_only_what_is_missing(tmp_path, qwen3):
    prompts = small_prompts(tmp_path, 8)
    with FakeServer("sglang", tokenizer=qwen3) as server:
        gen.run(config(prompts, tmp_path / "ds", server, qwen3, max_samples=3))
        first = len(server.requests)
        result = gen.run(config(prompts, tmp_path / "ds", server, qwen3))
        assert result.previously_done == 6 and result.written == 10
        sent = [r for r in server.requests if r.get("path") == "/generate"]
        again = gen.run(config(prompts, tmp_path / "ds", server, qwen3))
        assert again.written == 0
        assert len([r for r in server.requests if r.get("path") == "/generate"]) == len(sent)
        check_exact(tmp_path / "ds", server)
    assert first > 0


def test_the_event_loop_runs_between_any_two_renderings(tmp_path, qwen3, monkeypatch):
    """Rendering prompts back to back would hold up the answers waiting to be recorded, and
    their slots would sit idle meanwhile (benchmarks/gen_bench.py's idle check): the feeder
    lets the event loop run after each prompt it renders."""
    import asyncio

    from eagle3kit.gen.scheduler import Scheduler

    make_job = Scheduler.make_job
    seen = {"loop_ran": True, "back_to_back": 0, "renderings": 0}

    def mark() -> None:
        seen["loop_ran"] = True

    def spying_make_job(self, chain, turn):
        seen["back_to_back"] += not seen["loop_ran"]
        seen["renderings"] += 1
        seen["loop_ran"] = False
        asyncio.get_running_loop().call_soon(mark)
        return make_job(self, chain, turn)

    monkeypatch.setattr(Scheduler, "make_job", spying_make_job)
    prompts = tmp_path / "prompts.jsonl"  # one turn each: every rendering is the feeder's
    prompts.write_bytes(
        b"".join(
            orjson.dumps({"prompt": f"Question {i}: what is {i} + {i}?"}) + b"\n" for i in range(60)
        )
    )
    with FakeServer("vllm", tokenizer=qwen3, mean_tokens=8) as server:
        result = gen.run(config(prompts, tmp_path / "ds", server, qwen3, concurrency=4))
        check_exact(tmp_path / "ds", server)
    assert result.written == 60 and seen["renderings"] == 60
    assert seen["back_to_back"] == 0


def test_faults_are_retried_and_nothing_is_lost(tmp_path, qwen3):
    prompts = small_prompts(tmp_path, 10)
    with FakeServer(
        "vllm", tokenizer=qwen3, faults={"fail_rate": 0.3, "reset_rate": 0.1, "seed": 3}
    ) as server:
        result = gen.run(config(prompts, tmp_path / "ds", server, qwen3, max_attempts=20))
        ds = check_exact(tmp_path / "ds", server)
    assert result.retries > 0 and result.failed == 0
    assert len(ds) == 20
    assert all(s.finish_reason in ("stop", "length", "skipped:earlier_turn") for s in ds)


def test_a_server_that_dies_and_returns_loses_nothing(tmp_path, qwen3):
    import threading
    import time

    prompts = small_prompts(tmp_path, 10)

    def die_mid_run(server: FakeServer) -> None:
        while len(server.requests) < 8:  # some answered, some in flight, most still to send
            time.sleep(0.01)
        server.die(down_s=2.0)

    with FakeServer("sglang", tokenizer=qwen3, decode_tps=400, mean_tokens=40) as server:
        threading.Thread(target=die_mid_run, args=(server,), daemon=True).start()
        result = gen.run(
            config(prompts, tmp_path / "ds", server, qwen3, max_attempts=2, concurrency=4)
        )
        ds = check_exact(tmp_path / "ds", server)
    assert len(ds) == 20
    assert result.failed == 0
    assert all(s.finish_reason in ("stop", "length", "skipped:earlier_turn") for s in ds)


def test_over_long_prompts_are_recorded_as_skipped(tmp_path, qwen3):
    prompts = small_prompts(tmp_path, 4)
    with FakeServer("sglang", tokenizer=qwen3) as server:
        gen.run(config(prompts, tmp_path / "ds", server, qwen3, max_seq_len=60))
        ds = Dataset(tmp_path / "ds")
    reasons = {s.finish_reason for s in ds}
    assert "skipped:prompt_too_long" in reasons
    assert len(ds) == 8


def eagle3kit(*args: str, env: dict | None = None):
    return subprocess.run(
        [*prewarmed.argv(), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def test_dead_server_at_start_is_one_clear_error(tmp_path, qwen3):
    prompts = small_prompts(tmp_path, 2)
    result = eagle3kit(
        "gen",
        str(prompts),
        str(tmp_path / "ds"),
        "--server",
        "http://127.0.0.1:9",
        "--tokenizer",
        str(qwen3),
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "http://127.0.0.1:9" in result.stderr
    assert not (tmp_path / "ds").exists()


def test_tokenizer_mismatch_is_refused(tmp_path, qwen3):
    prompts = small_prompts(tmp_path, 2)
    with FakeServer("vllm") as server:  # byte-level tokenizer: not Qwen3's
        result = eagle3kit(
            "gen",
            str(prompts),
            str(tmp_path / "ds"),
            "--server",
            server.url,
            "--tokenizer",
            str(qwen3),
        )
    assert result.returncode == 2
    assert "--no-tokenizer-check" in result.stderr and "Traceback" not in result.stderr


def test_unwritable_output_is_one_clear_error(tmp_path, qwen3):
    prompts = small_prompts(tmp_path, 2)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with FakeServer("sglang", tokenizer=qwen3) as server:
        result = eagle3kit(
            "gen",
            str(prompts),
            str(blocker / "ds"),
            "--server",
            server.url,
            "--tokenizer",
            str(qwen3),
        )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and str(blocker) in result.stderr


def test_malformed_prompt_line_names_file_and_line(tmp_path, qwen3):
    prompts = small_prompts(tmp_path, 3)
    prompts.write_bytes(prompts.read_bytes() + b"{not json\n")
    result = eagle3kit(
        "gen",
        str(prompts),
        str(tmp_path / "ds"),
        "--server",
        "http://127.0.0.1:9",
        "--tokenizer",
        str(qwen3),
    )
    assert result.returncode == 2
    assert f"{prompts}:4" in result.stderr


def test_skipped_bad_lines_are_counted_in_the_result(tmp_path, qwen3):
    prompts = small_prompts(tmp_path, 3)
    prompts.write_bytes(prompts.read_bytes() + b"{not json\n[1, 2]\n")
    with FakeServer("sglang", tokenizer=qwen3, mean_tokens=8) as server:
        result = gen.run(config(prompts, tmp_path / "ds", server, qwen3, skip_bad_lines=True))
    assert result.bad_lines == 2
    assert result.total == 6  # three two-turn questions, the bad lines left out


def test_changed_sampling_is_refused_without_force(tmp_path, qwen3):
    prompts = small_prompts(tmp_path, 2)
    with FakeServer("sglang", tokenizer=qwen3) as server:
        args = [
            "gen",
            str(prompts),
            str(tmp_path / "ds"),
            "--server",
            server.url,
            "--tokenizer",
            str(qwen3),
            "--max-tokens",
            "16",
            "-q",
        ]
        assert eagle3kit(*args).returncode == 0
        changed = eagle3kit(*args, "--temperature", "0.2")
        assert changed.returncode == 2 and "--force" in changed.stderr
        forced = eagle3kit(*args, "--temperature", "0.2", "--force", "--json")
        assert forced.returncode == 0, forced.stderr
        assert orjson.loads(forced.stdout)["written"] == 0


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_temperature_that_is_not_a_finite_number_is_refused_by_its_flag(tmp_path, qwen3, value):
    """NaN passes `< 0`, and JSON has no NaN: the requests would carry `"temperature": null`
    (the server's own default, recorded nowhere). Refused on a new output, and with --force
    on a started one, before any request: the server never sees a null temperature."""
    from extract_world import refused

    prompts = small_prompts(tmp_path, 2)
    with FakeServer("sglang", tokenizer=qwen3) as server:
        args = [
            "gen",
            str(prompts),
            str(tmp_path / "ds"),
            "--server",
            server.url,
            "--tokenizer",
            str(qwen3),
            "--max-tokens",
            "16",
            "-q",
        ]
        new = refused(*args, "--temperature", value)
        assert new == f"error: --temperature must be a finite number >= 0 (got {value})"
        assert not (tmp_path / "ds").exists()
        gen.run(config(prompts, tmp_path / "ds", server, qwen3, max_tokens=16))
        sent = len(server.requests)
        assert refused(*args, "--temperature", value, "--force") == new
        assert len(server.requests) == sent  # nothing sent, so no null temperature either

"""gen against a misbehaving loopback server: every fault ends in a complete, exact dataset.

Each test runs the real gen (in-process, or the real CLI where exit status and output
matter) against `testkit/fakeserver.py`, whose model is a pure function of the request, so
every stored sample can be checked against what the server's model produces. Faults are the
fake's switches: 5xx bursts, server-side aborts, connection resets (before the answer and
halfway through its body), hangs, long-tail latencies, SGLang's prompt-prefix bug, wrong
completion counts, context-length 400s. Request logs (`FakeServer.requests`) show what gen
sent: how often each sample was tried, with which max tokens, to which server.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import orjson
import pytest
from fakeserver import FakeServer
from gen_harness import (
    MT_BENCH,
    QA,
    check_exact,
    cli,
    gen_requests,
    ints,
    prompt_file,
    run_gen,
    sample_of,
    served,
    servers,
    switch_faults_when,
)
from real_tokenizers import qwen3_tokenizer_dir

from eagle3kit.format import Dataset, TokenSample

OK_FINISH = ("stop", "length", "skipped:earlier_turn")


# Helpers ----------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def qwen3(tmp_path_factory) -> Path:
    return qwen3_tokenizer_dir(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session")
def stops(qwen3) -> list[int]:
    """Qwen3 ends a turn with <|im_end|>, which is also its EOS: the one stop id."""
    return [served(qwen3).token_id("<|im_end|>")]


def tries(srv: FakeServer) -> dict[str, int]:
    counts: dict[str, int] = {}
    for rec in gen_requests(srv):
        counts[sample_of(rec)] = counts.get(sample_of(rec), 0) + 1
    return counts


# Transient server failures ------------------------------------------------------------------
# Both APIs at once: one SGLang and one vLLM server, gen spreading the work over the two, each
# server with its own faults. Fault counters (`*_next`) count down per server, in arrival order.
TRANSIENT = {
    # 5xx burst; server-side abort (SGLang: finish_reason abort with status 503 in a 200);
    # TCP reset before any answer; a hang longer than --request-timeout.
    "sglang": {
        "fail_next": 3,
        "fail_status": 503,
        "abort_next": 2,
        "reset_next": 2,
        "hang_next": 2,
        "hang_s": 60,
    },
    # 5xx burst; finish_reason error in a 200; a hang; then (once both errors went out, as
    # both faults hit a finished answer) resets halfway through the answer's body.
    "vllm": {"fail_next": 3, "fail_status": 500, "abort_next": 2, "hang_next": 2, "hang_s": 60},
}
FAULT_OUTCOMES = {
    "sglang": ("fault_503", "fault_abort", "reset", "hang"),
    "vllm": ("fault_500", "fault_error", "reset", "hang"),
}


def test_transient_faults_are_retried_and_nothing_is_lost(tmp_path, qwen3, stops):
    prompts = prompt_file(tmp_path, 12)
    with (
        FakeServer("sglang", tokenizer=served(qwen3), faults=TRANSIENT["sglang"]) as sg,
        FakeServer("vllm", tokenizer=served(qwen3), faults=TRANSIENT["vllm"]) as vl,
    ):
        switch_faults_when(vl, "fault_error", 2, reset_next=2, reset_mid_body=True)
        t0 = time.monotonic()
        result = run_gen(
            prompts,
            tmp_path / "ds",
            servers((sg, 4), (vl, 4)),
            qwen3,
            request_timeout=1.0,
            max_attempts=20,
        )
        elapsed = time.monotonic() - t0
        samples = check_exact(tmp_path / "ds", sg, stops)
        requests = {"sglang": sg.requests, "vllm": vl.requests}
    assert elapsed < 30, "a hung request held the run"
    faulty = []
    for api, recs in requests.items():
        seen = {}
        for r in recs:
            seen[r["outcome"]] = seen.get(r["outcome"], 0) + 1
        burst, abort, reset, hang = FAULT_OUTCOMES[api]
        assert (seen.get(burst), seen.get(abort), seen.get(reset), seen.get(hang)) == (
            3,
            2,
            2,
            2,
        ), (api, seen)
        faulty += [r for r in recs if r["outcome"] in FAULT_OUTCOMES[api]]
    assert result.retries == len(faulty) == 18 and result.failed == 0
    assert result.violations == 0
    assert len(samples) == 24 and {s.finish_reason for s in samples} <= set(OK_FINISH)
    # Each failed attempt shows in the sample's attempt count, and only there.
    retried: dict[str, int] = {}
    for r in faulty:
        retried[sample_of(r)] = retried.get(sample_of(r), 0) + 1
    assert {
        s.sample_id: s.metadata["attempts"] - 1 for s in samples if "attempts" in s.metadata
    } == retried
    # SGLang is told to drop what the client gave up on; the hung requests end early.
    aborted = [r["body"]["rid"] for r in requests["sglang"] if r["path"] == "/abort_request"]
    assert sorted(aborted) == sorted(r["rid"] for r in requests["sglang"] if r["outcome"] == "hang")


def test_long_tail_latencies_do_not_hold_the_other_slots(tmp_path, qwen3, stops):
    prompts = prompt_file(tmp_path, 24, QA)
    faults = {"slow_rate": 0.25, "slow_s": 1.0, "seed": 2}
    with FakeServer("sglang", tokenizer=served(qwen3), decode_tps=2000, faults=faults) as srv:
        result = run_gen(prompts, tmp_path / "ds", srv, qwen3, concurrency=8)
        samples = check_exact(tmp_path / "ds", srv, stops)
        sent = gen_requests(srv)
    slow = [r for r in sent if r["t_finished"] - r["t_received"] >= 1.0]
    assert len(samples) == 24 and result.retries == 0 and len(sent) == 24
    assert len(slow) >= 4
    # Slow answers overlap each other and the fast ones: the whole generation takes far less
    # than the slow ones one after another.
    span = max(r["t_finished"] for r in sent) - min(r["t_received"] for r in sent)
    assert span < 0.5 * len(slow) + 0.5


# Broken answers ---------------------------------------------------------------------------
def test_sglang_prompt_prefix_bug_is_repaired(tmp_path, qwen3, stops):
    prompts = prompt_file(tmp_path, 8)
    faults = {"prefix_bug": 3, "prefix_bug_rate": 0.5, "seed": 1}
    with FakeServer("sglang", tokenizer=served(qwen3), faults=faults) as srv:
        result = run_gen(prompts, tmp_path / "ds", srv, qwen3)
        samples = check_exact(tmp_path / "ds", srv, stops)
    answered = [s for s in samples if s.finish_reason in ("stop", "length")]
    repaired = [s for s in answered if s.counts.get("repaired_prefix_ids")]
    assert result.violations == 0
    assert 0 < len(repaired) < len(answered)
    assert all(s.counts["repaired_prefix_ids"] == 3 for s in repaired)
    assert all("violations" not in s.metadata for s in answered)


def test_wrong_completion_counts_are_recorded_as_violations(tmp_path, qwen3, stops):
    """SGLang reports one token less (the excess is not the prompt's tail, so no repair
    applies), vLLM two more, on a share of the answers."""
    prompts = prompt_file(tmp_path, 12, QA)
    deltas = {"sglang": -1, "vllm": 2}
    with (
        FakeServer(
            "sglang",
            tokenizer=served(qwen3),
            faults={"count_delta": -1, "count_delta_rate": 0.4, "seed": 4},
        ) as sg,
        FakeServer(
            "vllm",
            tokenizer=served(qwen3),
            faults={"count_delta": 2, "count_delta_rate": 0.4, "seed": 4},
        ) as vl,
    ):
        result = run_gen(prompts, tmp_path / "ds", servers((sg, 2), (vl, 2)), qwen3)
        samples = check_exact(tmp_path / "ds", sg, stops)
    flagged = [s for s in samples if s.metadata.get("violations")]
    assert 0 < len(flagged) < len(samples) and result.violations == len(flagged)
    assert {s.server["api"] for s in flagged} == {"sglang", "vllm"}
    for s in flagged:
        (text,) = s.metadata["violations"]
        n, delta = len(s.completion_ids), deltas[s.server["api"]]
        assert text.startswith(f"{n} output ids but completion_tokens = {n + delta}")
        assert s.counts["completion_tokens"] == n + delta


def test_strict_stops_at_the_first_violation_and_keeps_what_was_committed(
    tmp_path, qwen3, stops, capfd, monkeypatch
):
    prompts = prompt_file(tmp_path, 30, QA)
    out = tmp_path / "ds"
    with FakeServer("vllm", tokenizer=served(qwen3), decode_tps=500) as srv:
        switch_faults_when(srv, "ok", 10, count_delta=1)
        code, _, stderr = cli(
            capfd,
            monkeypatch,
            "gen",
            str(prompts),
            str(out),
            "--server",
            srv.url,
            "--tokenizer",
            str(qwen3),
            "--max-tokens",
            "24",
            "--concurrency",
            "2",
            "--strict",
            "--commit-every",
            "3",
            "--no-progress",
        )
        samples = check_exact(out, srv, stops)
        answered = len(gen_requests(srv))
    assert code == 2, stderr
    assert "Traceback" not in stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "--strict" in errors[0] and srv.url in errors[0]
    assert "completion_tokens" in errors[0]
    # What came back before the violation is kept (an answer still being read when the run
    # stopped may be dropped), the violating answer is not.
    assert 8 <= len(samples) < answered <= 30
    assert all("violations" not in s.metadata for s in samples)
    assert Dataset(out).verify() == []


# Requests that cannot succeed ---------------------------------------------------------------
def test_a_prompt_that_fails_every_attempt_is_recorded_with_its_last_error(tmp_path, qwen3):
    prompts = prompt_file(tmp_path, 3)
    faults = {"fail_rate": 1.0, "fail_status": 502, "fail_message": "upstream gone"}
    with FakeServer("sglang", tokenizer=served(qwen3), faults=faults) as srv:
        result = run_gen(prompts, tmp_path / "ds", srv, qwen3, max_attempts=2)
        sent = tries(srv)
    samples = list(Dataset(tmp_path / "ds"))
    first = [s for s in samples if s.source["turn"] == 0]
    later = [s for s in samples if s.source["turn"] == 1]
    assert len(first) == 3 and len(later) == 3
    assert result.failed == 3 and result.skipped == 6 and result.written == 6
    for s in first:
        assert s.finish_reason == "skipped:failed"
        reason = s.metadata["reason"]
        assert reason.startswith("2 attempts, last error:")
        assert "HTTP 502" in reason and "upstream gone" in reason
        assert sent[s.sample_id] == 2
    assert all(s.finish_reason == "skipped:earlier_turn" for s in later)
    assert set(sent) == {s.sample_id for s in first}  # later turns are never sent


CONTEXT_400 = {
    "sglang": "The input (5000 tokens) is longer than the model's context length (4096 tokens).",
    "vllm": "This model's maximum context length is 4096 tokens. However, your request has "
    "5000 input tokens. Please reduce the length of the input messages.",
}


def test_a_context_length_400_is_recorded_and_never_retried(tmp_path, qwen3, stops):
    """Each server refuses one prompt in its own wording."""
    prompts = prompt_file(tmp_path, 8, QA)
    with (
        FakeServer(
            "sglang",
            tokenizer=served(qwen3),
            faults={"fail_next": 1, "fail_status": 400, "fail_message": CONTEXT_400["sglang"]},
        ) as sg,
        FakeServer(
            "vllm",
            tokenizer=served(qwen3),
            faults={"fail_next": 1, "fail_status": 400, "fail_message": CONTEXT_400["vllm"]},
        ) as vl,
    ):
        result = run_gen(prompts, tmp_path / "ds", servers((sg, 1), (vl, 1)), qwen3)
        samples = check_exact(tmp_path / "ds", sg, stops)
        sent = {**tries(sg)}
        for sample_id, n in tries(vl).items():
            sent[sample_id] = sent.get(sample_id, 0) + n
        rejected = {
            sample_of(r): srv.api
            for srv in (sg, vl)
            for r in gen_requests(srv)
            if r["outcome"] == "fault_400"
        }
    skipped = {s.sample_id: s for s in samples if s.finish_reason.startswith("skipped")}
    assert skipped.keys() == rejected.keys() and sorted(rejected.values()) == ["sglang", "vllm"]
    for sample_id, s in skipped.items():
        assert s.finish_reason == "skipped:context_length"
        assert "HTTP 400" in s.metadata["reason"]
        assert CONTEXT_400[rejected[sample_id]] in s.metadata["reason"]
        assert len(s.prompt_ids) > 0  # the prompt that was refused is kept
    # Never retried: every prompt, refused or not, was sent exactly once.
    assert sent.keys() == {s.sample_id for s in samples} and set(sent.values()) == {1}
    assert result.retries == 0 and result.skipped == 2 and len(samples) == 8


# Sampling and length settings ---------------------------------------------------------------
def test_n_samples_per_prompt_differ_and_reproduce(tmp_path, qwen3, stops):
    prompts = prompt_file(tmp_path, 4, QA)
    opts = {"n": 3, "sampling_seed": 11, "temperature": 0.8, "max_tokens": 32}
    with FakeServer("vllm", tokenizer=served(qwen3)) as srv:
        result = run_gen(prompts, tmp_path / "ds", srv, qwen3, **opts)
        first = {s.sample_id: s for s in check_exact(tmp_path / "ds", srv, stops)}
        again = run_gen(prompts, tmp_path / "ds", srv, qwen3, mode="overwrite", **opts)
        second = {s.sample_id: s for s in check_exact(tmp_path / "ds", srv, stops)}
        seeds = [r["body"]["seed"] for r in gen_requests(srv)]
    assert result.total == again.total == again.written == 12
    by_line: dict[int, list[TokenSample]] = {}
    for s in first.values():
        by_line.setdefault(s.source["line"], []).append(s)
    for group in by_line.values():
        assert sorted(s.source["index"] for s in group) == [0, 1, 2]
        assert len({tuple(ints(s.prompt_ids)) for s in group}) == 1
        assert len({tuple(ints(s.completion_ids)) for s in group}) == 3
        assert len({s.metadata["sampling"]["seed"] for s in group}) == 3
    assert first.keys() == second.keys()
    for sample_id, s in first.items():
        assert ints(second[sample_id].completion_ids) == ints(s.completion_ids)
        assert second[sample_id].metadata["sampling"] == s.metadata["sampling"]
    assert len(set(seeds)) == 12 and len(seeds) == 24


def test_long_threshold_picks_max_tokens_and_slots_by_prompt_length(tmp_path, qwen3, stops):
    prompts = prompt_file(tmp_path, 16, MT_BENCH)
    opts = {
        "long_threshold": 60,
        "short_max_tokens": 12,
        "long_max_tokens": 40,
        "short_concurrency": 3,
        "long_concurrency": 1,
        "max_tokens": 99,
    }
    with FakeServer("vllm", tokenizer=served(qwen3), decode_tps=400, mean_tokens=16) as srv:
        run_gen(prompts, tmp_path / "ds", srv, qwen3, **opts)
        samples = check_exact(tmp_path / "ds", srv, stops)
        sent = gen_requests(srv)
        peak = srv.stats()["max_in_flight"]
    long = [r for r in sent if len(r["body"]["prompt"]) >= 60]
    short = [r for r in sent if len(r["body"]["prompt"]) < 60]
    assert long and short, "both kinds of prompts are in the set"
    assert {r["body"]["max_tokens"] for r in long} == {40}
    assert {r["body"]["max_tokens"] for r in short} == {12}
    for s in samples:
        if s.finish_reason in ("stop", "length"):
            is_long = len(s.prompt_ids) >= 60
            assert s.metadata["sampling"]["max_tokens"] == (40 if is_long else 12)
    # --long-concurrency 1 and --short-concurrency 3: the slots of each kind are its own.
    assert max_overlap(long) == 1 and max_overlap(short) <= 3 and peak <= 3 + 1


def max_overlap(records: list[dict]) -> int:
    """The most of these requests the server held at one time."""
    events = sorted(
        [(r["t_received"], 1) for r in records] + [(r["t_finished"], -1) for r in records]
    )
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


def test_short_completions_are_recorded_as_filtered(tmp_path, qwen3, stops):
    prompts = prompt_file(tmp_path, 20, QA)
    with FakeServer("sglang", tokenizer=served(qwen3), mean_tokens=12) as srv:
        result = run_gen(prompts, tmp_path / "ds", srv, qwen3, min_completion_tokens=10)
        samples = check_exact(tmp_path / "ds", srv, stops, min_completion_tokens=10)
    filtered = [s for s in samples if s.finish_reason == "filtered:min_completion_tokens"]
    kept = [s for s in samples if s.finish_reason == "stop"]
    assert filtered and kept and len(samples) == 20
    assert all(0 < len(s.completion_ids) < 10 for s in filtered)  # stored, not dropped
    assert all(len(s.completion_ids) >= 10 for s in kept)
    assert result.filtered == len(filtered)
    meta = orjson.loads((tmp_path / "ds" / "manifest.json").read_bytes())
    assert meta["config"]["min_completion_tokens"] == 10


# The openai-chat fallback -------------------------------------------------------------------
def test_openai_chat_rebuilds_the_ids_and_marks_them(tmp_path, qwen3, stops):
    """Two servers of different versions: one puts the reasoning under `reasoning`, the other
    under `reasoning_content`; both are read, and the ids rebuilt with the think tokens."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(qwen3))
    prompts = prompt_file(tmp_path, 8, QA)
    with (
        FakeServer(
            "vllm",
            tokenizer=served(qwen3),
            reasoning_field="reasoning",
            mean_tokens=24,
            decode_tps=1000,
        ) as new,
        FakeServer(
            "vllm",
            tokenizer=served(qwen3),
            reasoning_field="reasoning_content",
            mean_tokens=24,
            decode_tps=1000,
        ) as old,
    ):
        result = run_gen(
            prompts,
            tmp_path / "ds",
            servers((new, 1), (old, 1)),
            qwen3,
            api="openai-chat",
            max_tokens=200,
            sampling_seed=3,
        )
        bodies = {sample_of(r): r["body"] for srv in (new, old) for r in gen_requests(srv)}
        samples = list(Dataset(tmp_path / "ds"))
        expect = {
            sid: new.expected_chat(
                b["messages"],
                max_tokens=b["max_tokens"],
                stop_token_ids=b["stop_token_ids"],
                seed=b["seed"],
            )
            for sid, b in bodies.items()
        }
        fields = {srv.url: srv.reasoning_field for srv in (new, old)}
    assert result.violations == 0 and len(samples) == 8
    assert {fields[s.server["url"]] for s in samples} == {"reasoning", "reasoning_content"}
    for s in samples:
        assert s.metadata["reconstructed"] is True
        reasoning, content, finish = expect[s.sample_id]
        assert finish == "stop" and s.finish_reason == "stop"
        assert reasoning and content
        want = tok.encode(f"<think>{reasoning}</think>{content}", add_special_tokens=False)
        assert ints(s.completion_ids) == [*want, stops[0]]
        messages = bodies[s.sample_id]["messages"]
        rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert ints(s.prompt_ids) == tok.encode(rendered, add_special_tokens=False)
    manifest = orjson.loads((tmp_path / "ds" / "manifest.json").read_bytes())
    assert manifest["config"]["api_family"] == "text"


# Secrets ----------------------------------------------------------------------------------
def test_the_api_key_is_never_written_anywhere(tmp_path, qwen3, capfd, monkeypatch):
    key = "sk-eagle3kit-TEST-9f8e7d6c5b4a"
    prompts = prompt_file(tmp_path, 3)
    out = tmp_path / "ds"
    # The server echoes the key in an error body: gen must scrub it from what it records.
    faults = {"fail_next": 1, "fail_status": 503, "fail_message": f"bad credentials {key}"}
    with FakeServer("sglang", tokenizer=served(qwen3), api_key=key, faults=faults) as srv:
        code, stdout, stderr = cli(
            capfd,
            monkeypatch,
            "gen",
            str(prompts),
            str(out),
            "--server",
            srv.url,
            "--tokenizer",
            str(qwen3),
            "--api-key",
            key,
            "--max-tokens",
            "16",
            "--max-attempts",
            "1",
            "--no-progress",
            "--log-every",
            "0.2",
            "--json",
        )
        auth = {r["authorization"] for r in srv.requests if r["path"] != "/health"}
    assert code == 0, stderr
    assert auth == {f"Bearer {key}"}, "the key was sent on every request"
    assert key not in stdout and key not in stderr
    assert orjson.loads(stdout)["failed"] == 1
    samples = list(Dataset(out))
    failed = [s for s in samples if s.finish_reason == "skipped:failed"]
    assert len(failed) == 1 and "bad credentials ***" in failed[0].metadata["reason"]
    for s in samples:
        assert key not in repr(s)
    files = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.name.startswith(".owner") for p in files)
    for path in files:
        data = path.read_bytes()
        assert key.encode() not in data, path
        assert all(key.encode() not in frame for frame in _zstd_frames(data)), path
    assert "***" in orjson.loads((out / "manifest.json").read_bytes())["runs"][0]["command"]


def _zstd_frames(data: bytes) -> list[bytes]:
    """The decompressed content of every zstd frame inside data (shards embed compressed
    metadata, which a plain grep would not see into)."""
    import zstandard

    frames = []
    at = data.find(b"\x28\xb5\x2f\xfd")
    while at >= 0:
        with contextlib.suppress(zstandard.ZstdError):
            frames.append(zstandard.ZstdDecompressor().decompressobj().decompress(data[at:]))
        at = data.find(b"\x28\xb5\x2f\xfd", at + 1)
    return frames


# Several servers ----------------------------------------------------------------------------
def test_load_spreads_over_two_servers_within_each_ones_concurrency(tmp_path, qwen3, stops):
    prompts = prompt_file(tmp_path, 30, QA)
    with (
        FakeServer("sglang", tokenizer=served(qwen3), decode_tps=300, mean_tokens=16) as a,
        FakeServer("vllm", tokenizer=served(qwen3), decode_tps=300, mean_tokens=16) as b,
    ):
        result = run_gen(prompts, tmp_path / "ds", servers((a, 2), (b, 5)), qwen3, concurrency=64)
        samples = check_exact(tmp_path / "ds", a, stops)
        stats_a, stats_b = a.stats(), b.stats()
        sent_a, sent_b = len(gen_requests(a)), len(gen_requests(b))
    assert result.written == 30 and len(samples) == 30
    assert sent_a > 0 and sent_b > 0 and sent_a + sent_b == 30
    assert sent_b > sent_a  # more slots take more of the work
    assert 1 <= stats_a["max_in_flight"] <= 2
    assert 1 <= stats_b["max_in_flight"] <= 5
    by_url = {s.server["url"] for s in samples}
    assert by_url == {a.url, b.url}

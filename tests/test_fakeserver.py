"""The loopback test server itself: a deterministic model, both wire formats, every fault.

Talks to it with plain httpx (its default transport), so these tests do not depend on the
gen clients they are meant to test.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest
from fakeserver import ByteTokenizer, FakeModel, FakeServer, FakeServerProcess, expected

EOS = ByteTokenizer().eos_token_id
TOKENIZERS = Path(__file__).resolve().parent / "data" / "tokenizers"
HTTP = httpx.Client(timeout=10.0)  # one client: building one costs ~30 ms (its SSL context)


@pytest.fixture(scope="module")
def sglang():
    with FakeServer("sglang") as srv:
        yield srv


@pytest.fixture(scope="module")
def vllm():
    with FakeServer("vllm") as srv:
        yield srv


@pytest.fixture
def sg(sglang):
    sglang.clear_faults()
    sglang.clear_requests()
    yield sglang
    sglang.clear_faults()


@pytest.fixture
def vl(vllm):
    vllm.clear_faults()
    vllm.clear_requests()
    yield vllm
    vllm.clear_faults()


def _gen_sglang(srv, ids, *, max_new=64, stops=(EOS,), seed=None, rid=None, timeout=10.0):
    sp = {"max_new_tokens": max_new, "stop_token_ids": list(stops)}
    if seed is not None:
        sp["sampling_seed"] = seed
    body = {"input_ids": ids, "sampling_params": sp, **({"rid": rid} if rid else {})}
    return HTTP.post(f"{srv.url}/generate", json=body, timeout=timeout)


def _gen_vllm(srv, ids, *, max_tokens=64, stops=(EOS,), seed=None, **extra):
    body = {
        "model": srv.model_name,
        "prompt": ids,
        "max_tokens": max_tokens,
        "stop_token_ids": list(stops),
        "seed": seed,
        "return_token_ids": True,
        **extra,
    }
    return HTTP.post(f"{srv.url}/v1/completions", json=body, timeout=10.0)


# The model --------------------------------------------------------------------------------
def test_the_model_is_a_pure_function_of_its_inputs():
    rng = np.random.default_rng(0)
    for _ in range(200):
        prompt = rng.integers(0, 1000, int(rng.integers(1, 50))).tolist()
        stops = sorted({int(x) for x in rng.integers(0, 1000, int(rng.integers(0, 3)))})
        max_tokens = int(rng.integers(0, 120))
        seed = int(rng.integers(0, 5))
        ids, finish = expected(prompt, max_tokens=max_tokens, stop_token_ids=stops, seed=seed)
        assert (ids, finish) == expected(
            prompt, max_tokens=max_tokens, stop_token_ids=stops, seed=seed
        )
        all_stops = {*stops, EOS}
        assert all(0 <= t < 1024 for t in ids)
        assert not all_stops & set(ids[:-1])
        if finish == "stop":
            assert ids[-1] in all_stops and len(ids) <= max_tokens
        else:
            assert finish == "length" and len(ids) == max_tokens
        # A larger budget only extends a cut completion: the ids never depend on max_tokens.
        longer, _ = expected(prompt, max_tokens=max_tokens + 50, stop_token_ids=stops, seed=seed)
        assert longer[: len(ids)] == ids or (finish == "stop" and longer == ids)
    a, _ = expected([1, 2, 3], max_tokens=500, seed=1, mean_tokens=400)
    assert a != expected([1, 2, 3], max_tokens=500, seed=2, mean_tokens=400)[0]
    assert a != expected([1, 2, 4], max_tokens=500, seed=1, mean_tokens=400)[0]
    assert expected([1, 2, 3], max_tokens=10, stop_token_ids=[], eos_token_id=None) == (
        expected([1, 2, 3], max_tokens=10, stop_token_ids=[], eos_token_id=None)
    )
    assert len(expected([5], max_tokens=10, eos_token_id=None)[0]) == 10


def test_lengths_are_mostly_short_with_a_long_tail():
    model = FakeModel(mean_tokens=30, long_tail=0.05, long_tokens=3000)
    lengths = np.array([model.natural_length([i, i + 1]) for i in range(4000)])
    assert np.median(lengths) < 40
    assert 0.02 < (lengths > 500).mean() < 0.08
    assert lengths.max() > 3000
    assert max(FakeModel(mean_tokens=30).natural_length([i]) for i in range(2000)) < 400


# Wire formats -----------------------------------------------------------------------------
def test_sglang_generate_answers_what_the_model_says(sg):
    for i in range(20):
        prompt = list(range(i + 1, i + 12))
        max_new = 5 + 7 * i
        r = _gen_sglang(sg, prompt, max_new=max_new, stops=(EOS, 300 + i), seed=i, rid=f"r{i}")
        assert r.status_code == 200
        body = r.json()
        ids, finish = sg.expected(prompt, max_tokens=max_new, stop_token_ids=[EOS, 300 + i], seed=i)
        assert body["output_ids"] == ids
        meta = body["meta_info"]
        assert meta["id"] == f"r{i}"
        assert meta["prompt_tokens"] == len(prompt) and meta["completion_tokens"] == len(ids)
        assert meta["finish_reason"]["type"] == finish
        if finish == "stop":
            assert meta["finish_reason"]["matched"] == ids[-1]
        else:
            assert meta["finish_reason"]["length"] == max_new
        assert body["text"] == ByteTokenizer().decode(ids)
        assert "cached_tokens" in meta and "spec_verify_ct" not in meta


def test_vllm_completions_answer_what_the_model_says(vl):
    finishes = set()
    for i in range(20):
        prompt = [i + 1, 7, 9]
        r = _gen_vllm(vl, prompt, max_tokens=3 + 4 * i, stops=(EOS, 400), seed=i)
        assert r.status_code == 200
        body = r.json()
        choice = body["choices"][0]
        ids, finish = vl.expected(prompt, max_tokens=3 + 4 * i, stop_token_ids=[EOS, 400], seed=i)
        assert choice["token_ids"] == ids and choice["prompt_token_ids"] == prompt
        assert choice["finish_reason"] == finish
        assert (
            body["usage"]["completion_tokens"] == len(ids) and body["usage"]["prompt_tokens"] == 3
        )
        # stop_reason: the matched stop id, or null for EOS (and when not stopped).
        expect_reason = ids[-1] if finish == "stop" and ids[-1] != EOS else None
        assert choice["stop_reason"] == expect_reason
        finishes.add((finish, choice["stop_reason"]))
    assert {"stop", "length"} <= {f for f, _ in finishes}
    # Without return_token_ids there are no ids; max_tokens defaults to 16.
    r = HTTP.post(f"{vl.url}/v1/completions", json={"model": vl.model_name, "prompt": [1, 2]})
    choice = r.json()["choices"][0]
    assert "token_ids" not in choice and "prompt_token_ids" not in choice
    assert r.json()["usage"]["completion_tokens"] == len(vl.expected([1, 2], max_tokens=16)[0])
    r = HTTP.post(f"{vl.url}/v1/completions", json={"model": "other", "prompt": [1, 2]})
    assert r.status_code == 404 and "does not exist" in r.json()["message"]


def test_info_endpoints(sg, vl):
    for path in (
        "/health",
        "/get_model_info",
        "/model_info",
        "/get_server_info",
        "/server_info",
        "/v1/models",
    ):
        assert HTTP.get(sg.url + path).status_code == 200, path
    assert HTTP.get(sg.url + "/model_info").json()["model_path"] == "fake/model"
    assert HTTP.get(sg.url + "/server_info").json()["speculative_algorithm"] is None
    card = HTTP.get(sg.url + "/v1/models").json()["data"][0]
    assert card["owned_by"] == "sglang" and card["max_model_len"] == 4096
    for path in ("/version", "/v1/completions"):
        assert HTTP.request("POST" if "compl" in path else "GET", sg.url + path).status_code == 404
    card = HTTP.get(vl.url + "/v1/models").json()["data"][0]
    assert card["owned_by"] == "vllm" and card["id"] == "fake/model"
    assert HTTP.get(vl.url + "/version").json() == {"version": "0.11.0"}
    for path in ("/get_model_info", "/model_info", "/generate"):
        assert (
            HTTP.request("POST" if path == "/generate" else "GET", vl.url + path).status_code == 404
        )
    with FakeServer("sglang", sglang_info_paths="old", speculative=True, context_length=999) as old:
        assert HTTP.get(old.url + "/model_info").status_code == 404
        info = HTTP.get(old.url + "/get_server_info").json()
        assert info["speculative_algorithm"] == "EAGLE3"
        assert HTTP.get(old.url + "/v1/models").json()["data"][0]["max_model_len"] == 999
        meta = _gen_sglang(old, [1, 2, 3], max_new=200).json()["meta_info"]
        assert meta["spec_verify_ct"] >= 1


def test_tokenize_with_the_byte_tokenizer_and_a_real_one(sg, vl):
    text = "héllo <think>x</think><|im_end|>"
    tok = ByteTokenizer()
    for srv, extra in ((sg, {}), (vl, {"model": "fake/model"})):
        body = HTTP.post(srv.url + "/tokenize", json={"prompt": text, **extra}).json()
        assert body["tokens"] == tok.encode(text) and body["count"] == len(body["tokens"])
        assert tok.decode(body["tokens"]) == text
    phi = TOKENIZERS / "phi-3-mini" / "tokenizer.json"
    with FakeServer("vllm", tokenizer=phi) as srv:
        assert srv.model.vocab_size == 32011 and srv.model.eos_token_id == 32007  # <|end|>
        tokens = HTTP.post(srv.url + "/tokenize", json={"prompt": "Hello world"}).json()["tokens"]
        assert srv.tokenizer.decode(tokens).strip() == "Hello world"
        out = _gen_vllm(srv, tokens, stops=()).json()["choices"][0]
        assert out["token_ids"] == srv.expected(tokens, max_tokens=64)[0]


def test_context_length_errors_use_each_servers_wording(sg):
    cases = [
        ("sglang", "new", 5000, 10, "is longer than the model's context length"),
        (
            "sglang",
            "new",
            4000,
            200,
            "Requested token count exceeds the model's maximum context length",
        ),
        ("vllm", "new", 5000, 10, "However, your request has 5000 input tokens"),
        ("vllm", "new", 4000, 200, "'max_tokens' or 'max_completion_tokens' is too large: 200"),
        ("vllm", "old", 4000, 200, "However, you requested 4200 tokens (4000 in the messages"),
    ]
    for api, wording, n_prompt, max_tokens, text in cases:
        with FakeServer(api, vllm_wording=wording) as srv:
            prompt = [1] * n_prompt
            r = (_gen_sglang if api == "sglang" else _gen_vllm)(
                srv, prompt, **{("max_new" if api == "sglang" else "max_tokens"): max_tokens}
            )
            assert r.status_code == 400
            msg = r.json()["error"]["message"] if api == "sglang" else r.json()["message"]
            assert text in msg
    assert _gen_sglang(sg, [1] * 4000, max_new=96).status_code == 200


def test_sglang_refuses_bad_payloads(sg):
    r = HTTP.post(
        sg.url + "/generate", json={"input_ids": [1], "sampling_params": {"max_tokens": 5}}
    )
    assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]
    for ids in ([], [1, "a"], [1, 5000], "text"):
        assert HTTP.post(sg.url + "/generate", json={"input_ids": ids}).status_code == 400
    assert HTTP.post(sg.url + "/generate", content=b"not json").status_code == 400


def test_duplicate_rid_in_flight_is_refused():
    with (
        FakeServer("sglang", decode_tps=100, mean_tokens=1000) as srv,
        ThreadPoolExecutor(2) as pool,
    ):
        first = pool.submit(_gen_sglang, srv, [1, 2], max_new=100, rid="same")  # 1 s in flight
        time.sleep(0.1)
        r = _gen_sglang(srv, [3, 4], max_new=5, rid="same")
        assert r.status_code == 400 and "Duplicate" in r.json()["error"]["message"]
        assert first.result().status_code == 200


def test_chat_completions_put_reasoning_under_the_configured_field():
    messages = [{"role": "user", "content": "What is 2+2?"}]
    for api, field, present in (
        ("vllm", None, {"reasoning"}),
        ("vllm", "reasoning_content", {"reasoning_content"}),
        ("vllm", "both", {"reasoning", "reasoning_content"}),
        ("sglang", None, {"reasoning_content"}),
    ):
        with FakeServer(api, reasoning_field=field, mean_tokens=40) as srv:
            r = HTTP.post(
                srv.url + "/v1/chat/completions",
                json={"model": "fake/model", "messages": messages, "max_tokens": 100, "seed": 3},
            )
            body = r.json()
            msg = body["choices"][0]["message"]
            assert present == {k for k in ("reasoning", "reasoning_content") if k in msg}
            reasoning, content, finish = srv.expected_chat(messages, max_tokens=100, seed=3)
            assert all(msg[k] == reasoning for k in present) and msg["content"] == content
            assert body["choices"][0]["finish_reason"] == finish
            rebuilt = srv.tokenizer.encode(f"<think>{reasoning}</think>{content}") + [EOS] * (
                finish == "stop"
            )
            assert body["usage"]["completion_tokens"] == len(rebuilt)
            assert body["usage"]["prompt_tokens"] == len(
                srv.tokenizer.encode(
                    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
                )
            )


def test_api_key_is_required_except_for_health():
    with FakeServer("vllm", api_key="sk-test") as srv:
        assert HTTP.get(srv.url + "/health").status_code == 200
        assert HTTP.get(srv.url + "/v1/models").status_code == 401
        ok = HTTP.get(srv.url + "/v1/models", headers={"Authorization": "Bearer sk-test"})
        assert ok.status_code == 200
        assert srv.requests[-1]["authorization"] == "Bearer sk-test"


def test_every_request_is_recorded(sg, tmp_path):
    _gen_sglang(sg, [1, 2, 3], rid="x1")
    HTTP.get(sg.url + "/health")
    HTTP.get(sg.url + "/_fake/stats")  # the control API is not recorded
    recs = sg.requests
    assert [(r["method"], r["path"], r["outcome"]) for r in recs] == [
        ("POST", "/generate", "ok"),
        ("GET", "/health", "ok"),
    ]
    assert recs[0]["rid"] == "x1" and recs[0]["body"]["input_ids"] == [1, 2, 3]
    assert recs[0]["t_received"] <= recs[0]["t_started"] <= recs[0]["t_finished"]
    log = tmp_path / "requests.jsonl"
    with FakeServer("vllm", record_file=log, record_bodies=False) as srv:
        _gen_vllm(srv, [1, 2])
        _gen_vllm(srv, [3, 4])
    lines = [orjson.loads(line) for line in log.read_bytes().splitlines()]
    assert [r["path"] for r in lines] == ["/v1/completions"] * 2 and lines[0]["body"] is None


# Faults -----------------------------------------------------------------------------------
def test_fail_next_and_fail_rate(sg, vl):
    sg.set_faults(fail_next=2, fail_status=503)
    assert [_gen_sglang(sg, [1]).status_code for _ in range(3)] == [503, 503, 200]
    vl.set_faults(fail_next=1, fail_status=500, fail_message="engine dead")
    r = _gen_vllm(vl, [1])
    assert r.status_code == 500 and r.json()["message"] == "engine dead"
    assert HTTP.get(vl.url + "/v1/models").status_code == 200  # only generations fail
    vl.set_faults(fail_rate=0.5, seed=1)
    codes = [_gen_vllm(vl, [i]).status_code for i in range(60)]
    assert 15 < codes.count(500) < 45 and codes.count(200) == 60 - codes.count(500)
    assert sg.stats()["outcomes"] == {"fault_503": 2, "ok": 1}


@pytest.mark.parametrize("mid_body", [False, True])
def test_connection_resets(sg, vl, mid_body):
    for srv, gen in ((sg, _gen_sglang), (vl, _gen_vllm)):
        srv.set_faults(reset_next=1, reset_mid_body=mid_body)
        with pytest.raises(httpx.TransportError):
            gen(srv, [1, 2, 3])
        assert gen(srv, [1, 2, 3]).status_code == 200
        time.sleep(0.05)
        assert [r["outcome"] for r in srv.requests] == ["reset", "ok"]


def test_hang_holds_the_answer(sg):
    sg.set_faults(hang_next=1, hang_s=3.0)
    t0 = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        _gen_sglang(sg, [1, 2], timeout=0.3)
    assert time.monotonic() - t0 < 1.5
    assert _gen_sglang(sg, [1, 2]).status_code == 200
    time.sleep(0.05)
    assert [r["outcome"] for r in sg.requests] == ["hang", "ok"]


def test_die_and_come_back_on_the_same_port():
    with (
        FakeServer("sglang", decode_tps=50, mean_tokens=10_000) as srv,
        ThreadPoolExecutor(1) as pool,
    ):
        port = srv.port
        inflight = pool.submit(_gen_sglang, srv, [1, 2], max_new=200)
        time.sleep(0.1)
        srv.die(0.6)
        with pytest.raises(httpx.TransportError):
            inflight.result()  # in-flight requests are dropped
        with pytest.raises(httpx.ConnectError):
            HTTP.get(srv.url + "/health")
        time.sleep(0.8)
        assert srv.port == port and HTTP.get(srv.url + "/health").status_code == 200
        assert srv.stats()["restarts"] == 1
        srv.die()
        with pytest.raises(httpx.ConnectError):
            HTTP.get(srv.url + "/health")
        srv.revive()
        assert _gen_sglang(srv, [1, 2], max_new=3).status_code == 200


def test_latency_and_long_tail(vl):
    vl.set_faults(latency_s=0.2)
    t0 = time.monotonic()
    _gen_vllm(vl, [1])
    assert 0.2 <= time.monotonic() - t0 < 1.0
    vl.set_faults(latency_s=0.0, slow_rate=0.3, slow_s=0.25, seed=2)
    times = []
    for i in range(20):
        t0 = time.monotonic()
        _gen_vllm(vl, [i])
        times.append(time.monotonic() - t0)
    slow = sum(t >= 0.25 for t in times)
    assert 1 <= slow <= 12


def test_prefix_bug_wrong_counts_and_server_side_errors(sg, vl):
    prompt = [11, 12, 13, 14, 15, 16]
    ids, _ = sg.expected(prompt, max_tokens=64, stop_token_ids=[EOS])
    sg.set_faults(prefix_bug=3)
    body = _gen_sglang(sg, prompt).json()
    assert body["output_ids"] == [14, 15, 16, *ids] and body["meta_info"][
        "completion_tokens"
    ] == len(ids)
    sg.set_faults(prefix_bug=0, count_delta=2)
    assert _gen_sglang(sg, prompt).json()["meta_info"]["completion_tokens"] == len(ids) + 2
    vl.set_faults(count_delta=-1)
    assert _gen_vllm(vl, prompt).json()["usage"]["completion_tokens"] == len(ids) - 1
    sg.set_faults(count_delta=0, abort_next=1)
    reason = _gen_sglang(sg, prompt).json()["meta_info"]["finish_reason"]
    assert reason["type"] == "abort" and reason["status_code"] == 503
    vl.set_faults(count_delta=0, abort_next=1)
    assert _gen_vllm(vl, prompt).json()["choices"][0]["finish_reason"] == "error"
    sg.set_faults(health_status=503)
    assert HTTP.get(sg.url + "/health").status_code == 503


def test_slots_bound_concurrency_at_the_decode_speed():
    with (
        FakeServer("vllm", slots=2, decode_tps=200, eos_token_id=None) as srv,
        ThreadPoolExecutor(6) as pool,
    ):
        t0 = time.monotonic()
        results = list(pool.map(lambda i: _gen_vllm(srv, [i], max_tokens=20, stops=()), range(6)))
        elapsed = time.monotonic() - t0
        assert all(r.status_code == 200 for r in results)
        assert srv.stats()["max_in_flight"] == 2
        assert elapsed >= 0.28  # 6 requests x 0.1 s over 2 slots
        assert srv.stats()["generated_tokens"] == 120


def test_abort_request_cuts_a_generation(sg):
    with (
        FakeServer("sglang", decode_tps=100, mean_tokens=10_000) as srv,
        ThreadPoolExecutor(1) as pool,
    ):
        future = pool.submit(_gen_sglang, srv, [5, 6], max_new=300, rid="victim")
        time.sleep(0.25)
        assert HTTP.post(srv.url + "/abort_request", json={"rid": "victim"}).status_code == 200
        body = future.result().json()
        assert body["meta_info"]["finish_reason"]["type"] == "abort"
        full, _ = srv.expected([5, 6], max_tokens=300, stop_token_ids=[EOS])
        assert (
            5 < len(body["output_ids"]) < 250
            and full[: len(body["output_ids"])] == body["output_ids"]
        )


def test_control_api_over_http(vl):
    assert (
        HTTP.post(vl.url + "/_fake/faults", json={"fail_next": 1, "fail_status": 502}).json()[
            "fail_next"
        ]
        == 1
    )
    assert _gen_vllm(vl, [1]).status_code == 502
    assert HTTP.post(vl.url + "/_fake/faults/clear").json()["fail_status"] == 503
    assert [r["outcome"] for r in HTTP.get(vl.url + "/_fake/requests").json()] == ["fault_502"]
    assert HTTP.delete(vl.url + "/_fake/requests").json() == []
    assert HTTP.get(vl.url + "/_fake/stats").json()["received"] == 0


def test_subprocess_mode_survives_sigkill_and_restarts_on_its_port(tmp_path):
    log = tmp_path / "log.jsonl"
    with FakeServerProcess("sglang", slots=4, record_file=log, faults={"fail_next": 1}) as proc:
        assert _gen_sglang(proc, [1, 2]).status_code == 503
        r = _gen_sglang(proc, [1, 2], max_new=10, seed=4)
        assert (
            r.json()["output_ids"]
            == expected([1, 2], max_tokens=10, stop_token_ids=[EOS], seed=4)[0]
        )
        proc.set_faults(fail_next=1, fail_status=500)
        assert _gen_sglang(proc, [1]).status_code == 500
        assert len(proc.requests()) == 3
        port = proc.port
        proc.kill()
        with pytest.raises(httpx.ConnectError):
            HTTP.get(proc.url + "/health")
        proc.restart()  # the same command line: the initial faults apply again
        assert proc.port == port and _gen_sglang(proc, [1]).status_code == 503
        assert _gen_sglang(proc, [1]).status_code == 200
        proc.die(0.3)
        time.sleep(0.1)
        with pytest.raises(httpx.ConnectError):
            HTTP.get(proc.url + "/health")
        time.sleep(0.5)
        assert HTTP.get(proc.url + "/health").status_code == 200
    assert [orjson.loads(x)["outcome"] for x in log.read_bytes().splitlines()] == [
        "fault_503",
        "ok",
        "fault_500",
        "fault_503",
        "ok",
        "ok",
    ]

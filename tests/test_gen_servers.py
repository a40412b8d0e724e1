"""gen's HTTP clients against the real loopback server, in SGLang and vLLM modes.

Every completion is compared with what the fake server's model produces, every fault maps to
the error class the scheduler acts on, and the API key never shows up in an error.
"""

from __future__ import annotations

import asyncio
import socket
import traceback
from dataclasses import replace

import pytest
from fakeserver import ByteTokenizer, FakeServer, render_chat

from eagle3kit.errors import UserError
from eagle3kit.gen import servers as C
from eagle3kit.gen.servers import vllm
from eagle3kit.gen.types import GenRequest

TOK = ByteTokenizer()
EOS = TOK.eos_token_id
APIS = ("sglang", "vllm")


def _run(url, fn, *, api="auto", api_key=None, concurrency=8, key_in_client=True):
    """Probe the server at url, then await fn(client, info) in a fresh event loop."""

    async def main():
        async with C.make_client(concurrency, api_key=api_key if key_in_client else None) as client:
            info = await C.probe(client, url, api, api_key=None if key_in_client else api_key)
            return await fn(client, info)

    return asyncio.run(main())


def _req(i=0, prompt=None, max_tokens=64, stops=(EOS,), seed=None, **kw):
    prompt = prompt if prompt is not None else [i % 200 + 1, 7, (i * 13) % 250 + 1]
    return GenRequest(f"s{i:05d}", prompt, max_tokens, list(stops), seed=seed, **kw)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def servers():
    lengths = {"mean_tokens": 24, "long_tail": 0.1, "long_tokens": 300}
    with FakeServer("sglang", **lengths) as sg, FakeServer("vllm", **lengths) as vl:
        yield {"sglang": sg, "vllm": vl}


@pytest.fixture(params=APIS)
def srv(request, servers):
    s = servers[request.param]
    s.clear_faults()
    s.clear_requests()
    yield s
    s.clear_faults()


# Probing ----------------------------------------------------------------------------------
def test_probe_detects_each_server_and_reads_its_settings(servers):
    sg, vl = servers["sglang"], servers["vllm"]
    info = _run(f"127.0.0.1:{sg.port}/v1/", lambda c, i: asyncio.sleep(0, i))
    assert info == C.ServerInfo(sg.url, "sglang", "fake/model", 4096, "0.5.4", speculative=False)
    info = _run(vl.url, lambda c, i: asyncio.sleep(0, i))
    assert info == C.ServerInfo(vl.url, "vllm", "fake/model", 4096, "0.11.0")
    info = _run(vl.url, lambda c, i: asyncio.sleep(0, i), api="openai-chat")
    assert (info.api, info.model, info.max_model_len) == ("openai-chat", "fake/model", 4096)
    with FakeServer("sglang", sglang_info_paths="old", speculative=True, model_name="m/x") as old:
        info = _run(old.url, lambda c, i: asyncio.sleep(0, i), api="sglang")
        assert (info.api, info.model, info.speculative) == ("sglang", "m/x", True)


def _probe_error(url, api="auto", api_key=None):
    with pytest.raises(UserError) as err:
        _run(url, lambda c, i: asyncio.sleep(0), api=api, api_key=api_key)
    return str(err.value)


def test_probe_failures_are_one_clear_message(servers):
    port = _free_port()
    assert _probe_error(f"http://127.0.0.1:{port}") == (
        f"no server answers at http://127.0.0.1:{port} (--server): connection refused"
    )
    assert "is it an SGLang server?" in _probe_error(servers["vllm"].url, api="sglang")
    assert "is SGLang, not vLLM" in _probe_error(servers["sglang"].url, api="vllm")
    assert "--api must be one of" in _probe_error(servers["vllm"].url, api="tgi")
    sg = servers["sglang"]
    sg.set_faults(health_status=503)
    try:
        assert (
            _probe_error(sg.url)
            == f"the server at {sg.url} is not ready: GET /health answered HTTP 503"
        )
    finally:
        sg.clear_faults()
    with FakeServer("vllm", api_key="sk-right") as keyed:
        msg = _probe_error(keyed.url, api_key="sk-wrong")
        assert "refused the API key" in msg and "--api-key" in msg and "sk-wrong" not in msg
        msg = _probe_error(keyed.url)
        assert "refused the API key" in msg


# Generation -------------------------------------------------------------------------------
def test_generate_returns_exactly_the_models_ids(srv):
    reqs = [
        _req(
            i, max_tokens=(5, 40, 400)[i % 3], stops=(EOS,) if i % 2 else (EOS, 300 + i), seed=i % 4
        )
        for i in range(120)
    ]

    async def many(client, info):
        info = replace(info, vocab_size=1024)
        return await asyncio.gather(*(C.generate(client, info, r) for r in reqs))

    comps = _run(srv.url, many, concurrency=32)
    finishes = set()
    for req, comp in zip(reqs, comps, strict=True):
        ids, finish = srv.expected(
            req.prompt_ids,
            max_tokens=req.max_tokens,
            stop_token_ids=req.stop_token_ids,
            seed=req.seed,
        )
        assert (comp.output_ids, comp.finish_reason) == (ids, finish)
        assert comp.violations == [] and not comp.reconstructed
        assert (comp.prompt_tokens, comp.completion_tokens) == (3, len(ids))
        assert comp.server == {
            "url": srv.url,
            "api": srv.api,
            "model": "fake/model",
            "version": srv.version,
        }
        assert comp.latency > 0
        finishes.add(finish)
    assert finishes == {"stop", "length"}
    if srv.api == "sglang":
        assert comps[0].counts == {"cached_tokens": 0}
    assert sum(r["path"] in ("/generate", "/v1/completions") for r in srv.requests) == len(reqs)


def test_payloads_carry_every_sampling_setting(srv):
    req = _req(
        1, max_tokens=33, stops=(EOS, 77), seed=5, temperature=0.6, top_p=0.95, top_k=20, min_p=0.05
    )

    async def twice(client, info):
        await C.generate(client, info, req, attempt=0)
        await C.generate(client, info, req, attempt=1)
        await C.generate(client, info, replace(req, seed=None), attempt=2)

    _run(srv.url, twice, api_key="sk-abc")
    sent = [r for r in srv.requests if r["path"] in ("/generate", "/v1/completions")]
    assert all(r["authorization"] == "Bearer sk-abc" for r in srv.requests)
    if srv.api == "sglang":
        assert sent[0]["body"] == {
            "rid": sent[0]["rid"],
            "input_ids": req.prompt_ids,
            "sampling_params": {
                "max_new_tokens": 33,
                "temperature": 0.6,
                "top_p": 0.95,
                "top_k": 20,
                "min_p": 0.05,
                "stop_token_ids": [EOS, 77],
                "skip_special_tokens": False,
                "spaces_between_special_tokens": False,
                "no_stop_trim": True,
                "sampling_seed": 5,
            },
            "stream": False,
        }
        rids = [r["rid"] for r in sent]
        assert "sampling_seed" not in sent[2]["body"]["sampling_params"]
    else:
        assert sent[0]["body"] == {
            "model": "fake/model",
            "prompt": req.prompt_ids,
            "max_tokens": 33,
            "temperature": 0.6,
            "top_p": 0.95,
            "top_k": 20,
            "min_p": 0.05,
            "seed": 5,
            "stop_token_ids": [EOS, 77],
            "skip_special_tokens": False,
            "include_stop_str_in_output": True,
            "return_token_ids": True,
        }
        rids = [r["request_id"] for r in sent]
        assert "seed" not in sent[2]["body"]
    assert [rid.rsplit("-", 1)[0] for rid in rids] == ["s00001-a0", "s00001-a1", "s00001-a2"]
    assert len(set(rids)) == 3


def test_sglang_prompt_prefix_bug_is_repaired(servers):
    sg = servers["sglang"]
    sg.set_faults(prefix_bug=4)
    try:
        reqs = [_req(i, prompt=[9, 8, 7, 6, 5, i + 1]) for i in range(10)]
        comps = _run(
            sg.url, lambda c, info: asyncio.gather(*(C.generate(c, info, r) for r in reqs))
        )
    finally:
        sg.clear_faults()
    for req, comp in zip(reqs, comps, strict=True):
        assert (
            comp.output_ids == sg.expected(req.prompt_ids, max_tokens=64, stop_token_ids=[EOS])[0]
        )
        assert comp.counts["repaired_prefix_ids"] == 4 and comp.violations == []


def test_wrong_counts_are_reported_as_violations(srv):
    req = _req(3, prompt=[1, 2, 3])
    first = srv.expected(req.prompt_ids, max_tokens=64, stop_token_ids=[EOS])[0][0]
    assert first != 3  # so a one-id excess cannot pass for the prompt's tail
    for delta in (1, -1):
        srv.set_faults(count_delta=delta)
        comp = _run(srv.url, lambda c, i: C.generate(c, i, req))
        assert len(comp.violations) == 1 and "completion_tokens" in comp.violations[0]
        assert "repaired_prefix_ids" not in comp.counts


def _reply(**kw):
    base = dict(
        output_ids=[5, 6, EOS],
        finish_reason="stop",
        matched=EOS,
        prompt_tokens=3,
        completion_tokens=3,
    )
    return C.Reply(**{**base, **kw})


def test_check_invariants_catches_each_broken_rule():
    req = _req(0, prompt=[1, 2, 3], max_tokens=10, stops=(EOS, 99))
    sg = C.ServerInfo("http://x", "sglang", "m", 100, None, speculative=False, vocab_size=500)
    vl = C.ServerInfo("http://x", "vllm", "m", 100, None, vocab_size=500)

    def check(info=sg, sent_rid=None, **kw):
        return C.check_invariants(_reply(**kw), req, info, sent_rid)[1]

    assert check() == [] and check(vl, prompt_ids=[1, 2, 3], matched=None) == []
    assert check(sent_rid="r1", rid="r2") == ["answer id 'r2' is not the rid sent 'r1'"]
    assert check(results=2) == ["2 results for one request"]
    assert check(completion_tokens=4) == ["3 output ids but completion_tokens = 4"]
    assert check(completion_tokens=None) == ["no completion_tokens reported"]
    assert "not the prompt's tail" in check(output_ids=[9, 5, 6, EOS])[0]
    ids, v, fixed = C.check_invariants(_reply(output_ids=[2, 3, 5, 6, EOS]), req, sg)
    assert (ids, v, fixed) == ([5, 6, EOS], [], 2)
    many = _reply(output_ids=[0, 1, 2, 3, 5, 6, EOS])  # more excess than the prompt has
    assert "not the prompt's tail" in C.check_invariants(many, req, sg)[1][0]
    assert check(vl, prompt_ids=None, matched=None) == ["no prompt_token_ids echoed"]
    assert check(vl, prompt_ids=[1, 2], matched=None) == [
        "echoed prompt_token_ids differ from the ids sent"
    ]
    assert check(prompt_tokens=4) == ["prompt_tokens = 4 but 3 prompt ids were sent"]
    assert check(output_ids=[5, 600, EOS]) == ["1 output ids outside [0, 500), e.g. 600"]
    assert check(output_ids=[5, -1, EOS]) == ["1 output ids outside [0, 500), e.g. -1"]
    assert check(output_ids=[5, "6", EOS]) == ["output ids are not all integers"]
    assert check(finish_reason=None) == ["no finish_reason"]
    assert check(matched=99) == [f"finish stop on 99 but the last output id is {EOS}"]
    assert check(matched="</s>") == [
        "stopped on the string '</s>', but only stop token ids were sent"
    ]
    # A stop on an id gen did not send is flagged alike whether the server names it or not.
    unlisted = ["finish stop on 7, which is not among the stop_token_ids sent"]
    assert check(vl, prompt_ids=[1, 2, 3], matched=None, output_ids=[5, 6, 7]) == unlisted
    assert check(matched=7, output_ids=[5, 6, 7]) == unlisted
    assert check(finish_reason="length", matched=None)[0].startswith("finish length after 3 ids")
    assert check(finish_reason="length", output_ids=list(range(10)), completion_tokens=10) == []
    at_ctx = replace(sg, max_model_len=6)
    assert check(at_ctx, finish_reason="length") == []  # 3 prompt + 3 output = the context
    assert check(has_spec=True) == ["spec_* counters present"]
    assert check(replace(sg, speculative=True), has_spec=False) == [
        "no spec_* counters from a speculative server"
    ]


# Errors -----------------------------------------------------------------------------------
def _error(url, req, *, api="auto", timeout=None, info_change=None, api_key=None):
    async def one(client, info):
        if info_change:
            info = replace(info, **info_change)
        with pytest.raises(C.ServerError) as err:
            await C.generate(client, info, req, timeout=timeout)
        return err.value

    return _run(url, one, api=api, api_key=api_key)


@pytest.mark.parametrize("wording", ["new", "old"])
def test_context_length_400_is_rejected_not_retried(wording):
    for api in APIS:
        with FakeServer(api, context_length=100, vllm_wording=wording) as s:
            for prompt_len, max_tokens in ((150, 10), (60, 50)):
                s.clear_requests()
                err = _error(s.url, _req(prompt=[1] * prompt_len, max_tokens=max_tokens))
                assert type(err) is C.RequestRejected and err.reason == "context_length", str(err)
                assert err.status == 400 and s.url in str(err)
                assert sum(r["path"] in ("/generate", "/v1/completions") for r in s.requests) == 1
            err = _error(s.url, _req(prompt=[1, 5000]))
            assert type(err) is C.RequestRejected and err.reason == "bad_request"


def test_transient_failures_are_retryable(srv):
    req = _req(2)
    for status in (503, 500, 502, 429):
        srv.set_faults(fail_next=1, fail_status=status)
        err = _error(srv.url, req)
        assert type(err) is C.RetryableError and (err.reason, err.status) == (
            f"http_{status}",
            status,
        )
    for mid_body in (False, True):
        srv.set_faults(reset_next=1, reset_mid_body=mid_body)
        err = _error(srv.url, req)
        assert type(err) is C.RetryableError and err.reason == "reset", str(err)
    srv.set_faults(abort_next=1)
    err = _error(srv.url, req)
    assert type(err) is C.RetryableError and err.reason == (
        "abort" if srv.api == "sglang" else "error"
    )
    srv.clear_faults()
    comp = _run(srv.url, lambda c, i: C.generate(c, i, req))
    assert comp.output_ids == srv.expected(req.prompt_ids, max_tokens=64, stop_token_ids=[EOS])[0]


def test_a_hang_times_out_and_sglang_is_told_to_abort(srv):
    srv.set_faults(hang_next=1, hang_s=5.0)
    err = _error(srv.url, _req(4), timeout=0.3)
    assert type(err) is C.RetryableError and err.reason == "timeout"
    assert "no answer within 0.3 s" in str(err)
    gen = [r for r in srv.requests if r["path"] in ("/generate", "/v1/completions")]
    aborts = [r for r in srv.requests if r["path"] == "/abort_request"]
    if srv.api == "sglang":
        assert [a["body"] for a in aborts] == [{"rid": gen[0]["rid"]}]
    else:
        assert aborts == []


def test_a_dead_server_is_retryable_and_health_follows_it():
    with FakeServer("vllm") as s:

        async def scenario(client, info):
            assert await C.health(client, s.url)
            s.die()
            # A pooled connection the crash reset may be tried first; then nothing listens.
            reasons = []
            for _ in range(2):
                with pytest.raises(C.RetryableError) as err:
                    await C.generate(client, info, _req(1))
                assert s.url in str(err.value)
                reasons.append(err.value.reason)
            assert reasons in (["reset", "refused"], ["refused", "refused"])
            assert not await C.health(client, s.url)
            s.revive()
            assert await C.health(client, s.url)
            return await C.generate(client, info, _req(1))

        assert _run(s.url, scenario).violations == []


def test_wrong_model_or_endpoint_is_fatal(servers):
    err = _error(servers["vllm"].url, _req(1), info_change={"model": "not/served"})
    assert type(err) is C.ServerFatal and err.status == 404 and servers["vllm"].url in str(err)
    assert "does not exist" in str(err)
    err = _error(servers["sglang"].url, _req(1), info_change={"api": "vllm"})
    assert type(err) is C.ServerFatal and err.reason == "not_found"
    with pytest.raises(C.ServerFatal, match="no token_ids"):
        vllm.parse({"choices": [{"finish_reason": "stop", "text": "x"}]}, "http://old")


def _failing(key, in_client):
    async def one(client, info):
        with pytest.raises(C.ServerError) as err:
            await C.generate(client, info, _req(1), timeout=0.3, api_key=None if in_client else key)
        return err.value

    return one


def test_the_api_key_never_appears_in_errors():
    # Held in variables: a traceback quotes source lines, and a literal there would show.
    key, other = "sk-SECRET-4242", "sk-other-77"
    with FakeServer("sglang", api_key=key) as s:
        errors = []
        for faults in (
            {"fail_next": 1, "fail_status": 503, "fail_message": f"token {key} rejected"},
            {"fail_next": 1, "fail_status": 400, "fail_message": f"bad {key}"},
            {"reset_next": 1},
            {"hang_next": 1, "hang_s": 3},
        ):
            for in_client in (True, False):
                s.clear_faults()
                s.set_faults(**faults)
                errors.append(
                    _run(s.url, _failing(key, in_client), api_key=key, key_in_client=in_client)
                )

        async def wrong_key(client, info):
            with pytest.raises(C.ServerFatal) as err:
                await C.generate(client, info, _req(1), api_key=other)
            return err.value

        s.clear_faults()
        errors.append(_run(s.url, wrong_key, api_key=key, key_in_client=False))
        assert errors[-1].reason == "auth" and "--api-key" in str(errors[-1])
        assert "***" in str(errors[0]) and "***" in str(errors[2])
        for err in errors:
            text = str(err) + repr(err) + "".join(traceback.format_exception(err))
            assert key not in text and other not in text, text
        info = _run(s.url, lambda c, i: asyncio.sleep(0, i), api_key=key)
        assert key not in repr(info)

        async def client_repr():
            async with C.make_client(2, api_key=key) as client:
                return repr(client) + repr(client.headers)

        assert key not in asyncio.run(client_repr())


# The openai-chat fallback -----------------------------------------------------------------
def _rebuild(reasoning, content):
    return TOK.encode(f"<think>{reasoning or ''}</think>{content}")


@pytest.mark.parametrize(
    ("api", "field"),
    [
        ("vllm", "reasoning"),
        ("vllm", "reasoning_content"),
        ("vllm", "both"),
        ("sglang", "reasoning_content"),
    ],
)
def test_openai_chat_fallback_reads_either_reasoning_field(api, field):
    messages = [{"role": "user", "content": "Hello there"}]
    prompt = TOK.encode(render_chat(messages))
    with FakeServer(api, reasoning_field=field, mean_tokens=30) as s:

        async def chats(client, info):
            with pytest.raises(ValueError, match="chat_generate"):
                await C.generate(client, info, _req(1))
            return [
                await C.chat_generate(
                    client,
                    info,
                    messages,
                    _req(i, prompt=prompt, max_tokens=(20, 200)[i % 2], seed=i),
                    _rebuild,
                )
                for i in range(6)
            ]

        comps = _run(s.url, chats, api="openai-chat")
        found = []
        for i, comp in enumerate(comps):
            reasoning, content, finish = s.expected_chat(
                messages, max_tokens=(20, 200)[i % 2], seed=i
            )
            found.append(reasoning)
            assert comp.output_ids == _rebuild(reasoning, content) + [EOS] * (finish == "stop")
            assert comp.reconstructed and comp.violations == [] and comp.finish_reason == finish
            assert comp.server["api"] == "openai-chat"
        assert sum(map(bool, found)) >= 3  # found under whichever name the server used
        body = next(r["body"] for r in s.requests if r["path"] == "/v1/chat/completions")
        assert body["messages"] == messages and body["model"] == "fake/model" and body["seed"] == 0
        s.set_faults(count_delta=3)
        comp = _run(
            s.url,
            lambda c, i: C.chat_generate(c, i, messages, _req(0, prompt=prompt), _rebuild),
            api="openai-chat",
        )
        assert comp.reconstructed and "completion_tokens" in comp.violations[0]


def test_chat_without_reasoning_passes_none_to_rebuild():
    with FakeServer("vllm", reasoning_field="none") as s:
        seen = []

        def rebuild(reasoning, content):
            seen.append(reasoning)
            return _rebuild(reasoning, content)

        _run(
            s.url,
            lambda c, i: C.chat_generate(
                c, i, [{"role": "user", "content": "x"}], _req(0, prompt=[]), rebuild
            ),
            api="openai-chat",
        )
        assert seen == [None]


# Small parts ------------------------------------------------------------------------------
def test_tokenize_uses_the_servers_tokenizer(srv):
    text = "Hi <think>ok</think><|im_end|>"
    assert _run(srv.url, lambda c, i: C.tokenize(c, i, text)) == TOK.encode(text)

    class NoTokenize(FakeServer):
        def _routes(self):
            return {k: v for k, v in super()._routes().items() if k[1] != "/tokenize"}

    with NoTokenize(srv.api) as s:
        assert _run(s.url, lambda c, i: C.tokenize(c, i, text)) is None


def test_idle_connections_closed_by_the_server_do_not_fail_requests():
    with FakeServer("vllm", keepalive_timeout=0.2) as s:

        async def spaced(client, info):
            out = []
            for i in range(4):
                out.append(await C.generate(client, info, _req(i)))
                await asyncio.sleep(0.3)
            return out

        assert all(c.violations == [] for c in _run(s.url, spaced))


def test_the_pool_allows_the_full_concurrency():
    with FakeServer("sglang", decode_tps=100, eos_token_id=None) as s:
        reqs = [_req(i, stops=(), max_tokens=50) for i in range(12)]
        _run(
            s.url, lambda c, i: asyncio.gather(*(C.generate(c, i, r) for r in reqs)), concurrency=12
        )
        assert s.stats()["max_in_flight"] == 12


def test_make_client_and_urls():
    async def build():
        async with C.make_client(16) as client:
            return client.timeout, client._transport.limits

    timeout, limits = asyncio.run(build())
    assert (timeout.connect, timeout.read, timeout.write, timeout.pool) == (10.0, None, None, None)
    assert limits.max_connections == 16 + C.SPARE_CONNECTIONS and limits.keepalive_expiry < 5
    assert C.normalize_url("gpu1:30000") == "http://gpu1:30000"
    assert C.normalize_url("https://h/v1/") == "https://h"
    assert C.API_CHOICES == ("auto", "sglang", "vllm", "openai-chat")

"""bench server against loopback SGLang and vLLM stand-ins that speculate
(tests/fake_spec_server.py): acceptance from SGLang's per-request fields and from vLLM's
Prometheus counter deltas, throughput, latency and the speedup over a baseline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_spec_server import SpecServer
from typer.testing import CliRunner

from eagle3kit._ui import OutputOptions
from eagle3kit.bench import server as bench
from eagle3kit.bench import server_figures
from eagle3kit.cli import app
from eagle3kit.errors import UserError

DATA = Path(__file__).parent / "data"
MT_BENCH = DATA / "prompts" / "eagle" / "mt_bench" / "question.jsonl"
QWEN3 = DATA / "tokenizers" / "qwen3"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Path:
    from eagle3kit.tiny import make_tokenizer, stdlib_docstrings

    return make_tokenizer(tmp_path_factory.mktemp("tok"), corpus=stdlib_docstrings(60_000))


def config(url: str, tokenizer: Path, **options) -> bench.ServerBenchConfig:
    options.setdefault("max_new_tokens", 24)
    options.setdefault("max_samples", 6)
    return bench.ServerBenchConfig(
        url, [MT_BENCH], tokenizer, output=OutputOptions(quiet=True), **options
    )


def test_sglang_acceptance_and_speedup(tokenizer):
    with (
        SpecServer("sglang", tokenizer=str(tokenizer), step_s=0.01, mean_tokens=40) as srv,
        SpecServer(
            "sglang", tokenizer=str(tokenizer), speculative=False, step_s=0.01, mean_tokens=40
        ) as base,
    ):
        report = bench.run(config(srv.url, tokenizer, baseline=base.url))
    assert report.api == "sglang" and report.shape == "chain k=3"
    assert report.requests == 12 and report.errors == 0  # 6 questions x 2 turns
    assert report.acceptance_length == pytest.approx(srv.expected_sglang_length())
    assert report.acceptance_length_without_prefill == pytest.approx(
        sum(t - 1 for t, _, _ in srv.log) / sum(r for _, r, _ in srv.log)
    )
    assert 1.5 < report.acceptance_length < 4
    assert report.run["tokens"] == sum(t for t, _, _ in srv.log)
    # Decoding time is per round on the speculating server, per token on the baseline.
    assert report.speedup == pytest.approx(report.acceptance_length, rel=0.35)
    assert report.latency_speedup > 1.2
    assert report.run["latency_p50"] <= report.run["latency_p90"] <= report.run["latency_p99"]
    assert set(report.categories) == {"writing"}
    assert not report.warnings


def test_vllm_acceptance_from_counter_deltas(tokenizer):
    with SpecServer(
        "vllm", tokenizer=str(tokenizer), accept=(0.9, 0.5, 0.3, 0.2), k=4, mean_tokens=40
    ) as srv:
        # Traffic before the run is not counted: only deltas are.
        srv.counters[0]["num_drafts"] += 1000
        srv.counters[1]["per_pos"][0] += 500
        report = bench.run(config(srv.url, tokenizer, max_samples=12))
    assert report.api == "vllm" and report.shape == "chain k=4" and report.k == 4
    assert report.acceptance_length == pytest.approx(srv.expected_vllm_length())
    assert report.per_position == pytest.approx(srv.expected_per_position())
    assert report.acceptance_length == pytest.approx(1 + sum(report.per_position))
    rounds = [a for _, _, rs in srv.log for a in rs]
    assert report.draft_acceptance_rate == pytest.approx(sum(rounds) / (4 * len(rounds)))
    assert report.per_position_conditional[1] == pytest.approx(
        report.per_position[1] / report.per_position[0]
    )
    # Two categories of MT-bench: each measured from its own before/after scrape.
    assert set(report.categories) == {"writing", "roleplay"}
    assert report.baseline is None and report.speedup is None


def test_metrics_text_parsing_sums_engines():
    text = (
        "# HELP vllm:spec_decode_num_drafts_total x\n# TYPE vllm:spec_decode_num_drafts_total "
        "counter\n"
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0\n'
        'vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 5\n'
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 45.0\n'
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 20.0\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",'
        'position="0"} 12.0\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",'
        'position="0"} 1.0\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",'
        'position="1"} 7.0\n'
        'vllm:num_requests_running{engine="0"} 3.0\n'
    )
    parsed = server_figures.parse_metrics(text)
    assert parsed == {
        "num_drafts": 15.0,
        "num_draft_tokens": 45.0,
        "num_accepted_tokens": 20.0,
        "per_pos": {0: 13.0, 1: 7.0},
    }
    figures = server_figures.vllm_acceptance(server_figures.metrics_delta({}, parsed))
    assert figures["acceptance_length"] == pytest.approx(1 + 20 / 15)
    assert figures["per_position"] == pytest.approx([13 / 15, 7 / 15])


def test_a_server_that_does_not_speculate(tokenizer):
    for api in ("sglang", "vllm"):
        with (
            SpecServer(api, tokenizer=str(tokenizer), speculative=False) as srv,
            pytest.raises(UserError, match="is speculative decoding on"),
        ):
            bench.run(config(srv.url, tokenizer, max_samples=1))


def test_low_acceptance_is_flagged(tokenizer):
    with SpecServer("sglang", tokenizer=str(tokenizer), accept=(0.02, 0.0, 0.0)) as srv:
        report = bench.run(config(srv.url, tokenizer, max_samples=3))
    assert report.acceptance_length_without_prefill < 1.05 < report.acceptance_length
    assert any("almost never accepted" in w for w in report.warnings)


def test_a_server_that_keeps_no_sampled_drafts_but_keeps_them_at_temperature_0_is_named(tokenizer):
    """vLLM 0.32.0's CPU build (vllm#55005) keeps almost no drafts at temperature > 0 and
    keeps them at 0: bench probes the server at temperature 0 and names its sampling."""
    with SpecServer(
        "vllm", tokenizer=str(tokenizer), accept=(0.9, 0.8, 0.7), sampled_accept=(0.0, 0.0, 0.0)
    ) as srv:
        report = bench.run(config(srv.url, tokenizer, temperature=0.7))
        probed = [r["body"]["temperature"] for r in srv.requests if r["path"] == "/v1/completions"][
            12:
        ]
    assert report.acceptance_length == pytest.approx(1.0) and report.temperature == 0.7
    assert probed == [0.0] * 8  # 4 conversations x 2 turns, at temperature 0
    assert [f["cause"] for f in report.findings] == ["engine-sampling"]
    assert "vllm#55005" in report.findings[0]["message"]
    assert any("[engine-sampling]" in w for w in report.warnings)
    assert not any("almost never accepted" in w for w in report.warnings)


def test_a_server_that_keeps_no_drafts_at_temperature_0_either_is_not_blamed(tokenizer):
    with SpecServer("vllm", tokenizer=str(tokenizer), accept=(0.02, 0.0, 0.0)) as srv:
        report = bench.run(config(srv.url, tokenizer, temperature=0.7))
        probed = sum(
            r["path"] == "/v1/completions" and r["body"]["temperature"] == 0 for r in srv.requests
        )
    assert probed == 8 and report.findings == []
    assert any("almost never accepted" in w for w in report.warnings)


def cli(*args: str):
    result = CliRunner().invoke(app, ["bench", "server", *args])
    return result.exit_code, result.output


def test_cli_json_with_baseline(tokenizer):
    with (
        # 20 ms a target forward: the decode time the speedup is made of stays far above
        # the HTTP and tokenizer overhead of a loaded CI machine (2 ms was not: 0.67x).
        SpecServer("vllm", tokenizer=str(tokenizer), step_s=0.02) as srv,
        SpecServer("vllm", tokenizer=str(tokenizer), speculative=False, step_s=0.02) as base,
    ):
        code, out = cli(
            str(MT_BENCH),
            "--server",
            srv.url,
            "--baseline",
            base.url,
            "--tokenizer",
            str(tokenizer),
            "--max-samples",
            "3",
            "--max-new-tokens",
            "16",
            "--json",
            "--concurrency",
            "2",
        )
    assert code == 0, out
    data = json.loads(out[out.index("{") : out.rindex("}") + 1])
    for key in (
        "acceptance_length",
        "per_position",
        "k",
        "temperature",
        "lossless",
        "near_ties",
        "categories",
        "speedup",
    ):
        assert key in data
    assert data["acceptance_length"] == pytest.approx(srv.expected_vllm_length())
    assert data["speedup"] > 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "--server is required"),
        (["--server", "http://127.0.0.1:1", str(MT_BENCH)], "--tokenizer is required"),
        (
            ["--server", "not a url", str(MT_BENCH), "--tokenizer", "{tok}"],
            "--server not a url: 'not a url' is not a host name or address; expected",
        ),
        (
            ["--server", "http://127.0.0.1:1", str(MT_BENCH), "--tokenizer", "{tok}"],
            "no server answers at http://127.0.0.1:1",
        ),
        (
            [
                "--server",
                "http://127.0.0.1:1",
                str(MT_BENCH),
                "--tokenizer",
                "{tok}",
                "--api",
                "openai-chat",
            ],
            "--api must be auto, sglang or vllm",
        ),
        (
            [
                "--server",
                "http://127.0.0.1:1",
                str(MT_BENCH),
                "--tokenizer",
                "{tok}",
                "--concurrency",
                "0",
            ],
            "--concurrency must be at least 1",
        ),
        (
            ["--server", "http://127.0.0.1:1", "nope.jsonl", "--tokenizer", "{tok}"],
            "nope.jsonl: no such prompt file",
        ),
    ],
)
def test_bad_input_is_one_message(tokenizer, args, message):
    code, out = cli(*(a.format(tok=tokenizer) for a in args))
    assert code == 2, out
    assert message.format(tok=tokenizer) in out
    assert "Traceback" not in out


def test_bench_server_imports_no_torch(tokenizer):
    """`bench server` talks HTTP and tokenizes: importing it, and a whole run from the command
    line, never import torch (it costs seconds, and a client machine may not have it)."""
    import subprocess
    import sys

    code = (
        "import sys\nimport eagle3kit.bench.server\n"
        "print('after import', 'torch' in sys.modules, flush=True)\n"
        "from eagle3kit.cli import main\nsys.argv = ['eagle3kit', *sys.argv[1:]]\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    status = exc.code\n"
        "print('after run', status, 'torch' in sys.modules, flush=True)\n"
    )
    with SpecServer("sglang", tokenizer=str(tokenizer), step_s=0.002) as srv:
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                code,
                "bench",
                "server",
                str(MT_BENCH),
                "--server",
                srv.url,
                "--tokenizer",
                str(tokenizer),
                "--max-samples",
                "2",
                "--max-new-tokens",
                "8",
                "--quiet",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    lines = [line for line in out.stdout.splitlines() if line.startswith("after")]
    assert lines == ["after import False", "after run 0 False"], out.stdout + out.stderr
    assert srv.log, "the run sent no request"


def test_sampled_requests_carry_their_own_seed_and_the_sampling_flags(tokenizer):
    """One seed for every request gives them one random stream (vLLM seeds each request's
    generator with it): each request gets its own, derived from --seed, and --top-p and
    --top-k go with them."""
    with SpecServer("vllm", tokenizer=str(tokenizer), mean_tokens=20) as srv:
        bench.run(config(srv.url, tokenizer, temperature=0.7, top_p=0.9, top_k=20, seed=5))
        bodies = [r["body"] for r in srv.requests if r["path"] == "/v1/completions"]
    assert len(bodies) == 12  # 6 questions x 2 turns
    seeds = [b["seed"] for b in bodies]
    assert len(set(seeds)) == len(seeds)
    assert {bench.request_seed(5, n, t) for n in range(6) for t in range(2)} == set(seeds)
    assert all(b["temperature"] == 0.7 and b["top_p"] == 0.9 and b["top_k"] == 20 for b in bodies)

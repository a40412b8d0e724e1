"""Mistyped server URLs: one line naming the flag and the value, exit 2, never a traceback.

Before, `http://127.0.0.1:3000o` ended in httpx.InvalidURL, `http://:::bad` in ~97 lines of
traceback, `http://127.0.0.1:30000@abc` in an error about the AUTHORIZATION header (httpx
read `127.0.0.1:30000` as credentials), `:99999` in a "connection reset", and
`http://user:KEY@host` in a traceback. Every command that takes a server URL checks it when
its config is built, before anything is loaded or sent; a key written into a URL is never
repeated.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import prewarmed
import pytest

from eagle3kit._urls import server_url
from eagle3kit.errors import UserError
from eagle3kit.gen.config import parse_server

KEY = "sk-url-SECRET-41f3"
BAD = {
    "http://127.0.0.1:3000o": "the port must be a number from 1 to 65535, not '3000o'",
    "http://:::bad": "no host name (an IPv6 address goes in brackets",
    "http://127.0.0.1:30000@abc": "the concurrency after @ must be a whole number like @128, "
    "not 'abc'",
    "http://127.0.0.1:99999": "the port must be a number from 1 to 65535, not '99999'",
}


def eagle3kit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*prewarmed.argv(), *args], capture_output=True, text=True, timeout=120)


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.fixture()
def inputs(tmp_path: Path) -> tuple[Path, Path]:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    tokenizer = tmp_path / "tokenizer"
    tokenizer.mkdir()
    return prompts, tokenizer


@pytest.mark.parametrize("url", BAD)
def test_gen_names_the_flag_and_the_bad_url(url, inputs, tmp_path):
    prompts, tokenizer = inputs
    line = one_error_line(
        eagle3kit(
            "gen",
            str(prompts),
            str(tmp_path / "out"),
            "--server",
            url,
            "--tokenizer",
            str(tokenizer),
        )
    )
    assert line.startswith(f"error: --server {url}: {BAD[url]}")
    assert not (tmp_path / "out").exists()


def test_credentials_in_a_url_point_to_the_api_key_and_are_never_shown(inputs, tmp_path):
    from eagle3kit.bench.server import ServerBenchConfig

    prompts, tokenizer = inputs
    result = eagle3kit(
        "gen",
        str(prompts),
        str(tmp_path / "out"),
        "--tokenizer",
        str(tokenizer),
        "--server",
        f"http://user:{KEY}@10.0.0.7:30000@64",
    )
    line = one_error_line(result)
    assert KEY not in result.stderr + result.stdout
    assert line == (
        "error: --server http://***@10.0.0.7:30000: a server URL cannot carry "
        "credentials; pass an API key with --api-key or EAGLE3KIT_API_KEY"
    )
    with pytest.raises(UserError) as err:
        ServerBenchConfig(f"https://{KEY}@gpu-node-3:8000/v1", [prompts], tokenizer)
    assert KEY not in str(err.value) and "https://***@gpu-node-3:8000/v1" in str(err.value)


def test_bench_server_and_extract_check_their_urls(inputs, tmp_path):
    prompts, tokenizer = inputs
    bench = eagle3kit(
        "bench",
        "server",
        str(prompts),
        "--tokenizer",
        str(tokenizer),
        "--server",
        "http://127.0.0.1:8000",
        "--baseline",
        "http://127.0.0.1:3000o",
    )
    assert one_error_line(bench) == (
        "error: --baseline http://127.0.0.1:3000o: the port must be a number from 1 to 65535, "
        "not '3000o'; expected http(s)://HOST:PORT"
    )
    extract = eagle3kit(
        "extract",
        str(tmp_path / "tokens"),
        str(tmp_path / "hidden"),
        "--target",
        str(tokenizer),
        "--engine",
        "vllm",
        "--server",
        "http://:::bad",
    )
    assert one_error_line(extract).startswith("error: --server http://:::bad: no host name")


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("http://127.0.0.1:0", "the port must be a number from 1 to 65535, not '0'"),
        ("ftp://127.0.0.1:30000", "the scheme must be http or https, not 'ftp'"),
        ("http://gpu node:30000", "'gpu node' is not a host name or address"),
        ("http://127.0.0.1:30000?x=1", "a server URL has no query or fragment"),
        ("http://[::1:30000", "an IPv6 address goes in brackets"),
        ("http://[fe80::zz]:30000", "'fe80::zz' is not an IPv6 address"),
        ("http://", "no host name"),
    ],
)
def test_other_mistakes_are_named(text, why):
    with pytest.raises(UserError) as err:
        server_url(text, "--server")
    assert str(err.value).startswith(f"--server {text}: {why}")


def test_good_urls_are_normalized():
    assert server_url("127.0.0.1:30000") == "http://127.0.0.1:30000"
    assert server_url("HTTPS://gpu-3.cluster.local:8000/v1/") == "https://gpu-3.cluster.local:8000"
    assert server_url("http://[::1]:8000") == "http://[::1]:8000"
    assert server_url("http://proxy:80/sglang/") == "http://proxy:80/sglang"
    assert parse_server("http://10.0.0.11:30000@256").concurrency == 256
    assert parse_server(" http://10.0.0.11:30000/ ").url == "http://10.0.0.11:30000"
    with pytest.raises(UserError, match="concurrency must be at least 1"):
        parse_server("http://10.0.0.11:30000@0")
    with pytest.raises(UserError, match="takes no @concurrency, and 'abc' follows the port"):
        server_url("http://127.0.0.1:30000@abc", "--baseline")

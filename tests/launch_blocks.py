"""The ```launch blocks of the docs and model cards, parsed: each SGLang or vLLM launch line
into its flags, checked against the flags (and parser names) each server takes. For
test_launch_lines.py, the doc page tests and the model card's; not a test module."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)


Flag = type | frozenset | str | None
"""int, float or str: a value of that type; "fraction": a float in (0, 1]; a frozenset: one of
those values; None: a switch without a value."""
SGLANG_REASONING_PARSERS = frozenset(
    {
        "deepseek-r1",
        "deepseek-v3",
        "qwen3",
        "qwen3-thinking",
        "kimi",
        "kimi_k2",
        "gpt-oss",
        "glm45",
    }
)
SGLANG_TOOL_PARSERS = frozenset(
    {
        "kimi_k2",
        "qwen25",
        "qwen3_coder",
        "deepseekv3",
        "deepseekv31",
        "llama3",
        "mistral",
        "pythonic",
        "gpt-oss",
        "glm45",
    }
)
SGLANG_FLAGS: dict[str, Flag] = {
    # model and tokenizer
    "--model-path": str,
    "--model": str,
    "--tokenizer-path": str,
    "--trust-remote-code": None,
    "--served-model-name": str,
    "--chat-template": str,
    "--context-length": int,
    "--revision": str,
    "--quantization": str,
    "--kv-cache-dtype": frozenset({"auto", "fp8_e4m3", "fp8_e5m2"}),
    # HTTP server
    "--host": str,
    "--port": int,
    "--api-key": str,
    "--enable-metrics": None,
    "--log-requests": None,
    # parallelism (`--tp` is the documented short form of `--tp-size`)
    "--tp": int,
    "--tp-size": int,
    "--tensor-parallel-size": int,
    "--dp": int,
    "--dp-size": int,
    "--enable-dp-attention": None,
    # memory and scheduling
    "--mem-fraction-static": "fraction",
    "--max-running-requests": int,
    "--max-total-tokens": int,
    "--chunked-prefill-size": int,
    "--schedule-policy": str,
    "--cuda-graph-max-bs": int,
    # parsers (chat endpoint only)
    "--reasoning-parser": SGLANG_REASONING_PARSERS,
    "--tool-call-parser": SGLANG_TOOL_PARSERS,
    # named in reference/SERVER_APIS.md
    "--incremental-streaming-output": None,
    "--stream-output": None,
    "--max-queued-requests": int,
    "--enable-priority-scheduling": None,
    "--sampling-defaults": frozenset({"openai", "model"}),
    # speculative decoding (docs/export.md; CHECKPOINTS.md §2, SGLang "Speculative Decoding")
    "--speculative-algorithm": frozenset({"EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"}),
    "--speculative-draft-model-path": str,
    "--speculative-num-steps": int,
    "--speculative-eagle-topk": int,
    "--speculative-num-draft-tokens": int,
}
VLLM_REASONING_PARSERS = frozenset(
    {
        "deepseek_r1",
        "deepseek_v3",
        "qwen3",
        "kimi_k2",
        "glm45",
        "openai_gptoss",
        "granite",
        "mistral",
    }
)
VLLM_TOOL_PARSERS = frozenset(
    {
        "kimi_k2",
        "hermes",
        "qwen3_coder",
        "qwen3_xml",
        "llama3_json",
        "mistral",
        "deepseek_v3",
        "deepseek_v31",
        "openai",
        "pythonic",
        "glm45",
    }
)
VLLM_FLAGS: dict[str, Flag] = {
    # model and tokenizer
    "--tokenizer": str,
    "--trust-remote-code": None,
    "--served-model-name": str,
    "--chat-template": str,
    "--max-model-len": int,
    "--revision": str,
    "--quantization": str,
    "--kv-cache-dtype": frozenset({"auto", "fp8", "fp8_e4m3", "fp8_e5m2"}),
    "--generation-config": str,
    "--seed": int,
    "--dtype": str,
    # HTTP server
    "--host": str,
    "--port": int,
    "--api-key": str,
    # parallelism
    "--tensor-parallel-size": int,
    "-tp": int,
    "--pipeline-parallel-size": int,
    "--data-parallel-size": int,
    "--enable-expert-parallel": None,
    # memory and scheduling
    "--gpu-memory-utilization": "fraction",
    "--max-num-seqs": int,
    "--max-num-batched-tokens": int,
    "--enable-prefix-caching": None,
    # parsers (chat endpoint only)
    "--reasoning-parser": VLLM_REASONING_PARSERS,
    "--enable-auto-tool-choice": None,
    "--tool-call-parser": VLLM_TOOL_PARSERS,
    # named in reference/SERVER_APIS.md
    "--max-num-queued-reqs": int,
    "--per-request-spec-decode-metrics": frozenset({"summary"}),
    # speculative decoding, a JSON object (docs/export.md; CHECKPOINTS.md §1 "long form")
    "--speculative-config": str,
    # hidden-state extraction (docs/extract.md; vLLM PR #33736, "extract_hidden_states"):
    # the states must cover whole prompts, and a KV connector writes them out
    "--no-enable-prefix-caching": None,
    "--no-enable-chunked-prefill": None,
    "--kv-transfer-config": str,
}
SERVERS = {"sglang": SGLANG_FLAGS, "vllm": VLLM_FLAGS}
MODEL_FLAG = {"sglang": ("--model-path", "--model")}


@dataclass
class Launch:
    line: int
    server: str
    env: dict[str, str]
    model: str | None
    flags: list[tuple[str, str | None]]
    """(flag, value) in order; value None for a switch."""

    def get(self, *names: str) -> str | None:
        return next((v for f, v in self.flags if f in names), None)


def blocks(path: Path) -> list[tuple[str, int, str]]:
    text = path.read_text()
    return [
        (m.group(1).lower(), text.count("\n", 0, m.start(2)) + 1, m.group(2))
        for m in FENCE.finditer(text)
    ]


def logical_lines(body: str, first: int) -> list[tuple[int, str]]:
    """Lines joined at trailing backslashes; comments and blank lines dropped."""
    out, pending, start = [], "", first
    for i, raw in enumerate(body.splitlines()):
        if not pending:
            start = first + i
        line = raw.rstrip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = (pending + line).strip()
        pending = ""
        if line and not line.startswith("#"):
            out.append((start, line))
    if pending.strip():
        out.append((start, pending.strip()))
    return out


def parse(line_no: int, text: str, flags_of=SERVERS) -> Launch:
    words = shlex.split(text)
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    if words[:3] in (
        ["python", "-m", "sglang.launch_server"],
        ["python3", "-m", "sglang.launch_server"],
    ):
        server, rest = "sglang", words[3:]
    elif words[:2] == ["vllm", "serve"]:
        server, rest = "vllm", words[2:]
    else:
        raise ValueError(f"line {line_no}: not an SGLang or vLLM launch line: {text}")
    known = flags_of[server]
    model = None
    if server == "vllm" and rest and not rest[0].startswith("-"):
        model = rest.pop(0)
    parsed: list[tuple[str, str | None]] = []
    i = 0
    while i < len(rest):
        word = rest[i]
        if not word.startswith("-"):
            raise ValueError(f"line {line_no}: stray argument {word!r}")
        flag, eq, value = word.partition("=")
        if flag not in known:
            raise ValueError(f"line {line_no}: {server} has no flag {flag}")
        if known[flag] is None:
            if eq:
                raise ValueError(f"line {line_no}: {flag} is a switch and takes no value")
            parsed.append((flag, None))
            i += 1
            continue
        if not eq:
            if i + 1 >= len(rest) or rest[i + 1].startswith("--"):
                raise ValueError(f"line {line_no}: {flag} needs a value")
            value = rest[i + 1]
            i += 1
        check_value(line_no, flag, value, known[flag])
        parsed.append((flag, value))
        i += 1
    if server == "sglang":
        model = next((v for f, v in parsed if f in MODEL_FLAG["sglang"]), None)
    return Launch(line_no, server, env, model, parsed)


def check_value(line_no: int, flag: str, value: str, kind: Flag) -> None:
    where = f"line {line_no}: {flag} {value}"
    if kind is int:
        if not re.fullmatch(r"\d+", value):
            raise ValueError(f"{where}: expected an integer")
    elif kind == "fraction":
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"{where}: expected a number") from None
        if not 0 < number <= 1:
            raise ValueError(f"{where}: expected a fraction in (0, 1]")
    elif isinstance(kind, frozenset) and value not in kind:
        raise ValueError(f"{where}: not one of {sorted(kind)}")

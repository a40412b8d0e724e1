"""The SGLang and vLLM launch lines of the docs: kept in one place, and using real flags.

They cannot run here (they need 8 GPUs and the weights), so they live in ```launch blocks of
docs/running-at-scale.md, in its "Server launch lines" section, and nowhere else; this test
parses them and checks each flag against the flags the servers document, each value against
the flag's type or choices, and the tensor-parallel size against the GPUs the line gets.

The flag tables below come from reference/SERVER_APIS.md and the servers' own documentation:
SGLang's "Server Arguments" page and `python -m sglang.launch_server --help`
(`python/sglang/srt/server_args.py`), its reasoning-parser table ("Reasoning Parser" page);
vLLM's `vllm serve --help` ("Engine Arguments", "OpenAI-Compatible Server" pages) and the
model recipes (Qwen3, Kimi-K2-Thinking) for the parser names. Add a flag here, with where it
is documented, before using it in a launch line.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from launch_blocks import (
    FENCE,
    SERVERS,
    Launch,
    blocks,
    logical_lines,
    parse,
)

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "running-at-scale.md"
SECTION = "## Server launch lines"
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LAUNCHERS = ("sglang.launch_server", "vllm serve")
# docs/export.md shows how to serve an exported drafter; tests/test_docs_export.py checks
# its launch lines with the parser and flag tables below.
LAUNCH_PAGES = {PAGE, REPO / "docs" / "export.md", REPO / "docs" / "extract.md"}
GPUS_PER_NODE = 8


TP_FLAGS = {
    "sglang": ("--tp", "--tp-size", "--tensor-parallel-size"),
    "vllm": ("--tensor-parallel-size", "-tp"),
}


def launch_lines() -> list[Launch]:
    text = PAGE.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    end = len(text) if end < 0 else end
    found = []
    for m in FENCE.finditer(text):
        if m.group(1).lower() != "launch":
            continue
        first = text.count("\n", 0, m.start(2)) + 1
        assert start < m.start() < end, f"a launch block at line {first} is outside '{SECTION}'"
        found += [parse(n, line) for n, line in logical_lines(m.group(2), first)]
    return found


def test_launch_lines_are_in_one_place() -> None:
    for doc in DOCS:
        for lang, first, body in blocks(doc):
            if lang == "launch":
                assert doc in LAUNCH_PAGES, (
                    f"{doc.name}:{first}: launch blocks belong in {PAGE.name}"
                )
            else:
                assert not any(name in body for name in LAUNCHERS), (
                    f"{doc.name}:{first}: a server launch line outside a launch block; "
                    f"put it in {PAGE.name}, section '{SECTION}'"
                )


def test_there_are_launch_lines_for_both_servers_on_8_gpus() -> None:
    lines = launch_lines()
    for server in SERVERS:
        assert any(
            launch.server == server and launch.get(*TP_FLAGS[server]) == "8" for launch in lines
        ), f"no {server} launch line with tensor parallel 8"


@pytest.mark.parametrize("launch", launch_lines(), ids=lambda x: f"line{x.line}-{x.server}")
def test_launch_line(launch: Launch) -> None:
    assert launch.model, f"line {launch.line}: no model"
    assert launch.get("--port"), f"line {launch.line}: say the port gen is pointed at"
    tp = launch.get(*TP_FLAGS[launch.server])
    assert tp, f"line {launch.line}: no tensor-parallel size"
    gpus = launch.env.get("CUDA_VISIBLE_DEVICES")
    visible = len(gpus.split(",")) if gpus else GPUS_PER_NODE
    assert int(tp) == visible, f"line {launch.line}: --tp {tp} on {visible} GPUs"
    names = [f for f, _ in launch.flags]
    assert len(names) == len(set(names)), f"line {launch.line}: a flag given twice"


def test_gen_examples_use_the_launched_ports() -> None:
    """The page's gen commands point at ports its launch lines serve."""
    launched = {int(launch.get("--port")) for launch in launch_lines()}
    used = {
        int(p)
        for lang, _, body in blocks(PAGE)
        if lang == "console"
        for p in re.findall(r"--server http://127\.0\.0\.1:(\d+)", body)
    }
    assert used and used <= launched, f"gen uses ports {sorted(used - launched)} nobody serves"


@pytest.mark.parametrize(
    "line, error",
    [
        ("python -m sglang.launch_server --model-path m --tp 8 --tensor-parallel 8", "no flag"),
        ("python -m sglang.launch_server --model-path m --tp eight", "integer"),
        ("python -m sglang.launch_server --model-path m --mem-fraction-static 1.5", "fraction"),
        ("vllm serve m --reasoning-parser deepseek-r1", "not one of"),
        ("vllm serve m --trust-remote-code=1", "switch"),
        ("vllm serve m --port", "needs a value"),
        ("sglang serve --model-path m", "not an SGLang or vLLM"),
    ],
)
def test_the_checker_catches_mistakes(line: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse(1, line)


def test_continuations_and_environment() -> None:
    body = "# comment\nCUDA_VISIBLE_DEVICES=0,1 vllm serve org/model \\\n    -tp 2 --port 8000\n"
    [(line, text)] = logical_lines(body, 10)
    launch = parse(line, text)
    assert (line, launch.model, launch.env) == (11, "org/model", {"CUDA_VISIBLE_DEVICES": "0,1"})
    assert launch.flags == [("-tp", "2"), ("--port", "8000")]


EXTRACT_PAGE = REPO / "docs" / "extract.md"
LAYERS = {"Qwen/Qwen3-8B": 36, "moonshotai/Kimi-K2.5": 61, "deepseek-ai/DeepSeek-R1-0528": 61}
"""num_hidden_layers of each model extract.md launches (their config.json)."""


def extract_launch_lines() -> list[Launch]:
    return [
        parse(n, line)
        for lang, first, body in blocks(EXTRACT_PAGE)
        if lang == "launch"
        for n, line in logical_lines(body, first)
    ]


def test_extract_launch_lines_name_the_default_ids_then_n():
    """vLLM's extract_hidden_states gets the aux ids followed by N (the pre-norm last
    state); the ids are the default (2, N//2, N-3) of each model, as extract uses them."""
    import json

    from eagle3kit.model import default_layer_ids

    lines = extract_launch_lines()
    assert {launch.model for launch in lines} == set(LAYERS)
    commands = [
        line
        for lang, first, body in blocks(EXTRACT_PAGE)
        if lang == "text"
        for _, line in logical_lines(body, first)
        if line.startswith("eagle3kit extract")
    ]
    for launch in lines:
        n = LAYERS[launch.model]
        spec = json.loads(launch.get("--speculative-config"))
        ids = spec["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"]
        assert ids == [*default_layer_ids(n), n], (launch.model, ids)
        assert launch.get("--no-enable-prefix-caching", "--no-enable-chunked-prefill") is None
        assert {
            "--no-enable-prefix-caching",
            "--no-enable-chunked-prefill",
            "--kv-transfer-config",
        } <= {f for f, _ in launch.flags}
        name = launch.model.split("/")[1]
        layers = ",".join(map(str, default_layer_ids(n)))
        assert any(f"/models/{name} --layers {layers} " in c for c in commands), (name, layers)


@pytest.mark.parametrize(
    "model",
    ["moonshotai/Kimi-K2.5", "deepseek-ai/DeepSeek-R1-0528", "Qwen/Qwen3-235B-A22B-Thinking-2507"],
)
def test_the_large_models_have_launch_lines_and_a_download_step(model):
    servers = {launch.server for launch in launch_lines() if launch.model == model}
    assert servers == {"sglang", "vllm"}, (model, servers)
    name = model.split("/")[1]
    assert f"hf download {model} --local-dir /models/{name}" in PAGE.read_text()

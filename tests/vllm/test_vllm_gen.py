"""gen `--api vllm` against the real engine: token-exact, and resumable after SIGKILL.

The reference is transformers' greedy output through gen's in-process engine (`--engine hf`,
itself checked against `model.generate` in tests/test_gen_hf.py): the same prompt files, the
same chat template (which puts `<think>` into the generation prompt), the same settings.
Multi-turn conversations are generated turn by turn, each later prompt rendering the model's
own earlier answer, so equality there covers gen's history handling against the engine too.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import MAX_TOKENS, World

from eagle3kit import _ui, gen
from eagle3kit.format import Dataset
from eagle3kit.gen.config import ServerSpec

QUIET = _ui.OutputOptions(quiet=True)

pytestmark = pytest.mark.vllm


def samples(path: Path) -> dict[str, tuple[list[int], list[int], str]]:
    return {
        s.sample_id: (
            [int(i) for i in s.prompt_ids],
            [int(i) for i in s.completion_ids],
            s.finish_reason,
        )
        for s in Dataset(path)
    }


def test_gen_on_vllm_is_token_exact_against_transformers(
    plain_server, world: World, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    prompts = [world.single_turn, world.multi_turn]
    common = dict(temperature=0.0, max_tokens=MAX_TOKENS, output=QUIET)
    gen.run(
        gen.GenConfig(
            prompts,
            tmp_path / "vllm",
            servers=[ServerSpec(plain_server.url)],
            api="vllm",
            tokenizer=world.target,
            **common,
        )
    )
    gen.run(gen.GenConfig(prompts, tmp_path / "hf", engine="hf", target=world.target, **common))
    served, reference = samples(tmp_path / "vllm"), samples(tmp_path / "hf")
    assert len(reference) == 6 + 2 * 4  # 6 single-turn samples, 4 conversations of 2 turns
    assert served == reference

    tok = AutoTokenizer.from_pretrained(str(world.target))
    think, end_think, end = (
        tok.convert_tokens_to_ids(t) for t in ("<think>", "</think>", "<|im_end|>")
    )
    newline = tok("\n", add_special_tokens=False)["input_ids"]
    for prompt, _, _ in served.values():
        assert prompt[-1 - len(newline) :] == [think, *newline]  # the template's "<think>\n"
    # The completions start inside the reasoning: most close it and end their turn.
    closed = [c for _, c, f in served.values() if f == "stop" and c[-1] == end and end_think in c]
    assert len(closed) >= len(served) // 2
    later_turns = [p for p, _, _ in served.values() if p.count(think) == 2]
    assert len(later_turns) == 4  # the second turn's history holds the first answer's <think>


def test_gen_resumes_after_sigkill_against_the_real_server(
    plain_server, world: World, tokens: Path, tmp_path: Path
) -> None:
    """Killed once it has committed, rerun with the same command: the dataset is the one an
    uninterrupted run (the session's `tokens`) wrote, each sample once."""
    out = tmp_path / "killed"
    argv = [
        sys.executable,
        "-m",
        "eagle3kit",
        "gen",
        str(world.train_prompts),
        str(out),
        "--server",
        plain_server.url,
        "--api",
        "vllm",
        "--tokenizer",
        str(world.target),
        "--temperature",
        "0",
        "--max-tokens",
        str(MAX_TOKENS),
        "--concurrency",
        "4",
        "--commit-every",
        "8",
        "--commit-interval",
        "0.5",
        "--quiet",
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 180
    try:
        while not (out / "manifest.json").is_file() or len(Dataset(out)) < 8:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "no commit within 180 s"
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    before = samples(out)
    assert 8 <= len(before) < 96
    rerun = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr
    after = samples(out)
    assert after == samples(tokens)
    assert all(after[k] == v for k, v in before.items())
    assert Dataset(out).verify() == []

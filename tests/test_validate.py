"""`eagle3kit validate`: each check against a dataset seeded with exactly its defect.

Datasets are built in-process with real tokenizers and chat templates (Qwen3 with thinking on
and off, QwQ and DeepSeek-R1 which open the reasoning in the prompt, the Kimi-K2-Thinking
stand-in, the gpt-oss stand-in): prompts come from the template, completions are written as
the model emits them, and the seeded samples must be the ones flagged, no more, no fewer.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import prewarmed
import pytest
from real_tokenizers import (
    TEMPLATES,
    deepseek_r1_tokenizer_dir,
    gpt_oss_tokenizer_dir,
    kimi_tokenizer_dir,
    qwen3_tokenizer_dir,
)
from typer.testing import CliRunner

from eagle3kit._ui import OutputOptions
from eagle3kit.chat.reasoning import load_renderer, plain_ids
from eagle3kit.chat.render import Renderer
from eagle3kit.errors import UserError
from eagle3kit.format import Dataset, DatasetError, DatasetWriter, TokenSample
from eagle3kit.validate import ValidateConfig, ValidateReport, run

QUIET = OutputOptions(quiet=True)
N = 20
SEEDED = [3, 7, 11]

# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tok_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.getbasetemp()


@pytest.fixture(scope="session")
def qwen3(tok_root: Path) -> Renderer:
    return load_renderer(qwen3_tokenizer_dir(tok_root))


@pytest.fixture(scope="session")
def qwen3_off(qwen3: Renderer) -> Renderer:
    return load_renderer(qwen3.tokenizer_dir, chat_template_kwargs={"enable_thinking": False})


@pytest.fixture(scope="session")
def qwq(qwen3: Renderer) -> Renderer:
    return load_renderer(qwen3.tokenizer_dir, chat_template=TEMPLATES / "Qwen-QwQ-32B.jinja")


@pytest.fixture(scope="session")
def r1(tok_root: Path) -> Renderer:
    return load_renderer(deepseek_r1_tokenizer_dir(tok_root))


@pytest.fixture(scope="session")
def kimi(tok_root: Path) -> Renderer:
    return load_renderer(kimi_tokenizer_dir(tok_root))


@pytest.fixture(scope="session")
def gpt_oss(tok_root: Path) -> Renderer:
    return load_renderer(gpt_oss_tokenizer_dir(tok_root))


# -- building datasets ---------------------------------------------------------------------


def messages(i: int) -> list[dict]:
    return [{"role": "user", "content": f"Question number {i}: what is {i} plus {i}?"}]


def completion_text(
    r: Renderer,
    i: int,
    *,
    reasoning: str | None = None,
    answer: str | None = None,
    close: bool = True,
    eos: bool = True,
) -> str:
    """What the model emits: reasoning in its markers (the opening one only when the prompt
    did not write it), the answer, then the end-of-turn token."""
    eos_text = r.decode([r.stop_token_ids[0]]) if eos else ""
    answer = f"The answer is {2 * i}." if answer is None else answer
    if r.harmony:
        reasoning = f"Adding {i} twice." if reasoning is None else reasoning
        analysis = f"<|channel|>analysis<|message|>{reasoning}"
        if not close:
            return analysis
        return f"{analysis}<|end|><|start|>assistant<|channel|>final<|message|>{answer}" + (
            "<|return|>" if eos else ""
        )
    if r.think is None:
        return answer + eos_text
    start, end = r.think
    reasoning = f"I add {i} and {i}, which gives {2 * i}." if reasoning is None else reasoning
    off = "enable_thinking" in r.chat_template_kwargs
    if off:
        return answer + eos_text
    opening = "" if r.prompt_opens_think else f"{start}\n"
    closing = f"\n{end}\n\n{answer}{eos_text}" if close else ""
    return f"{opening}{reasoning}{closing}"


def sample(r: Renderer, i: int, **kw) -> TokenSample:
    text = kw.pop("text", None)
    finish = kw.pop("finish", "stop")
    store_messages = kw.pop("store_messages", False)
    prompt = kw.pop("prompt", None)
    comp = r.encode(text if text is not None else completion_text(r, i, **kw))
    meta = {"messages": messages(i)} if store_messages else {}
    return TokenSample(
        f"s{i:03d}",
        prompt if prompt is not None else r.render(messages(i)),
        comp,
        finish_reason=finish,
        partition="math" if i % 2 else "chat",
        metadata=meta,
    )


def write(
    path: Path,
    r: Renderer,
    samples: list[TokenSample],
    *,
    store: bool = True,
    commit_every: int = 8,
) -> Path:
    identity = r.identity()
    where = {k: identity.pop(k) for k in ("tokenizer", "chat_template_file")}
    with DatasetWriter(
        path,
        config={"stage": "gen", "renderer": identity},
        provenance=where,
        commit_every=commit_every,
    ) as w:
        if store:
            w.store_files("tokenizer", r.files())
        for s in samples:
            w.add(s)
    return path


def build(
    path: Path,
    r: Renderer,
    seed: Callable[[int], TokenSample] | None = None,
    seeded: list[int] = SEEDED,
    **kw,
) -> Path:
    samples = [seed(i) if seed and i in seeded else sample(r, i, **kw) for i in range(N)]
    return write(path, r, samples)


def check(path: Path, **kw) -> ValidateReport:
    return run(ValidateConfig(path, output=QUIET, **kw))


def flagged(report: ValidateReport, name: str) -> list[str]:
    ids = list(Dataset(report.path, verify_shards=False).sample_ids())
    return sorted(ids[i] for i in report.check(name).flagged)


def ids_of(indices: list[int]) -> list[str]:
    return [f"s{i:03d}" for i in indices]


# -- clean datasets pass -------------------------------------------------------------------


@pytest.mark.parametrize("family", ["qwen3", "qwen3_off", "qwq", "r1", "kimi", "gpt_oss"])
def test_clean_dataset_passes(family: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    r = request.getfixturevalue(family)
    report = check(build(tmp_path / "ds", r, store_messages=True))
    assert report.passed, [(c.name, c.detail, c.reasons) for c in report.checks]
    assert report.exit_code == 0
    statuses = {c.name: c.status for c in report.checks}
    assert statuses["round_trip"] == "pass"
    if family != "qwen3_off":
        assert statuses["reasoning"] == "pass"
        assert report.check("reasoning").rate == 1.0
        assert statuses["literal_markers"] == "pass"
    else:
        assert statuses["reasoning"] == "skip"
        assert "thinking is off" in report.check("reasoning").detail
    assert report.warnings == []


def test_profile_learned_from_the_stored_template(
    qwq: Renderer, qwen3: Renderer, kimi: Renderer, tmp_path: Path
) -> None:
    opens = check(build(tmp_path / "qwq", qwq)).profile
    assert opens["reasoning"].startswith("on, opened by the template")
    assert opens["generation_prompt"].endswith("assistant\n<think>\n")
    model = check(build(tmp_path / "qwen3", qwen3)).profile
    assert model["reasoning"] == "on, opened by the model"
    assert model["think_start_id"] == 151667
    k = check(build(tmp_path / "kimi", kimi)).profile
    assert k["think_end"] == "</think>" and k["think_end_id"] == 151666


def test_harmony_profile_learned_from_the_template(gpt_oss: Renderer, tmp_path: Path) -> None:
    report = check(build(tmp_path / "ds", gpt_oss))
    assert {k: v for k, v in report.profile.items() if v is not None} == {
        "reasoning": "harmony channels: analysis, then final",
        "analysis_channel": "<|channel|>analysis<|message|>",
        "analysis_end": "<|end|>",
        "final_channel": "<|start|>assistant<|channel|>final<|message|>",
        "tool_call_end": "<|call|>",
        "generation_prompt": "<|start|>assistant",
        "stop_token_ids": gpt_oss.encode("<|return|><|call|>"),
    }
    assert "<|channel|> / <|message|>" in report.check("literal_markers").detail


# -- each defect, flagged on exactly its samples -------------------------------------------


def test_structure_think_end_missing(qwen3: Renderer, tmp_path: Path) -> None:
    report = check(
        build(
            tmp_path / "ds",
            qwen3,
            lambda i: sample(
                qwen3, i, text=f"<think>\nthinking {i} and then answering {i}<|im_end|>"
            ),
        )
    )
    assert report.check("structure").status == "fail"
    assert flagged(report, "structure") == ids_of(SEEDED)
    assert report.check("structure").reasons == {"think-end missing": 3}
    assert report.exit_code == 1


def test_structure_think_start_repeated_when_prompt_opened_it(r1: Renderer, tmp_path: Path) -> None:
    # The prompt already holds <think>; a completion that opens it again has two.
    report = check(
        build(
            tmp_path / "ds", r1, lambda i: sample(r1, i, text="<think>\n" + completion_text(r1, i))
        )
    )
    assert flagged(report, "structure") == ids_of(SEEDED)
    assert report.check("structure").reasons == {"think-start repeated": 3}


def test_structure_end_of_turn_missing(kimi: Renderer, tmp_path: Path) -> None:
    report = check(build(tmp_path / "ds", kimi, lambda i: sample(kimi, i, eos=False)))
    assert flagged(report, "structure") == ids_of(SEEDED)
    assert report.check("structure").reasons == {"no end-of-turn token last": 3}


def test_structure_generation_prompt_missing_its_think(
    qwq: Renderer, qwen3: Renderer, tmp_path: Path
) -> None:
    # Rendered with the Qwen3 template instead of QwQ's: no <think> pre-filled in the prompt.
    report = check(
        build(tmp_path / "ds", qwq, lambda i: sample(qwq, i, prompt=qwen3.render(messages(i))))
    )
    assert flagged(report, "structure") == ids_of(SEEDED)
    assert "prompt does not end with the generation prompt" in report.check("structure").reasons


def test_literal_markers(qwen3: Renderer, kimi: Renderer, tmp_path: Path) -> None:
    for r, name in ((qwen3, "qwen3"), (kimi, "kimi")):
        start, end = r.think  # type: ignore[misc]

        def literal(i: int, r: Renderer = r, start: str = start, end: str = end) -> TokenSample:
            eos = r.stop_token_ids[0]
            ids = (
                plain_ids(r.tokenizer, f"{start}\nthinking about {i}\n{end}\n\n")
                + r.encode(f"It is {2 * i}.")
                + [eos]
            )
            return TokenSample(
                f"s{i:03d}", r.render(messages(i)), ids, partition="math" if i % 2 else "chat"
            )

        report = check(build(tmp_path / name, r, literal))
        assert report.check("literal_markers").status == "fail"
        assert flagged(report, "literal_markers") == ids_of(SEEDED), name


def test_truncation(qwq: Renderer, tmp_path: Path) -> None:
    def cut(i: int) -> TokenSample:
        answer = i == SEEDED[0]  # one cut inside the answer, the others inside the reasoning
        return sample(
            qwq,
            i,
            finish="length",
            text=completion_text(qwq, i, eos=False)
            if answer
            else f"thinking about {i} for a long time",
        )

    report = check(build(tmp_path / "ds", qwq, cut))
    res = report.check("truncation")
    assert res.status == "fail" and res.rate == 0.15 and res.threshold == 0.05
    assert flagged(report, "truncation") == ids_of(SEEDED)
    assert res.reasons == {"cut inside the reasoning": 2, "cut inside the answer": 1}
    assert report.partitions["math"]["truncated"] == 0.3  # 3, 7, 11 of the 10 odd: "math"
    assert check(tmp_path / "ds", max_truncation=0.2).check("truncation").status == "pass"
    assert flagged(report, "structure") == []


def test_reasoning_capture(qwen3: Renderer, tmp_path: Path) -> None:
    seeded = list(range(12))
    report = check(
        build(tmp_path / "ds", qwen3, lambda i: sample(qwen3, i, reasoning=""), seeded=seeded)
    )
    res = report.check("reasoning")
    assert res.status == "fail" and res.rate == 0.4
    assert flagged(report, "reasoning") == ids_of(seeded)
    assert check(tmp_path / "ds", min_reasoning=0.3).check("reasoning").status == "pass"


def test_degenerate(qwen3: Renderer, tmp_path: Path) -> None:
    def bad(i: int) -> TokenSample:
        if i == 3:
            return sample(qwen3, i, answer="\n")  # an empty answer
        if i == 7:
            return sample(qwen3, i, answer="I will say it again. " * 80)  # a loop
        return sample(qwen3, i, text=f"<think>\nthinking {i}<|im_end|>")  # no answer

    report = check(build(tmp_path / "ds", qwen3, bad))
    assert flagged(report, "degenerate") == ids_of(SEEDED)
    assert report.check("degenerate").reasons == {
        "repeated n-gram loop": 1,
        "empty answer": 1,
        "all reasoning, no answer": 1,
    }


def test_round_trip(qwen3: Renderer, tmp_path: Path) -> None:
    def injected(i: int) -> TokenSample:  # a default system prompt the source did not have
        prompt = qwen3.render([{"role": "system", "content": "You are helpful."}, *messages(i)])
        return sample(qwen3, i, prompt=prompt, store_messages=True)

    report = check(build(tmp_path / "ds", qwen3, injected, store_messages=True))
    assert flagged(report, "round_trip") == ids_of(SEEDED)
    plain = check(build(tmp_path / "plain", qwen3)).check("round_trip")
    assert plain.status == "skip" and "no source messages" in plain.detail


def test_coverage(kimi: Renderer, tmp_path: Path) -> None:
    def no_loss(i: int) -> TokenSample:
        s = sample(kimi, i)
        s.loss_mask = np.zeros(s.num_tokens, np.uint8)
        return s

    report = check(build(tmp_path / "ds", kimi, no_loss))
    assert flagged(report, "coverage") == ids_of(SEEDED)
    assert report.partitions["chat"]["loss_tokens"] > 0


def test_harmony_tokens_without_channels(gpt_oss: Renderer, tmp_path: Path) -> None:
    # gpt-oss's tokens under a template that writes no analysis channel: no reasoning profile.
    r = load_renderer(gpt_oss.tokenizer_dir, chat_template=TEMPLATES / "Qwen-Qwen3-0.6B.jinja")
    report = check(
        write(
            tmp_path / "ds", r, [sample(r, i, text=f"It is {2 * i}.<|return|>") for i in range(N)]
        )
    )
    assert report.profile["reasoning"].startswith("none (harmony tokens")
    assert report.check("reasoning").status == "skip"
    assert report.check("literal_markers").status == "skip"
    assert any("no analysis channel" in w for w in report.warnings)


# -- gpt-oss harmony channels: each defect, flagged on exactly its samples -----------------
# The model's turn after the generation prompt `<|start|>assistant`: the analysis channel,
# then the final one, then <|return|> (or a tool call ending in <|call|>, with no final).

ANALYSIS = "<|channel|>analysis<|message|>"
FINAL = "<|start|>assistant<|channel|>final<|message|>"
TOOL_CALL = (
    "<|channel|>analysis<|message|>I need the weather.<|end|><|start|>assistant"
    "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    '{"city": "Paris"}<|call|>'
)
TOOL_CALLS = [0, 2]
"""Samples that end in a tool call: valid, never flagged."""


def harmony_build(
    path: Path, r: Renderer, seeded: dict[int, Callable[[int], TokenSample]], **kw
) -> Path:
    samples = [
        seeded[i](i)
        if i in seeded
        else sample(r, i, text=TOOL_CALL)
        if i in TOOL_CALLS
        else sample(r, i, **kw)
        for i in range(N)
    ]
    return write(path, r, samples)


HARMONY_STRUCTURE = {
    1: ("analysis channel missing", "<|channel|>final<|message|>It is 2.<|return|>"),
    3: (
        "analysis channel repeated",
        f"{ANALYSIS}First.<|end|><|start|>assistant{ANALYSIS}Again.<|end|>{FINAL}6<|return|>",
    ),
    5: ("final channel missing", f"{ANALYSIS}Thinking about 5.<|end|><|return|>"),
    7: ("final channel repeated", f"{ANALYSIS}T.<|end|>{FINAL}14.<|end|>{FINAL}14.<|return|>"),
    9: (
        "final channel before the analysis",
        f"<|channel|>final<|message|>18<|end|><|start|>assistant{ANALYSIS}T.<|return|>",
    ),
    11: ("analysis not closed before the final channel", f"{ANALYSIS}T.{FINAL}22<|return|>"),
    13: ("no content after the final channel", f"{ANALYSIS}T.<|end|>{FINAL}<|return|>"),
    15: ("no end-of-turn token last", f"{ANALYSIS}T.<|end|>{FINAL}It is 30."),
}


def test_harmony_structure(gpt_oss: Renderer, tmp_path: Path) -> None:
    r = gpt_oss
    seeded: dict[int, Callable[[int], TokenSample]] = {
        i: (lambda i, text=text: sample(r, i, text=text))
        for i, (_, text) in HARMONY_STRUCTURE.items()
    }
    # Rendered without the generation prompt: the model's turn was never opened.
    seeded[17] = lambda i: sample(
        r,
        i,
        prompt=r.encode(
            r.tokenizer.apply_chat_template(
                messages(i), tokenize=False, add_generation_prompt=False
            )
        ),
    )
    report = check(harmony_build(tmp_path / "ds", r, seeded))
    assert report.check("structure").status == "fail"
    assert flagged(report, "structure") == ids_of(sorted(seeded))
    assert report.check("structure").reasons == {
        **{reason: 1 for reason, _ in HARMONY_STRUCTURE.values()},
        "prompt does not end with the generation prompt": 1,
    }
    # Degenerate too: stopped after the analysis (5), an empty final message (13).
    assert flagged(report, "degenerate") == ids_of([5, 13])


def test_harmony_literal_markers(gpt_oss: Renderer, tmp_path: Path) -> None:
    r = gpt_oss
    ret = r.encode("<|return|>")

    def plain(text: str) -> list[int]:
        return plain_ids(r.tokenizer, text) or []

    def literal(i: int) -> TokenSample:
        if i == 3:  # the whole turn decoded and encoded again as ordinary text
            ids = plain(completion_text(r, i, eos=False)) + ret
        elif i == 7:  # only the final channel's header as text
            ids = r.encode(f"{ANALYSIS}Adding 7.<|end|>") + plain(f"{FINAL}It is 14.") + ret
        else:  # "<|return|>" as text after the answer, then the real one
            ids = r.encode(completion_text(r, i, eos=False)) + plain("<|return|>") + ret
        return TokenSample(
            f"s{i:03d}", r.render(messages(i)), ids, partition="math" if i % 2 else "chat"
        )

    report = check(harmony_build(tmp_path / "ds", r, dict.fromkeys(SEEDED, literal)))
    assert report.check("literal_markers").status == "fail"
    assert flagged(report, "literal_markers") == ids_of(SEEDED)


def test_harmony_truncation(gpt_oss: Renderer, tmp_path: Path) -> None:
    r = gpt_oss
    seeded: dict[int, Callable[[int], TokenSample]] = {
        3: lambda i: sample(r, i, finish="length", eos=False),  # cut inside the answer
        7: lambda i: sample(r, i, finish="length", close=False),
        11: lambda i: sample(r, i, finish="length", close=False, reasoning="Adding " * 9),
    }
    report = check(harmony_build(tmp_path / "ds", r, seeded))
    res = report.check("truncation")
    assert res.status == "fail" and flagged(report, "truncation") == ids_of([3, 7, 11])
    assert res.reasons == {"cut inside the reasoning": 2, "cut inside the answer": 1}
    assert flagged(report, "structure") == []


def test_harmony_reasoning_capture(gpt_oss: Renderer, tmp_path: Path) -> None:
    r = gpt_oss
    seeded = dict.fromkeys(range(3, 15), lambda i: sample(r, i, reasoning="" if i % 2 else "\n  "))
    report = check(harmony_build(tmp_path / "ds", r, seeded))
    res = report.check("reasoning")
    assert flagged(report, "reasoning") == ids_of(list(range(3, 15)))
    assert res.status == "fail" and res.rate == 0.4
    assert check(tmp_path / "ds", min_reasoning=0.3).check("reasoning").status == "pass"
    assert flagged(report, "structure") == []


def test_harmony_degenerate(gpt_oss: Renderer, tmp_path: Path) -> None:
    r = gpt_oss
    seeded: dict[int, Callable[[int], TokenSample]] = {
        3: lambda i: sample(r, i, answer="\n"),  # an empty answer
        7: lambda i: sample(r, i, answer="I will say it again. " * 80),  # a loop
        11: lambda i: sample(r, i, text=f"{ANALYSIS}Thinking about {i}.<|return|>"),  # no answer
    }
    report = check(harmony_build(tmp_path / "ds", r, seeded))
    assert flagged(report, "degenerate") == ids_of([3, 7, 11])
    assert report.check("degenerate").reasons == {
        "repeated n-gram loop": 1,
        "empty answer": 1,
        "all reasoning, no answer": 1,
    }


def test_harmony_round_trip(gpt_oss: Renderer, tmp_path: Path) -> None:
    r = gpt_oss

    def other_day(i: int) -> TokenSample:  # the template writes the date: no defect
        text = re.sub(r"Current date: \S+", "Current date: 2025-01-01", r.render_text(messages(i)))
        return sample(r, i, prompt=r.encode(text), store_messages=True)

    def injected(i: int) -> TokenSample:  # a system prompt the source did not have
        system = [{"role": "system", "content": "Be brief."}]
        return sample(r, i, prompt=r.render([*system, *messages(i)]), store_messages=True)

    seeded = {**dict.fromkeys([4, 6], other_day), **dict.fromkeys(SEEDED, injected)}
    report = check(harmony_build(tmp_path / "ds", r, seeded, store_messages=True))
    assert flagged(report, "round_trip") == ids_of(SEEDED)
    assert "2 rendered on another day" in report.check("round_trip").detail


def test_reconstructed(r1: Renderer, tmp_path: Path) -> None:
    def rebuilt(i: int) -> TokenSample:
        s = sample(r1, i)
        s.metadata = {"reconstructed": True}
        return s

    report = check(build(tmp_path / "ds", r1, rebuilt))
    assert flagged(report, "reconstructed") == ids_of(SEEDED)
    assert check(tmp_path / "ds", skip=["reconstructed"]).passed


def test_integrity_duplicate_ids(qwen3: Renderer, tmp_path: Path) -> None:
    a = write(tmp_path / "a", qwen3, [sample(qwen3, i) for i in range(N)])
    b = write(tmp_path / "b", qwen3, [sample(qwen3, i) for i in SEEDED], commit_every=100)
    # Splice b's shard into a's manifest: the same ids committed twice.
    manifest = json.loads((a / "manifest.json").read_text())
    entry = json.loads((b / "manifest.json").read_text())["shards"][0]
    shutil.copy(b / "shards" / entry["name"], a / "shards" / entry["name"])
    manifest["shards"].append(entry)
    (a / "manifest.json").write_text(json.dumps(manifest))
    report = check(a)
    res = report.check("integrity")
    assert res.status == "fail" and res.reasons == {"duplicate sample ids": 3}
    assert res.failing == 3 and sorted(res.examples) == ids_of(SEEDED)


def test_integrity_template_changed_midway(qwen3: Renderer, qwq: Renderer, tmp_path: Path) -> None:
    path = build(tmp_path / "ds", qwen3)
    identity = qwq.identity()
    identity.pop("tokenizer")
    identity.pop("chat_template_file")
    with DatasetWriter(path, config={"stage": "gen", "renderer": identity}, force=True) as w:
        w.add(sample(qwq, 99))
    res = check(path).check("integrity")
    assert res.status == "fail"
    assert "several tokenizers or templates" in res.detail


def test_out_of_vocabulary_ids_fail_a_check(qwen3: Renderer, tmp_path: Path) -> None:
    """Ids past the tokenizer's entries (a server answering garbage, another tokenizer's
    data through convert) once crashed validate with an IndexError, exit 1."""
    size = len(qwen3.tokenizer)

    def garbage(i: int) -> TokenSample:
        s = sample(qwen3, i)
        s.completion_ids = [*s.completion_ids[:-1], size + i, 2**31 - 1, s.completion_ids[-1]]
        return s

    path = build(tmp_path / "ds", qwen3, garbage, store_messages=True)
    report = check(path)
    res = report.check("vocabulary")
    assert res.status == "fail" and flagged(report, "vocabulary") == ids_of(SEEDED)
    assert res.reasons == {"ids outside the vocabulary": 2 * len(SEEDED)}
    assert f"{size:,} entries" in res.detail
    assert report.check("round_trip").status == "pass"  # their prompts are fine
    clean = check(path, write_clean=tmp_path / "clean").clean
    assert clean is not None and clean["removed"] >= len(SEEDED)
    assert check(tmp_path / "clean").check("vocabulary").status == "pass"
    # Without a tokenizer there is no vocabulary to hold them against.
    bare = write(tmp_path / "bare", qwen3, [garbage(i) for i in SEEDED], store=False)
    assert check(bare).check("vocabulary").status == "skip"

    proc = subprocess.run(
        [*prewarmed.argv(), "validate", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert re.search(r"✗ ids in vocabulary +3/20 flagged", proc.stderr), proc.stderr


def test_recorded_violations_fail_a_check(qwen3: Renderer, tmp_path: Path) -> None:
    """What gen records in metadata.violations (stored answers that broke an invariant, and
    samples skipped after retrying such answers) is a failed check, by kind."""
    recorded = {
        3: ["5 output ids but completion_tokens = 4"],
        7: ["5 output ids but completion_tokens = 6", "no finish_reason"],
        11: ["2 output ids outside [0, 151669), e.g. -3"],
    }

    def violated(i: int) -> TokenSample:
        s = sample(qwen3, i)
        s.metadata = {"violations": recorded[i]}
        if i == 11:  # skipped after its retries: no completion stored
            s.completion_ids, s.finish_reason = [], "skipped:failed"
        return s

    report = check(build(tmp_path / "ds", qwen3, violated))
    res = report.check("invariants")
    assert res.status == "fail" and flagged(report, "invariants") == ids_of(SEEDED)
    assert res.reasons == {
        "N output ids but completion_tokens = N": 2,
        "no finish_reason": 1,
        "N output ids outside [N, N), e.g. N": 1,
    }
    assert check(build(tmp_path / "clean", qwen3)).check("invariants").status == "pass"


# -- no tokenizer, overrides, selection ----------------------------------------------------


def test_without_a_stored_tokenizer(qwen3: Renderer, tmp_path: Path) -> None:
    path = write(tmp_path / "ds", qwen3, [sample(qwen3, i) for i in range(N)], store=False)
    report = check(path)
    assert report.check("structure").status == "skip"
    assert "pass --tokenizer" in report.check("structure").detail
    assert report.check("truncation").status == "pass"
    with_tok = check(path, tokenizer=qwen3.tokenizer_dir)
    assert with_tok.check("structure").status == "pass"


def test_think_marker_override(qwen3: Renderer, tmp_path: Path) -> None:
    path = build(tmp_path / "ds", qwen3)
    report = check(path, think_start="<tool_call>", think_end="</tool_call>")
    assert report.check("structure").reasons.get("think-start missing") == N
    with pytest.raises(UserError, match="--think-start"):
        check(path, think_start="two words", think_end="</think>")
    with pytest.raises(UserError, match="go together"):
        ValidateConfig(path, think_start="<think>")


def test_only_and_skip(qwen3: Renderer, tmp_path: Path) -> None:
    path = build(tmp_path / "ds", qwen3)
    assert [c.name for c in check(path, only=["truncation", "coverage"]).checks] == [
        "truncation",
        "coverage",
    ]
    assert "structure" not in [c.name for c in check(path, skip=["structure"]).checks]
    with pytest.raises(UserError, match="--only: unknown check"):
        ValidateConfig(path, only=["nope"])


# -- unusable input: exit 2 with one message -----------------------------------------------


def test_corrupted_shard(qwen3: Renderer, tmp_path: Path) -> None:
    """Damaged shards are the integrity row, every one named, and the input unusable (2)."""
    path = build(tmp_path / "ds", qwen3)
    shards = sorted((path / "shards").iterdir())
    assert len(shards) >= 2
    for shard in shards[:2]:
        data = bytearray(shard.read_bytes())
        data[-5] ^= 0xFF
        shard.write_bytes(bytes(data))
    report = check(path, write_clean=tmp_path / "clean")
    assert report.exit_code == 2 and report.damaged and not report.passed
    row = report.check("integrity")
    assert row.status == "fail" and row.failing == 2 and row.total == len(shards)
    assert all(s.name in row.detail for s in shards[:2]) and "shard damaged" in row.detail
    assert {c.status for c in report.checks if c.name != "integrity"} == {"skip"}
    assert report.clean is None and not (tmp_path / "clean").exists()
    from eagle3kit.cli import app

    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 2 and "✗ integrity" in result.stderr
    assert shards[0].name in result.stderr


def test_empty_and_newer(qwen3: Renderer, tmp_path: Path) -> None:
    empty = write(tmp_path / "empty", qwen3, [])
    with pytest.raises(DatasetError, match="holds no samples"):
        check(empty)
    newer = build(tmp_path / "newer", qwen3)
    marker = json.loads((newer / "eagle3kit.json").read_text())
    marker["version"] = 99
    (newer / "eagle3kit.json").write_text(json.dumps(marker))
    with pytest.raises(DatasetError, match="newer than this eagle3kit"):
        check(newer)


# -- --write-clean and the command line ----------------------------------------------------


def test_write_clean(qwen3: Renderer, tmp_path: Path) -> None:
    path = build(tmp_path / "ds", qwen3, lambda i: sample(qwen3, i, eos=False))
    before = sorted((p.name, p.stat().st_mtime_ns) for p in (path / "shards").iterdir())
    report = check(path, write_clean=tmp_path / "clean")
    assert report.clean == {"path": str(tmp_path / "clean"), "kept": N - 3, "removed": 3}
    assert sorted((p.name, p.stat().st_mtime_ns) for p in (path / "shards").iterdir()) == before
    clean = check(tmp_path / "clean")
    assert clean.passed and clean.samples == N - 3
    assert clean.profile == report.profile


def test_cli_exit_codes_and_json(qwen3: Renderer, tmp_path: Path) -> None:
    from eagle3kit.cli import app

    good = build(tmp_path / "good", qwen3)
    bad = build(tmp_path / "bad", qwen3, lambda i: sample(qwen3, i, eos=False))
    runner = CliRunner()
    ok = runner.invoke(app, ["validate", str(good), "--json"])
    assert ok.exit_code == 0, ok.output
    data = json.loads(ok.stdout)
    assert data["passed"] and {c["name"] for c in data["checks"]} >= {"structure", "truncation"}
    assert {"name", "status", "failing", "rate", "threshold"} <= set(data["checks"][0])
    failed = runner.invoke(app, ["validate", str(bad), "--max-truncation", "0.1"])
    assert failed.exit_code == 1
    assert "✗ final-turn structure" in failed.stderr
    missing = runner.invoke(app, ["validate", str(tmp_path / "nowhere")])
    assert missing.exit_code == 2 and "no such directory" in missing.stderr

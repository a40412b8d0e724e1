"""Chat-template rendering, checked token by token with real tokenizers and templates.

Expected prompts are written out by hand; the ids are checked against hand-written ids and
against an independent tokenizer (tiktoken over the same Qwen ranks), so neither the template
engine nor the HF tokenizer is trusted to check itself.
"""

from __future__ import annotations

import datetime
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import xxhash
from real_tokenizers import (
    KIMI_ID_OFFSET,
    KIMI_SPECIAL,
    QWEN2_PATTERN,
    QWEN_REGULAR_TOKENS,
    R1_ADDED,
    TEMPLATES,
    TOKENIZERS,
    deepseek_r1_tokenizer_dir,
    gpt_oss_tokenizer_dir,
    kimi_tokenizer_dir,
    phi3_tokenizer_dir,
    qwen3_tokenizer_dir,
)

from eagle3kit.chat.conversation import Conversation
from eagle3kit.chat.harmony import harmony_message
from eagle3kit.chat.render import (
    Renderer,
    generation_points,
    parse_chat_template_kwargs,
    think_markers,
)
from eagle3kit.errors import UserError

HI = [{"role": "user", "content": "hi"}]
QWEN3_ORIGINAL = TEMPLATES / "Qwen-Qwen3-0.6B.jinja"
QWQ = TEMPLATES / "Qwen-QwQ-32B.jinja"
# Qwen ids written out: <|im_start|> user \n hi <|im_end|> \n <|im_start|> assistant \n
IM_START, IM_END, USER, NL, HI_ID, ASSISTANT, NL2 = 151644, 151645, 872, 198, 6023, 77091, 271
THINK, END_THINK = 151667, 151668
KIMI_SYSTEM = (
    "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by "
    "Moonshot AI.<|im_end|>"
)

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TOOL_CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": '{"temp": 21}'},
]


# -- fixtures: each tokenizer built and loaded once per session ---------------------------


@pytest.fixture(scope="session")
def tok_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.getbasetemp()


@pytest.fixture(scope="session")
def qwen3(tok_root: Path) -> Renderer:
    return Renderer.load(qwen3_tokenizer_dir(tok_root))


@pytest.fixture(scope="session")
def qwen3_off(qwen3: Renderer) -> Renderer:
    return Renderer(qwen3.tokenizer, chat_template_kwargs={"enable_thinking": False})


@pytest.fixture(scope="session")
def qwq(qwen3: Renderer) -> Renderer:
    return Renderer(qwen3.tokenizer, QWQ.read_text(), template_file=QWQ)


@pytest.fixture(scope="session")
def r1(tok_root: Path) -> Renderer:
    return Renderer.load(deepseek_r1_tokenizer_dir(tok_root))


@pytest.fixture(scope="session")
def kimi(tok_root: Path) -> Renderer:
    return Renderer.load(kimi_tokenizer_dir(tok_root))


@pytest.fixture(scope="session")
def gpt_oss(tok_root: Path) -> Renderer:
    return Renderer.load(gpt_oss_tokenizer_dir(tok_root))


@pytest.fixture(scope="session")
def phi3() -> Renderer:
    return Renderer.load(phi3_tokenizer_dir())


@pytest.fixture(scope="session")
def oracles() -> dict[str, Callable[[str], list[int]]]:
    """tiktoken over the Qwen ranks, with each family's added tokens (ids from 151643 on):
    an encoder that shares no code with the HF tokenizers under test."""
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    ranks = load_tiktoken_bpe(str(TOKENIZERS / "qwen3" / "qwen.tiktoken"))

    def encoder(added: list[str]) -> Callable[[str], list[int]]:
        specials = {t: QWEN_REGULAR_TOKENS + i for i, t in enumerate(added)}
        enc = tiktoken.Encoding(
            name="oracle", pat_str=QWEN2_PATTERN, mergeable_ranks=ranks, special_tokens=specials
        )
        return lambda text: enc.encode(text, allowed_special="all")

    return {
        "qwen3": encoder(qwen3_added()),
        "r1": encoder([t for t, _ in R1_ADDED]),
        "kimi": encoder(kimi_added()),
    }


def qwen3_added() -> list[str]:
    config = json.loads((TOKENIZERS / "qwen3" / "tokenizer_config.json").read_text())
    return [
        v["content"]
        for _, v in sorted(config["added_tokens_decoder"].items(), key=lambda kv: int(kv[0]))
    ]


def kimi_added() -> list[str]:
    return [
        KIMI_SPECIAL.get(i, f"<|reserved_token_{i}|>") for i in range(163584, max(KIMI_SPECIAL) + 1)
    ]


def tokens(renderer: Renderer, ids: list[int]) -> list[str]:
    return [renderer.decode([i]) for i in ids]


# -- single-turn prompts, token by token ---------------------------------------------------


@pytest.mark.parametrize("template", [None, QWEN3_ORIGINAL], ids=["2025-07", "first-release"])
def test_qwen3_thinking_on_leaves_think_to_the_model(qwen3, oracles, template):
    r = Renderer(qwen3.tokenizer, template and template.read_text())
    assert r.render_text(HI) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = r.render(HI)
    assert ids == [IM_START, USER, NL, HI_ID, IM_END, NL, IM_START, ASSISTANT, NL]
    assert r.decode(ids[-3:]) == "<|im_start|>assistant\n"
    assert ids == oracles["qwen3"](r.render_text(HI))


@pytest.mark.parametrize("template", [None, QWEN3_ORIGINAL], ids=["2025-07", "first-release"])
def test_qwen3_thinking_off_puts_an_empty_think_block_in_the_prompt(qwen3, template):
    r = Renderer(
        qwen3.tokenizer,
        template and template.read_text(),
        chat_template_kwargs={"enable_thinking": False},
    )
    assert r.render_text(HI).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    ids = r.render(HI)
    assert ids[-7:] == [IM_START, ASSISTANT, NL, THINK, NL2, END_THINK, NL2]
    assert tokens(r, ids[-4:]) == ["<think>", "\n\n", "</think>", "\n\n"]


def test_qwq_prompt_ends_with_the_think_token(qwq, oracles):
    text = qwq.render_text(HI)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    ids = qwq.render(HI)
    assert ids[-5:] == [IM_START, ASSISTANT, NL, THINK, NL]
    assert qwq.decode(ids[-5:]) == "<|im_start|>assistant\n<think>\n"
    assert ids == oracles["qwen3"](text)
    assert qwq.prompt_opens_think


def test_deepseek_r1_prompt_has_one_bos_and_the_think_token(r1, oracles):
    text = r1.render_text(HI)
    assert text == "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜><think>\n"
    ids = r1.render(HI)
    assert ids == [151646, 151644, HI_ID, 151645, 151648, NL]
    assert ids == oracles["r1"](text)
    # The tokenizer adds BOS by default: tokenizing the template's text that way doubles it.
    assert r1.tokenizer.encode(text)[:2] == [151646, 151646]


def test_deepseek_r1_against_a_recorded_sglang_generation(r1):
    """SGLang's docs (responses/sglang-docs, R1-Distill-Qwen-7B) sent this conversation as
    text to /generate and got prompt_tokens=23: the template's 22 plus the BOS the server
    added again. The output ids decode to the recorded text."""
    messages = [
        {
            "role": "assistant",
            "content": "Give me the information and population of "
            "the capital of France in the JSON format.",
        }
    ]
    ids = r1.render(messages)
    assert len(ids) == 22 and ids.count(151646) == 1
    assert len(r1.tokenizer.encode(r1.render_text(messages))) == 23
    around_end_think = [12127, 2033, 311, 862, 3239, 624, 151649, 4913, 606, 788, 330, 59604]
    assert r1.decode(around_end_think) == 'atted response to their query.\n</think>{"name": "Paris'
    assert r1.decode([20, 15, 15, 15, 92, 151643]) == "5000}<｜end▁of▁sentence｜>"


def test_kimi_k2_thinking_prompt(kimi, oracles):
    text = kimi.render_text(HI)
    assert text == (
        KIMI_SYSTEM + "<|im_user|>user<|im_middle|>hi<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|>"
    )
    ids = kimi.render(HI)
    assert ids == oracles["kimi"](text)
    real = {
        i + KIMI_ID_OFFSET: t
        for i, t in zip(ids, tokens(kimi, ids), strict=True)
        if i >= QWEN_REGULAR_TOKENS
    }
    assert all(KIMI_SPECIAL[i] == t for i, t in real.items())  # stand-in ids map to real ones
    assert ids[-3:] == [163588 - KIMI_ID_OFFSET, ASSISTANT, 163601 - KIMI_ID_OFFSET]


def test_gpt_oss_harmony_prompt(gpt_oss):
    """The template writes today's date (strftime_now) into every prompt."""
    dates = {datetime.date.today().isoformat()}
    text = gpt_oss.render_text(HI)
    dates.add(datetime.date.today().isoformat())  # in case midnight passed meanwhile
    assert text in {
        "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
        f"Knowledge cutoff: 2024-06\nCurrent date: {day}\n\nReasoning: medium\n\n"
        "# Valid channels: analysis, commentary, final. Channel must be included for every "
        "message.<|end|><|start|>user<|message|>hi<|end|><|start|>assistant"
        for day in dates
    }
    assert tokens(gpt_oss, gpt_oss.render(HI)[-2:]) == ["<|start|>", "assistant"]
    high = Renderer(gpt_oss.tokenizer, chat_template_kwargs={"reasoning_effort": "high"})
    assert "Reasoning: high\n" in high.render_text(HI)


def test_phi3_real_tokenizer_renders_as_transformers_tokenizes(phi3):
    assert phi3.render_text(HI) == "<|user|>\nhi<|end|>\n<|assistant|>\n"
    # Phi-3's added tokens strip the whitespace after them: "\n" is part of no token.
    assert tokens(phi3, phi3.render(HI)) == ["<|user|>", "hi", "<|end|>", "<|assistant|>"]


@pytest.mark.parametrize("name", ["qwen3", "qwen3_off", "qwq", "r1", "kimi", "gpt_oss", "phi3"])
def test_render_equals_transformers_own_tokenization(name, request):
    r: Renderer = request.getfixturevalue(name)
    conversations = [HI, [{"role": "system", "content": "Be brief."}, *HI]]
    for messages in conversations:
        own = r.tokenizer.apply_chat_template(
            messages,
            chat_template=r.template,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            **r.chat_template_kwargs,
        )["input_ids"]
        assert r.render(messages) == list(own)
        if name != "phi3":  # Phi-3's added tokens swallow the "\n" after them
            assert r.decode(r.render(messages)) == r.render_text(messages)


# -- stop tokens ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("qwen3", ["<|im_end|>"]),
        ("qwen3_off", ["<|im_end|>"]),
        ("qwq", ["<|im_end|>"]),
        ("r1", ["<｜end▁of▁sentence｜>"]),
        ("kimi", ["[EOS]", "<|im_end|>"]),
        ("gpt_oss", ["<|return|>", "<|call|>"]),  # not <|end|>: that only ends the analysis
        ("phi3", ["<|endoftext|>", "<|end|>"]),
    ],
)
def test_stop_tokens_come_from_tokenizer_and_template(name, expected, request):
    r: Renderer = request.getfixturevalue(name)
    assert tokens(r, r.stop_token_ids) == expected


def test_kimi_stop_tokens_are_kimis_real_ids(kimi):
    assert [i + KIMI_ID_OFFSET for i in kimi.stop_token_ids] == [163585, 163586]


def test_generation_config_eos_ids_are_stop_tokens(tmp_path):
    shutil.copytree(phi3_tokenizer_dir(), tmp_path / "phi3")
    (tmp_path / "phi3" / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [32000, 2, 32007]})
    )
    r = Renderer.load(tmp_path / "phi3")
    assert r.stop_token_ids == [32000, 2, 32007]
    assert tmp_path / "phi3" / "generation_config.json" in r.files()


# -- --system ------------------------------------------------------------------------------


def test_system_prompt_goes_first_only_when_there_is_none(qwen3):
    r = Renderer(qwen3.tokenizer, system="Be brief.")
    assert r.render_text(HI) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert r.render(HI) == [
        IM_START,
        *qwen3.encode("system\nBe brief."),
        IM_END,
        NL,
        *qwen3.render(HI),
    ]
    own = [{"role": "system", "content": "Answer in French."}, *HI]
    assert r.render(own) == qwen3.render(own)
    assert "Be brief." not in r.render_text(own)


# -- tools ---------------------------------------------------------------------------------


def test_qwen3_renders_tool_schema_call_and_result(qwen3, oracles):
    text = qwen3.render_text(TOOL_CONVERSATION, [WEATHER_TOOL])
    assert text.startswith("<|im_start|>system\n# Tools\n\nYou may call one or more functions")
    assert f"<tools>\n{json.dumps(WEATHER_TOOL)}\n</tools>" in text
    assert text.endswith(
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
        '<|im_start|>user\n<tool_response>\n{"temp": 21}\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\n"
    )
    ids = qwen3.render(TOOL_CONVERSATION, [WEATHER_TOOL])
    assert ids == oracles["qwen3"](text)
    # <tool_call>: twice in the instructions, once in the call; <tool_response> once
    assert ids.count(151657) == 3 and ids.count(151665) == 1
    assert qwen3.render(TOOL_CONVERSATION) != ids  # without tools there is no schema


def test_kimi_and_gpt_oss_render_tools(kimi, gpt_oss):
    text = kimi.render_text(TOOL_CONVERSATION, [WEATHER_TOOL])
    assert text.startswith("<|im_system|>tool_declare<|im_middle|>[{")
    assert (
        "<|tool_calls_section_begin|><|tool_call_begin|>call_1<|tool_call_argument_begin|>"
        '{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>'
    ) in text
    assert '<|im_system|>get_weather<|im_middle|>## Return of call_1\n{"temp": 21}' in text
    text = gpt_oss.render_text(TOOL_CONVERSATION, [WEATHER_TOOL])
    assert "namespace functions {\n\n// Current weather of a city.\ntype get_weather" in text
    assert (
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
        '{"city": "Paris"}<|call|>'
    ) in text
    assert text.endswith(
        "<|start|>functions.get_weather to=assistant<|channel|>commentary"
        '<|message|>"{\\"temp\\": 21}"<|end|><|start|>assistant'
    )


# -- multi-turn ----------------------------------------------------------------------------


def two_turns(first_answer: str | None = None) -> Conversation:
    return Conversation(
        "mt.jsonl",
        3,
        [
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": first_answer},
            {"role": "user", "content": "And 3+3?"},
            {"role": "assistant", "content": None},
        ],
    )


def test_generation_points():
    assert generation_points(two_turns()) == [1, 3]
    assert generation_points(Conversation("a", 1, HI)) == [1]
    tool_loop = Conversation("a", 1, TOOL_CONVERSATION)
    assert generation_points(tool_loop) == [1, 3]
    assert generation_points(Conversation("a", 1, [])) == []


def completion(r: Renderer, text: str) -> list[int]:
    return r.encode(text) + r.stop_token_ids[:1]


def test_qwen3_second_turn_shows_own_answer_without_its_reasoning(qwen3):
    ids = completion(qwen3, "<think>\nTwo and two.\n</think>\n\nFour.")
    answer = qwen3.answer_message(ids)
    history = qwen3.history(two_turns(), 1, [answer])
    assert qwen3.render_text(history) == (
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\nFour.<|im_end|>\n"
        "<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n"
    )
    prompt = qwen3.render(history)
    four = qwen3.encode("Four.")
    assert any(prompt[i : i + len(four)] == four for i in range(len(prompt)))
    assert THINK not in prompt and END_THINK not in prompt
    # Turn 0's prompt is turn 1's prefix: only the answer's reasoning is gone.
    assert prompt[: len(qwen3.render(qwen3.history(two_turns(), 0, None)))] == qwen3.render(
        qwen3.history(two_turns(), 0, None)
    )


def test_qwen3_keeps_reasoning_of_the_current_tool_loop(qwen3):
    """Within one user turn (a tool loop), Qwen3 shows the reasoning of earlier steps."""
    conv = Conversation("t", 1, [*TOOL_CONVERSATION, {"role": "assistant", "content": None}])
    call = qwen3.answer_message(
        completion(
            qwen3,
            '<think>\nNeed weather.\n</think>\n\n<tool_call>\n{"name": "get_weather", '
            '"arguments": {"city": "Paris"}}\n</tool_call>',
        )
    )
    text = qwen3.render_text(qwen3.history(conv, 1, [call]), [WEATHER_TOOL])
    assert "<|im_start|>assistant\n<think>\nNeed weather.\n</think>\n\n<tool_call>" in text


@pytest.mark.parametrize(
    ("name", "generated", "shown"),
    [
        (
            "qwq",
            "Two and two.\n</think>\n\nFour.",
            "<|im_start|>assistant\nFour.<|im_end|>\n<|im_start|>user\nAnd 3+3?",
        ),
        (
            "r1",
            "Two and two.\n</think>\n\nFour.",
            "<｜Assistant｜>\n\nFour.<｜end▁of▁sentence｜><｜User｜>And 3+3?",
        ),
        (
            "kimi",
            "<think>Two and two.</think>Four.",
            "<|im_assistant|>assistant<|im_middle|><think></think>Four.<|im_end|><|im_user|>user",
        ),
        (
            "gpt_oss",
            "<|channel|>analysis<|message|>Two and two.<|end|>"
            "<|start|>assistant<|channel|>final<|message|>Four.",
            "<|start|>assistant<|channel|>final<|message|>Four.<|end|><|start|>user<|message|>And",
        ),
    ],
)
def test_second_turn_shows_own_answer_as_each_template_does(name, generated, shown, request):
    r: Renderer = request.getfixturevalue(name)
    answer = r.answer_message(completion(r, generated))
    text = r.render_text(r.history(two_turns(), 1, [answer]))
    assert shown in text
    assert "Two and two." not in text


def test_history_uses_dataset_answers_unless_own_are_given(qwen3):
    conv = two_turns("Four, of course.")
    assert qwen3.history(conv, 1, None)[1] == {"role": "assistant", "content": "Four, of course."}
    own = {"role": "assistant", "content": "4"}
    assert qwen3.history(conv, 1, [own])[1] == own
    assert qwen3.history(conv, 0, None) == [conv.messages[0]]
    assert conv.messages[1]["content"] == "Four, of course."  # the source is not modified


def test_placeholder_answer_cannot_be_history(qwen3):
    conv = two_turns(None)  # MT-bench: no reference answers
    with pytest.raises(ValueError, match=r"mt.jsonl:3: turn 0 has no reference answer"):
        qwen3.history(conv, 1, None)
    with pytest.raises(ValueError, match="needs 1 own answers"):
        qwen3.history(conv, 1, [])
    with pytest.raises(IndexError):
        qwen3.history(conv, 2, None)


# -- answers -------------------------------------------------------------------------------


def test_answer_message_drops_only_a_final_stop_token(qwen3):
    ids = qwen3.encode("<think>\nx\n</think>\n\nDone.")
    assert qwen3.answer_message([*ids, IM_END])["content"] == "<think>\nx\n</think>\n\nDone."
    assert qwen3.answer_message(ids) == qwen3.answer_message([*ids, IM_END])  # length-cut
    off = qwen3.answer_message(qwen3.encode("Just this."))
    assert off == {"role": "assistant", "content": "Just this."}


def test_kimi_answer_splits_reasoning(kimi):
    ids = completion(kimi, "<think>Let me see.</think>It is 4.")
    assert kimi.answer_message(ids) == {
        "role": "assistant",
        "content": "It is 4.",
        "reasoning_content": "Let me see.",
    }
    cut = kimi.answer_message(kimi.encode("<think>Still thinking"))
    assert cut == {"role": "assistant", "content": "", "reasoning_content": "Still thinking"}


def test_harmony_answer_with_a_tool_call():
    text = (
        "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant to=functions."
        'get_weather<|channel|>commentary <|constrain|>json<|message|>{"city": "Paris"}'
    )
    assert harmony_message(text) == {
        "role": "assistant",
        "content": "",
        "thinking": "Need weather.",
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
    }


def test_think_markers(qwen3, r1, kimi, gpt_oss, phi3):
    for r in (qwen3, r1, kimi):
        assert think_markers(r) == ("<think>", "</think>")
    assert think_markers(gpt_oss) is None and think_markers(phi3) is None


def test_decode_keeps_special_tokens_and_vocab_size(qwen3):
    ids = qwen3.render(HI)
    assert qwen3.decode(ids) == qwen3.render_text(HI)
    assert qwen3.vocab_size == 151669


# -- provenance ----------------------------------------------------------------------------


def test_files_and_identity(qwen3, tmp_path):
    tok_dir = Path(qwen3.tokenizer.name_or_path)
    assert qwen3.files() == [tok_dir / "tokenizer.json", tok_dir / "tokenizer_config.json"]
    ident = qwen3.identity()
    assert ident["tokenizer_files"]["tokenizer_config.json"] == xxhash.xxh3_128_hexdigest(
        (tok_dir / "tokenizer_config.json").read_bytes()
    )
    assert ident["chat_template_file"] is None and ident["system"] is None
    template = tmp_path / "qwq.jinja"
    shutil.copy(QWQ, template)
    other = Renderer(
        qwen3.tokenizer,
        template.read_text(),
        template_file=template,
        chat_template_kwargs={"enable_thinking": False},
        system="S",
    )
    assert other.files()[-1] == template
    changed = other.identity()
    assert changed["chat_template_xxh3"] == xxhash.xxh3_128_hexdigest(QWQ.read_bytes())
    assert changed["chat_template_xxh3"] != ident["chat_template_xxh3"]
    assert changed["tokenizer_files"] == ident["tokenizer_files"]
    assert (changed["chat_template_kwargs"], changed["system"]) == ({"enable_thinking": False}, "S")
    json.dumps(changed)  # goes into a manifest as is


def test_template_in_its_own_file_is_a_tokenizer_file(gpt_oss):
    assert [p.name for p in gpt_oss.files()] == [
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    ]


# -- errors --------------------------------------------------------------------------------


@pytest.fixture
def phi3_no_template(tmp_path: Path) -> Path:
    out = tmp_path / "base-model"
    out.mkdir()
    shutil.copy(phi3_tokenizer_dir() / "tokenizer.json", out)
    config = json.loads((phi3_tokenizer_dir() / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


def test_missing_or_wrong_tokenizer_path(tmp_path):
    with pytest.raises(UserError, match=rf"^--tokenizer {tmp_path / 'nope'}: no such directory"):
        Renderer.load(tmp_path / "nope")
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match=r"^--tokenizer .*file: not a directory"):
        Renderer.load(tmp_path / "file")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"^--tokenizer .*empty: cannot load a tokenizer"):
        Renderer.load(tmp_path / "empty")


def test_tokenizer_without_chat_template(phi3_no_template):
    with pytest.raises(UserError, match=r"it has no chat template; pass --chat-template FILE"):
        Renderer.load(phi3_no_template)
    template = phi3_no_template / "my.jinja"
    template.write_text(
        "{% for m in messages %}<|user|>{{ m.content }}<|end|>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    r = Renderer.load(phi3_no_template, chat_template=template)
    assert r.render_text(HI) == "<|user|>hi<|end|><|assistant|>"
    assert r.files()[-1] == template


def test_chat_template_file_errors(tmp_path):
    with pytest.raises(UserError, match=rf"^--chat-template {tmp_path / 'x.jinja'}: no such file"):
        Renderer.load(phi3_tokenizer_dir(), chat_template=tmp_path / "x.jinja")
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}\n{{ m.content }\n{% endfor %}")
    with pytest.raises(
        UserError,
        match=r"^--chat-template .*bad.jinja: the chat template "
        r"fails: line 2",
    ):
        Renderer.load(phi3_tokenizer_dir(), chat_template=bad)
    binary = tmp_path / "binary.jinja"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(UserError, match=r"^--chat-template .*binary.jinja: cannot read it"):
        Renderer.load(phi3_tokenizer_dir(), chat_template=binary)


def test_chat_template_kwargs_must_be_an_object():
    with pytest.raises(UserError, match=r"^--chat-template-kwargs: not a JSON object"):
        Renderer.load(phi3_tokenizer_dir(), chat_template_kwargs=["enable_thinking"])
    for text in ("[1]", "{oops", '"x"'):
        with pytest.raises(UserError, match=r"^--chat-template-kwargs: not a JSON object"):
            parse_chat_template_kwargs(text)
    assert parse_chat_template_kwargs('{"enable_thinking": false}') == {"enable_thinking": False}


def test_trust_remote_code_is_passed_through(tmp_path):
    custom = tmp_path / "custom"
    custom.mkdir()
    shutil.copy(phi3_tokenizer_dir() / "tokenizer.json", custom)
    config = json.loads((phi3_tokenizer_dir() / "tokenizer_config.json").read_text())
    config.update(
        tokenizer_class="ProbeTokenizer",
        auto_map={"AutoTokenizer": [None, "tokenization_probe.ProbeTokenizer"]},
    )
    (custom / "tokenizer_config.json").write_text(json.dumps(config))
    (custom / "tokenization_probe.py").write_text(
        "from transformers import PreTrainedTokenizerFast\n\n\n"
        "class ProbeTokenizer(PreTrainedTokenizerFast):\n    pass\n"
    )
    with pytest.raises(UserError, match=r"pass --trust-remote-code"):
        Renderer.load(custom)
    r = Renderer.load(custom, trust_remote_code=True)
    assert type(r.tokenizer).__name__ == "ProbeTokenizer"
    assert custom / "tokenization_probe.py" in r.files()


@pytest.mark.parametrize(
    "build",
    [qwen3_tokenizer_dir, deepseek_r1_tokenizer_dir, kimi_tokenizer_dir, gpt_oss_tokenizer_dir],
)
def test_the_torch_free_tokenizer_path_equals_autotokenizer(build, tok_root):
    """Tokenizers loaded as a bare PreTrainedTokenizerFast (no torch import) encode, decode
    and render exactly as AutoTokenizer's class does."""
    from transformers import AutoTokenizer

    from eagle3kit.chat.tokenizer import load_tokenizer

    path = build(tok_root)
    fast, auto = load_tokenizer(path, False), AutoTokenizer.from_pretrained(path)
    texts = [
        "hi",
        " Héllo wörld\n\n  x",
        "<think>\nhmm\n</think>\n\nok<|im_end|>",
        "def f(x):\n\treturn x**2  # 中文 🙂",
        "<|im_start|>user<|im_start|>",
    ]
    for text in texts:
        ids = auto.encode(text, add_special_tokens=False)
        assert fast.encode(text, add_special_tokens=False) == ids
        assert fast.decode(ids, skip_special_tokens=False) == auto.decode(
            ids, skip_special_tokens=False
        )
    conversation = [*HI, {"role": "assistant", "content": "yes"}, *HI]
    assert fast.apply_chat_template(
        conversation, tokenize=False, add_generation_prompt=True
    ) == auto.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    assert set(fast.all_special_ids) == set(auto.all_special_ids)
    assert fast.added_tokens_decoder.keys() == auto.added_tokens_decoder.keys()


def test_loading_a_plain_fast_tokenizer_does_not_import_torch(tok_root):
    import subprocess
    import sys

    from eagle3kit.chat.tokenizer import _plain_fast_tokenizer

    path = qwen3_tokenizer_dir(tok_root)
    assert _plain_fast_tokenizer(path)
    code = (
        "import sys; from pathlib import Path; from eagle3kit.chat.render import Renderer; "
        f"Renderer.load(Path({str(path)!r})); print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False"

"""Prompt sources: real prompt sets and conversation files, each shape, partitions, selection,
dedupe, malformed lines, parquet and HF datasets."""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
import pytest

from eagle3kit.chat.conversation import Conversation
from eagle3kit.errors import UserError
from eagle3kit.gen.prompts import (
    conversation_key,
    dedupe,
    load_conversations,
    load_hf_dataset,
    select,
)

DATA = Path(__file__).parent / "data" / "prompts"
EAGLE = DATA / "eagle"
CONVS = DATA / "conversations"


def write_jsonl(path: Path, *records: object) -> Path:
    path.write_bytes(
        b"".join((r if isinstance(r, bytes) else orjson.dumps(r)) + b"\n" for r in records)
    )
    return path


def load_one(path: Path, **kwargs) -> list[Conversation]:
    return load_conversations([path], **kwargs)[0]


def roles(conv: Conversation) -> list[str]:
    return [m["role"] for m in conv.messages]


# Real files --------------------------------------------------------------------------------
REAL = [  # (file under tests/data/prompts, records, roles of the first conversation)
    ("eagle/mt_bench/question.jsonl", 80, ["user", "assistant", "user"]),
    ("eagle/qa/question.jsonl", 80, ["user"]),
    ("eagle/alpaca/question.jsonl", 10, ["user"]),
    ("eagle/gsm8k/question.jsonl", 10, ["user"]),
    ("eagle/humaneval/question.jsonl", 10, ["user"]),
    ("eagle/sum/question.jsonl", 5, ["user"]),
    ("fastchat/vicuna_bench/question.jsonl", 80, ["user"]),
    ("conversations/fastchat/dummy_conversation.head12.json", 12, ["user", "assistant"] * 2),
    (
        "conversations/specforge/tool_use_conversation.jsonl",
        1,
        ["system", "user", *["assistant", "tool"] * 5, "assistant"],
    ),
    ("conversations/speculators/dolphin_reasoning.jsonl", 1, ["user", "assistant"]),
    ("conversations/speculators/gsm8k_singleturn.jsonl", 1, ["user"]),
    (
        "conversations/speculators/hermes_toolcall.jsonl",
        1,
        ["system", "user", "assistant", "tool", "assistant"],
    ),
    ("conversations/speculators/sharegpt_multiturn.jsonl", 1, ["user", "assistant"] * 3),
    ("conversations/speculators/ultrachat_messages.jsonl", 1, ["user", "assistant"] * 4),
]


@pytest.mark.parametrize(("name", "count", "first_roles"), REAL, ids=[r[0] for r in REAL])
def test_real_file_loads(name, count, first_roles):
    path = DATA / name
    convs, stats = load_conversations([path])
    assert (len(convs), stats.records, stats.bad_lines, stats.duplicates) == (count, count, 0, 0)
    assert roles(convs[0]) == first_roles
    assert {c.source for c in convs} == {path.name}
    assert [c.line for c in convs][:2] == [1, 2][:count]
    assert stats.per_partition == {path.stem: count}


FULL_FILES = [  # the full files this project copied its fixtures from (tests/data copies)
    ("eagle_full/alpaca/question.jsonl", 80),
    ("eagle_full/gsm8k/question.jsonl", 80),
    ("eagle_full/humaneval/question.jsonl", 80),
    ("eagle_full/sum/question.jsonl", 80),
    ("conversations/fastchat/dummy_conversation.json", 500),
]


@pytest.mark.parametrize(("name", "count"), FULL_FILES, ids=[r[0] for r in FULL_FILES])
def test_full_source_file_loads(name, count):
    convs, stats = load_conversations([DATA / name])
    assert (len(convs), stats.bad_lines) == (count, 0)


def test_head12_fixture_is_the_start_of_the_full_file():
    fastchat = CONVS / "fastchat"
    head = load_one(fastchat / "dummy_conversation.head12.json")
    full = load_one(fastchat / "dummy_conversation.json")
    assert [c.messages for c in head] == [c.messages for c in full[:12]]


def test_mt_bench_turns_become_user_placeholder_user():
    conv = load_one(EAGLE / "mt_bench" / "question.jsonl")[0]
    assert conv.messages[0] == {"role": "user", "content": conv.messages[0]["content"]}
    assert conv.messages[0]["content"].startswith("Compose an engaging travel blog post")
    assert conv.messages[1] == {"role": "assistant", "content": None}
    assert conv.messages[2]["content"].startswith("Rewrite your previous response.")
    assert conv.extra == {"question_id": 81, "category": "writing"}
    assert conv.tools is None


def test_eagle_extra_drops_empty_category():
    conv = load_one(EAGLE / "alpaca" / "question.jsonl")[0]
    assert conv.extra == {"question_id": 0}


def test_tool_use_conversation_keeps_calls_reasoning_and_tools():
    conv = load_one(CONVS / "specforge" / "tool_use_conversation.jsonl")[0]
    call = conv.messages[2]
    assert call["tool_calls"][0]["id"] == "call_111"
    assert call["tool_calls"][0]["function"]["name"] == "read_file"
    assert call["reasoning_content"] == ""
    assert conv.messages[3] == {"role": "tool", "content": "tool content1."}
    assert [t["function"]["name"] for t in conv.tools] == ["search_code"]
    assert conv.extra == {"id": 9}


def test_hermes_tools_json_string_is_parsed():
    conv = load_one(CONVS / "speculators" / "hermes_toolcall.jsonl")[0]
    assert isinstance(conv.tools, list) and len(conv.tools) == 2
    assert conv.tools[0]["function"]["name"] == "set_smart_light_color"
    assert conv.messages[3]["content"].startswith("<tool_response>")


def test_sharegpt_keeps_reasoning_and_drops_unknown_keys():
    dolphin = load_one(CONVS / "speculators" / "dolphin_reasoning.jsonl")[0]
    assert dolphin.messages[1]["reasoning_content"].startswith("Okay, I need to summarize")
    sharegpt = load_one(CONVS / "speculators" / "sharegpt_multiturn.jsonl")[0]
    assert all(set(m) == {"role", "content"} for m in sharegpt.messages)  # markdown/text gone
    assert sharegpt.extra == {"id": "DhelrJT_0"}


def test_messages_win_over_prompt_unless_format_forced():
    path = CONVS / "speculators" / "ultrachat_messages.jsonl"
    assert len(load_one(path)[0].messages) == 8
    forced = load_one(path, fmt="prompt")[0]
    assert roles(forced) == ["user"]
    assert forced.messages[0]["content"].startswith("These instructions apply")
    assert forced.extra == {"prompt_id": forced.extra["prompt_id"]}


def test_question_answer_row_is_a_prompt():
    conv = load_one(CONVS / "speculators" / "gsm8k_singleturn.jsonl")[0]
    assert conv.messages == [{"role": "user", "content": conv.messages[0]["content"]}]
    assert conv.messages[0]["content"].startswith("Natalia sold clips")


# Handcrafted shapes ------------------------------------------------------------------------
def test_openai_messages_shape(tmp_path):
    tools = [{"type": "function", "function": {"name": "add", "parameters": {}}}]
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}
    path = write_jsonl(
        tmp_path / "chat.jsonl",
        {
            "id": 7,
            "tools": tools,
            "messages": [
                {"role": "system", "content": "be brief"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "1+"}, {"type": "text", "text": "1"}],
                },
                {
                    "role": "assistant",
                    "content": None,
                    "reasoning": "use the tool",
                    "tool_calls": [call],
                },
                {"role": "tool", "content": "2", "tool_call_id": "c1", "name": "add"},
                {"role": "assistant", "content": "2", "reasoning_content": "done", "weight": 1},
            ],
        },
    )
    conv = load_one(path)[0]
    assert conv.tools == tools
    assert conv.messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "1+1"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "use the tool",
            "tool_calls": [call],
        },
        {"role": "tool", "content": "2", "tool_call_id": "c1", "name": "add"},
        {"role": "assistant", "content": "2", "reasoning_content": "done"},
    ]
    assert (conv.source, conv.line, conv.partition, conv.extra) == (
        "chat.jsonl",
        1,
        "chat",
        {"id": 7},
    )


def test_sharegpt_shape_maps_tool_roles(tmp_path):
    path = write_jsonl(
        tmp_path / "sg.jsonl",
        {
            "system": "top-level system",
            "tools": '[{"name": "weather"}]',
            "conversations": [
                {"from": "human", "value": "weather?"},
                {"from": "function_call", "value": '{"name": "weather", "arguments": {}}'},
                {"from": "observation", "value": "sunny"},
                {"from": "gpt", "value": "It is sunny."},
                {"from": "user", "value": "thanks"},
                {"from": "chatgpt", "value": "welcome"},
                {"from": "human", "value": "and now?"},
                {"from": "function_call", "value": "call"},
                {"from": "function_response", "value": "rain"},
                {"from": "tool", "value": "more rain"},
            ],
        },
    )
    conv = load_one(path)[0]
    assert roles(conv) == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
        "tool",
        "tool",
    ]
    assert conv.messages[0]["content"] == "top-level system"
    assert conv.messages[2]["content"] == '{"name": "weather", "arguments": {}}'
    assert conv.tools == [{"name": "weather"}]


def test_role_content_conversations_shape(tmp_path):
    path = write_jsonl(
        tmp_path / "rc.jsonl",
        {"conversations": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]},
    )
    assert roles(load_one(path)[0]) == ["system", "user"]
    assert roles(load_one(path, fmt="conversations")[0]) == ["system", "user"]


def test_prompt_shapes(tmp_path):
    path = write_jsonl(
        tmp_path / "p.jsonl",
        {"prompt": "Say hi.", "system": "You are terse."},
        {"question": "2+2?", "answer": "4"},
        {"instruction": "Translate.", "input": "bonjour"},
        {"instruction": "Count to 3.", "input": ""},
    )
    convs = load_one(path)
    assert convs[0].messages == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Say hi."},
    ]
    assert convs[1].messages == [{"role": "user", "content": "2+2?"}]
    assert convs[2].messages[0]["content"] == "Translate.\n\nbonjour"
    assert convs[3].messages[0]["content"] == "Count to 3."


def test_mtbench_shape_with_three_turns(tmp_path):
    path = write_jsonl(
        tmp_path / "q.jsonl",
        {"question_id": "a1", "category": "x", "turns": ["one", "two", "three"]},
    )
    conv = load_one(path)[0]
    assert conv.messages == [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": None},
        {"role": "user", "content": "two"},
        {"role": "assistant", "content": None},
        {"role": "user", "content": "three"},
    ]


@pytest.mark.parametrize("layout", ["list", "object", "record", "jsonl"])
def test_json_file_layouts(tmp_path, layout):
    records = [{"prompt": "a"}, {"prompt": "b"}]
    body = {
        "list": orjson.dumps(records),
        "object": orjson.dumps({"version": 1, "data": records}),
        "record": orjson.dumps({"messages": [{"role": "user", "content": "a"}]}),
        "jsonl": b"\n".join(orjson.dumps(r) for r in records),
    }[layout]
    path = tmp_path / "set.json"
    path.write_bytes(body)
    convs = load_one(path)
    assert [c.messages[0]["content"] for c in convs] == ["a", "b"][: len(convs)]
    assert len(convs) == (1 if layout == "record" else 2)
    assert [c.line for c in convs] == list(range(1, len(convs) + 1))


def test_json_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'[{"prompt": "a"},')
    with pytest.raises(UserError, match=r"bad\.json: invalid JSON"):
        load_one(bad)
    two = tmp_path / "two.json"
    two.write_bytes(orjson.dumps({"a": [], "b": []}))
    with pytest.raises(UserError, match=r"two\.json: .*several lists \(a, b\)"):
        load_one(two)


def test_path_errors(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        load_one(tmp_path / "missing.jsonl")
    with pytest.raises(UserError, match="a directory"):
        load_one(tmp_path)
    (tmp_path / "p.csv").write_text("prompt\nhi\n")
    with pytest.raises(UserError, match="unknown prompt file type"):
        load_one(tmp_path / "p.csv")
    with pytest.raises(UserError, match="--format alpaca"):
        load_one(EAGLE / "qa" / "question.jsonl", fmt="alpaca")


# Partitions ------------------------------------------------------------------------------------
def test_partition_by_file_name_uses_folder_when_names_collide():
    files = [EAGLE / s / "question.jsonl" for s in ("mt_bench", "gsm8k")]
    files.append(CONVS / "speculators" / "hermes_toolcall.jsonl")
    convs, stats = load_conversations(files)
    assert stats.per_partition == {"mt_bench": 80, "gsm8k": 10, "hermes_toolcall": 1}
    assert stats.files == 3
    assert {c.source for c in convs} == {"question.jsonl", "hermes_toolcall.jsonl"}


def test_partition_by_field():
    convs, stats = load_conversations(
        [EAGLE / "mt_bench" / "question.jsonl"], partition_field="category"
    )
    assert len(stats.per_partition) == 8
    assert set(stats.per_partition.values()) == {10}
    assert convs[0].partition == "writing"


def test_partition_field_missing_everywhere_names_the_flag():
    with pytest.raises(UserError, match=r"--partition-field topic: no record has"):
        load_conversations([EAGLE / "qa" / "question.jsonl"], partition_field="topic")


def test_partition_field_missing_in_some_records_names_the_line(tmp_path):
    path = write_jsonl(
        tmp_path / "p.jsonl", {"prompt": "a"}, {"prompt": "b", "topic": "t"}, {"prompt": "c"}
    )
    with pytest.raises(UserError, match=r"p\.jsonl:1: no 'topic' value \(--partition-field\)"):
        load_one(path, partition_field="topic")
    convs, stats = load_conversations([path], partition_field="topic", skip_bad_lines=True)
    assert [c.messages[0]["content"] for c in convs] == ["b"]
    assert stats.bad_lines == 2
    with pytest.raises(UserError, match=r"p\.jsonl:1: 'topic' must be a string or number"):
        load_one(write_jsonl(path, {"prompt": "a", "topic": [1]}), partition_field="topic")


def test_partition_field_empty_everywhere_is_the_flags_fault():
    # alpaca's category is "" on every row: there is nothing to partition by
    with pytest.raises(UserError, match=r"--partition-field category"):
        load_conversations([EAGLE / "alpaca" / "question.jsonl"], partition_field="category")


# Select ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_sets() -> list[Conversation]:
    return load_conversations(
        [EAGLE / "mt_bench" / "question.jsonl", EAGLE / "qa" / "question.jsonl"]
    )[0]


def test_select_partition_and_all(two_sets):
    assert len(select(two_sets, partition="qa")) == 80
    assert select(two_sets) == select(two_sets, partition="all") == two_sets
    assert select(two_sets, max_samples=3) == two_sets[:3]  # file order without a seed
    assert select(two_sets, max_samples=0) == []


def test_select_unknown_partition_lists_known(two_sets):
    with pytest.raises(UserError, match=r"--partition nope: .*known: mt_bench, qa, or all"):
        select(two_sets, partition="nope")


def test_select_shuffle_is_deterministic(two_sets):
    first = select(two_sets, shuffle_seed=1, max_samples=20)
    assert first == select(two_sets, shuffle_seed=1, max_samples=20)
    assert first != select(two_sets, shuffle_seed=2, max_samples=20)
    assert first != two_sets[:20]
    assert {c.partition for c in first} == {"mt_bench", "qa"}  # shuffled before the cut
    assert select(two_sets, shuffle_seed=1)[:20] == first
    assert two_sets[0].extra["question_id"] == 81  # the input is left as it was


def test_select_rejects_negative_max_samples(two_sets):
    with pytest.raises(UserError, match="--max-samples"):
        select(two_sets, max_samples=-1)


# Dedupe ---------------------------------------------------------------------------------------
def conv(messages: list[dict], tools: list | None = None, line: int = 1) -> Conversation:
    return Conversation(source="s", line=line, messages=messages, tools=tools)


def test_dedupe_keeps_first_of_normalized_equal_prompts():
    decomposed = "Cafe\u0301 ?"  # NFD é, which NFC folds into one code point
    a = conv([{"role": "user", "content": "Café ?"}], line=1)
    b = conv([{"role": "user", "content": f"  {decomposed}\n"}], line=2)
    c = conv([{"role": "user", "content": "Café ?"}], tools=[{"name": "t"}], line=3)
    d = conv(
        [{"role": "user", "content": "Café ?"}, {"role": "assistant", "content": None}], line=4
    )
    kept, dropped = dedupe([a, b, c, d])
    assert [x.line for x in kept] == [1, 3, 4] and dropped == 1
    assert conversation_key(a) == conversation_key(b) != conversation_key(c)
    assert len(conversation_key(a)) == 16


def test_load_counts_duplicates_across_files(tmp_path):
    one = write_jsonl(tmp_path / "one.jsonl", {"prompt": "same"}, {"prompt": "other"})
    two = write_jsonl(tmp_path / "two.jsonl", {"messages": [{"role": "user", "content": "same "}]})
    convs, stats = load_conversations([one, two])
    assert (stats.records, stats.duplicates, len(convs)) == (3, 1, 2)
    assert stats.per_partition == {"one": 2}


# Malformed lines ------------------------------------------------------------------------------
MALFORMED = [  # (line 3 of a JSONL file whose line 1 is a good messages record, the error)
    (b'{"messages": [', "invalid JSON (unexpected end of data at column"),
    (b"[1, 2]", "expected a JSON object, got list"),
    (b'{"text": "hello"}', "no 'messages' field (this file's shape is messages, detected at"),
    ({"messages": "hi"}, "'messages' must be a list of messages, got str"),
    ({"messages": ["hi"]}, "message 1: expected an object, got str"),
    ({"messages": [{"content": "hi"}]}, "message 1: no 'role' string"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "message 1: unknown role 'robot'"),
    ({"messages": [{"role": "user", "content": 5}]}, "message 1: 'content' must be a string"),
    ({"messages": [{"role": "user"}]}, "message 1: 'content' must be a string"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "must be a string"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": 3}, "'tools' must be a list"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": "[oops"}, "'tools' is a string"),
    ({"messages": [{"role": "user", "content": "x"}], "system": 1}, "'system' must be a string"),
    (
        {
            "messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": "y", "tool_calls": "call"},
            ]
        },
        "message 2: 'tool_calls' must be a list of objects",
    ),
    (
        {
            "messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": "y", "reasoning_content": 1},
            ]
        },
        "message 2: reasoning must be a string",
    ),
    ({"messages": []}, "empty conversation"),
    ({"messages": [{"role": "system", "content": "s"}]}, "no user message"),
    (
        {"messages": [{"role": "assistant", "content": "a"}, {"role": "user", "content": "u"}]},
        "message 1: the conversation must start with a user message, not assistant",
    ),
    (
        {"messages": [{"role": "user", "content": "u"}, {"role": "tool", "content": "t"}]},
        "message 2: a tool result must follow an assistant message",
    ),
    (
        {
            "messages": [
                {"role": "user", "content": "u"},
                {"role": "assistant", "content": "a"},
                {"role": "assistant", "content": "b"},
            ]
        },
        "message 3: two assistant messages in a row",
    ),
]


@pytest.mark.parametrize(("bad", "why"), MALFORMED, ids=[m[1][:40] for m in MALFORMED])
def test_malformed_line_names_file_and_line(tmp_path, bad, why):
    good = {"messages": [{"role": "user", "content": "fine"}]}
    path = write_jsonl(tmp_path / "in.jsonl", good, b"", bad, good)
    with pytest.raises(UserError) as err:
        load_one(path)
    assert str(err.value).startswith(f"{path}:3: ")
    assert why in str(err.value)
    convs, stats = load_conversations([path], skip_bad_lines=True)
    assert (len(convs), stats.bad_lines, stats.duplicates) == (1, 1, 1)


MALFORMED_OTHER_SHAPES = [  # (a first good record fixing the shape, a bad one, the error)
    ({"turns": ["q"]}, {"turns": "q"}, "'turns' must be a list of strings"),
    ({"turns": ["q"]}, {"turns": []}, "empty conversation"),
    ({"turns": ["q"]}, {"turns": ["q", 2]}, "turn 2 must be a string, got int"),
    ({"turns": ["q"]}, {"turns": ["q", " "]}, "empty conversation (turn 2 is blank)"),
    ({"prompt": "p"}, {"prompt": ""}, "empty conversation (prompt is blank)"),
    ({"prompt": "p"}, {"prompt": ["p"]}, "prompt must be a string, got list"),
    (
        {"conversations": [{"from": "human", "value": "h"}]},
        {"conversations": [{"from": "alien", "value": "h"}]},
        "message 1: unknown from 'alien'",
    ),
    (
        {"conversations": [{"from": "human", "value": "h"}]},
        {"conversations": [{"role": "user", "content": "h"}]},
        "message 1: no 'from' string",
    ),
]


@pytest.mark.parametrize(
    ("good", "bad", "why"), MALFORMED_OTHER_SHAPES, ids=[m[2][:40] for m in MALFORMED_OTHER_SHAPES]
)
def test_malformed_line_in_other_shapes(tmp_path, good, bad, why):
    path = write_jsonl(tmp_path / "in.jsonl", good, bad)
    with pytest.raises(UserError) as err:
        load_one(path)
    assert str(err.value).startswith(f"{path}:2: ") and why in str(err.value)


def test_forced_format_mismatch_names_the_flag(tmp_path):
    path = write_jsonl(tmp_path / "q.jsonl", {"prompt": "hi"})
    with pytest.raises(UserError, match=r"q\.jsonl:1: no 'turns' field .*--format"):
        load_one(path, fmt="mtbench")


def test_shape_is_detected_from_first_valid_record(tmp_path):
    path = write_jsonl(
        tmp_path / "q.jsonl", b"not json", {"junk": 1}, {"turns": ["a"]}, {"turns": ["b"]}
    )
    convs, stats = load_conversations([path], skip_bad_lines=True)
    assert [c.line for c in convs] == [3, 4] and stats.bad_lines == 2


def test_skip_bad_lines_counts_across_files(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", {"prompt": "1"}, b"{", {"prompt": ""})
    b = write_jsonl(tmp_path / "b.jsonl", {"prompt": "2"}, {"prompt": 3})
    convs, stats = load_conversations([a, b], skip_bad_lines=True)
    assert len(convs) == 2
    assert (stats.files, stats.records, stats.bad_lines) == (2, 2, 3)


# Parquet and HF datasets ----------------------------------------------------------------------
PARQUET_ROWS = [
    {
        "id": 1,
        "topic": "chat",
        "messages": [
            {"role": "user", "content": "hi", "tool_calls": None},
            {"role": "assistant", "content": "yo", "tool_calls": None},
        ],
    },
    {
        "id": 2,
        "topic": "tools",
        "messages": [
            {"role": "user", "content": "add", "tool_calls": None},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "add", "arguments": "{}"}}
                ],
            },
        ],
    },
]


def write_parquet(path: Path, rows: list[dict]) -> Path:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_parquet_rows(tmp_path):
    path = write_parquet(tmp_path / "set.parquet", PARQUET_ROWS)
    convs, stats = load_conversations([path], partition_field="topic")
    assert stats.per_partition == {"chat": 1, "tools": 1}
    assert convs[0].messages == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
    ]
    assert convs[1].messages[1]["tool_calls"][0]["function"]["name"] == "add"
    assert [(c.source, c.line, c.extra) for c in convs] == [
        ("set.parquet", 1, {"id": 1}),
        ("set.parquet", 2, {"id": 2}),
    ]


def test_parquet_bad_row_names_the_row(tmp_path):
    rows = [{"prompt": "ok"}, {"prompt": " "}]
    with pytest.raises(UserError, match=r"set\.parquet:2: empty conversation"):
        load_one(write_parquet(tmp_path / "set.parquet", rows))


def test_parquet_unreadable_file(tmp_path):
    pytest.importorskip("pyarrow")
    path = tmp_path / "set.parquet"
    path.write_bytes(b"not parquet")
    with pytest.raises(UserError, match=r"set\.parquet: not a readable parquet file"):
        load_one(path)


def test_parquet_without_pyarrow_names_the_extra(tmp_path, monkeypatch):
    path = tmp_path / "set.parquet"
    path.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # as if the extra were absent
    with pytest.raises(UserError, match=r"pip install 'eagle3kit\[hf\]'"):
        load_one(path)


def test_hf_dataset_without_datasets_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if the extra were absent
    with pytest.raises(UserError, match=r"--dataset org/set: .*pip install 'eagle3kit\[hf\]'"):
        load_hf_dataset("org/set")


def test_hf_dataset_from_disk_and_from_parquet(tmp_path):
    datasets = pytest.importorskip("datasets")
    saved = tmp_path / "saved"
    datasets.DatasetDict({"test": datasets.Dataset.from_list(PARQUET_ROWS)}).save_to_disk(saved)
    convs = load_hf_dataset(str(saved), split="test", partition_field="topic")
    assert [(c.source, c.line, c.partition) for c in convs] == [
        ("saved", 1, "chat"),
        ("saved", 2, "tools"),
    ]
    assert convs[1].messages[1]["tool_calls"][0]["id"] == "c"
    path = write_parquet(tmp_path / "rows.parquet", [{"question": "q1"}, {"question": "q2"}])
    convs = load_hf_dataset(str(path))
    assert len(convs) == 2
    assert (convs[0].source, convs[0].partition, convs[0].messages) == (
        "rows.parquet",
        "rows",
        [{"role": "user", "content": "q1"}],
    )
    with pytest.raises(UserError, match=r"--dataset .*saved \(split nope\)"):
        load_hf_dataset(str(saved), split="nope")

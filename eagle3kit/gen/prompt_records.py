"""One prompt record as a `Conversation`: the shapes gen reads (messages, sharegpt,
conversations, prompt, mtbench; prompts.py's docstring describes each and the representation),
their detection, and `Intake`, which turns a file's records into conversations, counting or
refusing the bad ones. prompts.py reads the files and hands their records here."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import pairwise
from typing import Any

import orjson

from eagle3kit.chat.conversation import Conversation
from eagle3kit.errors import UserError

PROMPT_KEYS = ("prompt", "question", "instruction")
SHAPE_KEYS = {
    "messages": ("messages",),
    "sharegpt": ("conversations",),
    "conversations": ("conversations",),
    "prompt": PROMPT_KEYS,
    "mtbench": ("turns",),
}
"""The key(s) a record of each shape must have."""
EXTRA_FIELDS = ("id", "question_id", "prompt_id", "category")
"""Scalar fields kept in Conversation.extra, so samples can be traced to benchmark questions."""
ROLES = {
    "system": "system",
    "developer": "developer",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "model": "assistant",
    "function_call": "assistant",
    "tool": "tool",
    "observation": "tool",
    "function_response": "tool",
}
"""Role (or ShareGPT `from`) names, lower-cased, to the OpenAI role they mean."""
SYSTEM_ROLES = ("system", "developer")
_SCALARS = (str, int, float, bool)


class BadRecord(ValueError):
    """What is wrong with one record; the caller adds the file and line."""


def detect_format(record: dict[str, Any]) -> str | None:
    """The shape of one record, or None when it has none of the known keys."""
    if "messages" in record:
        return "messages"
    if "conversations" in record:
        turns = record["conversations"]
        is_sharegpt = (
            isinstance(turns, list) and turns and isinstance(turns[0], dict) and "from" in turns[0]
        )
        return "sharegpt" if is_sharegpt else "conversations"
    if "turns" in record:
        return "mtbench"
    if any(key in record for key in PROMPT_KEYS):
        return "prompt"
    return None


def to_conversation(
    record: object, fmt: str, *, source: str, line: int, partition: str = "default"
) -> Conversation:
    """One record of the given shape as a Conversation; BadRecord says what is wrong."""
    if not isinstance(record, dict):
        raise BadRecord(f"expected a JSON object, got {type(record).__name__}")
    messages = _PARSERS[fmt](record)
    messages = _with_system(messages, record.get("system"))
    _check_order(messages)
    return Conversation(
        source=source,
        line=line,
        messages=messages,
        partition=partition,
        tools=_tools(record.get("tools")),
        extra=_extra(record),
    )


class Intake:
    """Collects conversations and bad lines, and resolves missing partition values.

    A record without the partition field is an error at its line, unless no record has the
    field at all: then the flag is what is wrong, and the error names it.
    """

    def __init__(self, partition_field: str | None, skip_bad_lines: bool):
        self.partition_field = partition_field
        self.skip_bad_lines = skip_bad_lines
        self.convs: list[Conversation] = []
        self.bad_lines = 0
        self._field_seen = False
        self._lacking: list[str] = []  # where records lacked the field, before any had it

    def bad(self, where: str, why: str) -> None:
        if not self.skip_bad_lines:
            raise UserError(f"{where}: {why}")
        self.bad_lines += 1

    def add(self, conv: Conversation, where: str, value: str | None) -> None:
        """Keep conv, in the partition `value` names when a partition field is in use."""
        if self.partition_field is None:
            self.convs.append(conv)
            return
        if value is None:
            if self._field_seen:
                self.bad(where, self._lacks())
            else:
                self._lacking.append(where)
            return
        conv.partition = value
        self.convs.append(conv)
        if not self._field_seen:
            self._field_seen = True
            for earlier in self._lacking:
                self.bad(earlier, self._lacks())
            self._lacking.clear()

    def finish(self) -> None:
        if self._lacking:
            raise UserError(
                f"--partition-field {self.partition_field}: no record has a "
                f"'{self.partition_field}' value"
            )

    def _lacks(self) -> str:
        return f"no '{self.partition_field}' value (--partition-field)"


def convert_records(
    records: Iterable[tuple[int, object]],
    intake: Intake,
    *,
    fmt: str,
    label: str,
    source: str,
    default_partition: str,
) -> None:
    """Every record of one file (or dataset) through the shape parsers into the intake."""
    shape, fixed_by = (None, "") if fmt == "auto" else (fmt, "--format")
    for line, record in records:
        where = f"{label}:{line}"
        if isinstance(record, BadRecord):
            intake.bad(where, str(record))
            continue
        try:
            record_shape = shape or _detect(record)
            _check_shape_key(record, record_shape, fixed_by)
            conv = to_conversation(
                record, record_shape, source=source, line=line, partition=default_partition
            )
            value = _partition_value(record, intake.partition_field)
        except BadRecord as exc:
            intake.bad(where, str(exc))
            continue
        if shape is None:
            shape, fixed_by = record_shape, f"detected at line {line}"
        intake.add(conv, where, value)


def _detect(record: object) -> str:
    if not isinstance(record, dict):
        raise BadRecord(f"expected a JSON object, got {type(record).__name__}")
    shape = detect_format(record)
    if shape is None:
        raise BadRecord(
            "no recognizable shape (expected a 'messages', 'conversations', "
            "'turns' or 'prompt' field)"
        )
    return shape


def _check_shape_key(record: object, shape: str, fixed_by: str) -> None:
    if fixed_by and isinstance(record, dict) and not any(k in record for k in SHAPE_KEYS[shape]):
        keys = " or ".join(f"'{k}'" for k in SHAPE_KEYS[shape])
        raise BadRecord(f"no {keys} field (this file's shape is {shape}, {fixed_by})")


def _partition_value(record: object, partition_field: str | None) -> str | None:
    if partition_field is None or not isinstance(record, dict):
        return None
    value = record.get(partition_field)
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, _SCALARS):
        raise BadRecord(f"'{partition_field}' must be a string or number to name a partition")
    return str(value).strip()


def _messages_shape(record: dict[str, Any]) -> list[dict[str, Any]]:
    return _message_list(record.get("messages"), "messages", "role", "content")


def _sharegpt_shape(record: dict[str, Any]) -> list[dict[str, Any]]:
    return _message_list(record.get("conversations"), "conversations", "from", "value")


def _conversations_shape(record: dict[str, Any]) -> list[dict[str, Any]]:
    return _message_list(record.get("conversations"), "conversations", "role", "content")


def _prompt_shape(record: dict[str, Any]) -> list[dict[str, Any]]:
    key = next((k for k in PROMPT_KEYS if record.get(k) is not None), PROMPT_KEYS[0])
    text = _nonblank_text(record.get(key), key)
    extra_input = record.get("input") if key == "instruction" else None
    if isinstance(extra_input, str) and extra_input.strip():
        text = f"{text}\n\n{extra_input}"  # alpaca's own prompt joins them the same way
    return [{"role": "user", "content": text}]


def _mtbench_shape(record: dict[str, Any]) -> list[dict[str, Any]]:
    turns = record.get("turns")
    if not isinstance(turns, list):
        raise BadRecord("'turns' must be a list of strings")
    if not turns:
        raise BadRecord("empty conversation ('turns' is empty)")
    messages: list[dict[str, Any]] = []
    for number, turn in enumerate(turns, 1):
        if messages:  # the placeholder marks the previous turn as one to generate
            messages.append({"role": "assistant", "content": None})
        messages.append({"role": "user", "content": _nonblank_text(turn, f"turn {number}")})
    return messages


_PARSERS = {
    "messages": _messages_shape,
    "sharegpt": _sharegpt_shape,
    "conversations": _conversations_shape,
    "prompt": _prompt_shape,
    "mtbench": _mtbench_shape,
}


def _nonblank_text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise BadRecord(f"{what} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise BadRecord(f"empty conversation ({what} is blank)")
    return value


def _message_list(value: object, key: str, role_key: str, content_key: str) -> list[dict]:
    if not isinstance(value, list):
        raise BadRecord(f"'{key}' must be a list of messages, got {type(value).__name__}")
    if not value:
        raise BadRecord(f"empty conversation ('{key}' is empty)")
    return [_message(raw, number, role_key, content_key) for number, raw in enumerate(value, 1)]


def _message(raw: object, number: int, role_key: str, content_key: str) -> dict[str, Any]:
    """One message in OpenAI form, keeping only the keys chat templates read."""
    if not isinstance(raw, dict):
        raise BadRecord(f"message {number}: expected an object, got {type(raw).__name__}")
    name = raw.get(role_key)
    if not isinstance(name, str):
        raise BadRecord(f"message {number}: no '{role_key}' string")
    role = ROLES.get(name.strip().lower())
    if role is None:
        raise BadRecord(f"message {number}: unknown {role_key} {name!r}")
    message = {"role": role, "content": _content(raw.get(content_key), role, number, content_key)}
    if role == "assistant":
        message.update(_assistant_fields(raw, number))
    for key in ("tool_call_id", "name") if role == "tool" else ("name",):
        if isinstance(raw.get(key), str):
            message[key] = raw[key]
    return message


def _content(value: object, role: str, number: int, key: str) -> str | None:
    if isinstance(value, str):
        return value
    if value is None and role == "assistant":  # tool-call-only turns and placeholders
        return None
    if isinstance(value, list) and all(_is_text_part(p) for p in value):
        return "".join(part["text"] for part in value)
    raise BadRecord(
        f"message {number}: '{key}' must be a string (or a list of text parts), "
        f"got {type(value).__name__}"
    )


def _is_text_part(part: object) -> bool:
    return (
        isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
    )


def _assistant_fields(raw: dict[str, Any], number: int) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    # Servers name the reasoning `reasoning_content` or `reasoning`; gen reads one name only.
    reasoning = raw.get("reasoning_content")
    if reasoning is None:
        reasoning = raw.get("reasoning")
    if reasoning is not None:
        if not isinstance(reasoning, str):
            raise BadRecord(f"message {number}: reasoning must be a string")
        fields["reasoning_content"] = reasoning
    calls = raw.get("tool_calls")
    if calls is not None and calls != []:
        if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
            raise BadRecord(f"message {number}: 'tool_calls' must be a list of objects")
        fields["tool_calls"] = calls
    return fields


def _with_system(messages: list[dict[str, Any]], system: object) -> list[dict[str, Any]]:
    if system is None or (isinstance(system, str) and not system.strip()):
        return messages
    if not isinstance(system, str):
        raise BadRecord("'system' must be a string")
    if messages[0]["role"] in SYSTEM_ROLES:
        return messages
    return [{"role": "system", "content": system}, *messages]


def _check_order(messages: list[dict[str, Any]]) -> None:
    """Roles in an order that gives every generation point a prompt (see the module doc)."""
    start = next((i for i, m in enumerate(messages) if m["role"] not in SYSTEM_ROLES), None)
    if start is None:
        raise BadRecord("no user message, so nothing to generate from")
    if messages[start]["role"] != "user":
        raise BadRecord(
            f"message {start + 1}: the conversation must start with a user "
            f"message, not {messages[start]['role']}"
        )
    for number, (prev, cur) in enumerate(pairwise(messages), 2):
        if cur["role"] == "tool" and prev["role"] not in ("assistant", "tool"):
            raise BadRecord(
                f"message {number}: a tool result must follow an assistant message "
                f"or another tool result, not {prev['role']}"
            )
        if cur["role"] == "assistant" and prev["role"] == "assistant":
            raise BadRecord(f"message {number}: two assistant messages in a row")


def _tools(value: object) -> list[dict[str, Any]] | None:
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, str):  # hermes and LLaMA-Factory store the list as a JSON string
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError:
            raise BadRecord("'tools' is a string but not JSON") from None
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise BadRecord("'tools' must be a list of objects")
    return value or None


def _extra(record: dict[str, Any]) -> dict[str, Any]:
    return {
        key: record[key]
        for key in EXTRA_FIELDS
        if isinstance(record.get(key), _SCALARS) and record[key] != ""
    }

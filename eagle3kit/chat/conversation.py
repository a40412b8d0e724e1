"""A conversation as every stage reads it: OpenAI-style messages, and where its turns are."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Conversation:
    """One prompt-file record, normalized to OpenAI-style messages."""

    source: str
    """The file name (or dataset name) it came from; part of every sample id."""
    line: int
    """1-based line in a JSONL file, or 1-based record/row number in JSON, parquet, datasets."""
    messages: list[dict[str, Any]]
    """role/content dicts; assistant turns may carry reasoning_content and tool_calls, tool
    turns tool_call_id and name. An assistant message marks a turn to regenerate; so does the
    end of the list when the last message is not an assistant's."""
    partition: str = "default"
    tools: list[dict[str, Any]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    """Fields of the record kept as sample metadata (e.g. question_id, category)."""


def generation_points(conv: Conversation) -> list[int]:
    """Message indices where a turn is generated: every assistant message, and the end of
    the list when the last message is not an assistant's."""
    messages = conv.messages
    points = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if messages and messages[-1].get("role") != "assistant":
        points.append(len(messages))
    return points


def is_placeholder(message: dict[str, Any]) -> bool:
    """An assistant turn with no reference answer (MT-bench's second turn): content null
    and no tool calls, so it can be generated but not shown as history."""
    return message.get("content") is None and not message.get("tool_calls")

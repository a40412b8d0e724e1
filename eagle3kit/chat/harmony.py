"""gpt-oss's harmony format: a completion's channels (analysis, final, a tool call's
commentary) read back into the assistant message its chat template takes.
"""

from __future__ import annotations

import json
from typing import Any


def harmony_message(text: str) -> dict[str, Any]:
    """A gpt-oss completion as the assistant message its template takes: the analysis
    channel as `thinking`, the final channel as `content`, a function call as `tool_calls`.
    The template refuses channel tags inside content, so the text must be taken apart."""
    message: dict[str, Any] = {"role": "assistant", "content": ""}
    thinking, calls = [], []
    for header, body in _harmony_parts(text):
        channel = header.partition("<|channel|>")[2].split(" ")[0]
        recipient = _harmony_recipient(header)
        if recipient is not None:
            calls.append(
                {
                    "type": "function",
                    "function": {"name": recipient, "arguments": _json_or_text(body)},
                }
            )
        elif channel == "analysis":
            thinking.append(body)
        else:
            message["content"] += body
    if thinking:
        message["thinking"] = "".join(thinking)
    if calls:
        message["tool_calls"] = calls
    return message


def _harmony_parts(text: str) -> list[tuple[str, str]]:
    """(header, body) of each message: `<|channel|>final<|message|>body<|end|>`, the later
    ones each after `<|start|>assistant`."""
    parts = []
    for chunk in text.split("<|start|>"):
        header, sep, body = chunk.partition("<|message|>")
        if sep:
            parts.append((header, body.split("<|end|>")[0]))
    return parts


def _harmony_recipient(header: str) -> str | None:
    """`functions.NAME` from ` to=functions.NAME` (before or after the channel)."""
    for word in header.replace("<|channel|>", " ").replace("<|constrain|>", " ").split():
        if word.startswith("to=functions."):
            return word.removeprefix("to=functions.")
    return None


def _json_or_text(body: str) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return body

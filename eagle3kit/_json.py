"""A JSON object from text a user gave (a flag's value, a config file): one message when not."""

from __future__ import annotations

import json

from eagle3kit.errors import UserError


def json_object(text: str, where: str, example: str = "") -> dict:
    """`text` parsed as a JSON object; else a UserError naming `where` (a flag or a file)."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise UserError(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise UserError(
            f"{where}: expected a JSON object" + (f" like {example}" if example else "")
        )
    return value

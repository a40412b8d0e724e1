"""The one table of the markers models write around reasoning and tool calls.

Rendering (which think pair a tokenizer has), the reasoning profile validate checks
against, and the phase split of bench and train all read it here, so a new model family's
markers are added once and every stage knows them.
"""

from __future__ import annotations

from collections.abc import Container

THINK_MARKER_PAIRS: tuple[tuple[str, str], ...] = (
    ("<think>", "</think>"),  # Qwen3, QwQ, DeepSeek-R1 and most others
    ("<seed:think>", "</seed:think>"),  # ByteDance Seed-OSS
    ("◁think▷", "◁/think▷"),  # Kimi-K1.5 / Kimi-VL thinking
)
"""(start, end) of a reasoning block, in order of preference; models emit each marker as one
token."""
TOOL_CALL_MARKERS: tuple[str, str] = ("<tool_call>", "</tool_call>")
"""(start, end) of a tool call written as text (Qwen, Hermes)."""
HARMONY_TOKENS: tuple[str, ...] = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>")
"""gpt-oss's harmony format: channels instead of think markers."""


def think_pair(vocab: Container[str]) -> tuple[str, str] | None:
    """The think markers a vocabulary has, both as single tokens (the first in table order
    when it has several), or None."""
    return next(
        (pair for pair in THINK_MARKER_PAIRS if pair[0] in vocab and pair[1] in vocab), None
    )

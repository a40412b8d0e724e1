"""The reasoning phase of each token: inside `<think>`, in the answer, in a tool call.

For reasoning models the drafts inside the reasoning, in the answer and in tool calls are
accepted at very different rates, and an overall figure hides which one a drafter (or a
dataset) is weak at. A verification round belongs to the phase its context ends in: the
prompt and the tokens committed before the round, read for the markers the tokenizer has as
single tokens (the think pair of `markers.py`'s table, e.g. `<think>` / `</think>`, and
`<tool_call>` / `</tool_call>`). A template that puts `<think>` in the generation prompt
starts the completion in the think phase; one that does not starts it in the answer. bench
measures acceptance by phase; train predicts it on held-out data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from eagle3kit.chat.markers import TOOL_CALL_MARKERS, think_pair

PHASES = ("think", "answer", "tool_call")


@dataclass(frozen=True)
class Markers:
    """Token id -> the phase it opens (the closing ones return to the answer)."""

    opens: dict[int, str]
    closes: dict[int, str]

    @property
    def known(self) -> bool:
        return bool(self.opens)

    @classmethod
    def of(cls, tokenizer: Any) -> Markers:
        """The markers that are single tokens in `tokenizer`'s vocabulary."""
        vocab = tokenizer.get_vocab()
        opens, closes = {}, {}
        for phase, pair in (("think", think_pair(vocab)), ("tool_call", TOOL_CALL_MARKERS)):
            if pair is not None and pair[0] in vocab and pair[1] in vocab:
                opens[int(vocab[pair[0]])], closes[int(vocab[pair[1]])] = phase, phase
        return cls(opens, closes)

    def step(self, phase: str, token: int) -> str:
        if token in self.opens:
            return self.opens[token]
        if token in self.closes and phase == self.closes[token]:
            return "answer"
        return phase


def phase_after(ids: Sequence[int], markers: Markers, phase: str = "answer") -> str:
    for token in ids:
        phase = markers.step(phase, int(token))
    return phase


def round_phases(
    prompt: Sequence[int], tokens: Sequence[int], rounds: Sequence[int], markers: Markers
) -> list[str]:
    """The phase of each verification round of one speculative decode.

    tokens[0] comes from the prefill; round r verifies the drafts that follow the first
    sum(rounds[:r] + 1) + 1 tokens, so its phase is the one after them.
    """
    phase = (
        markers.step(phase_after(prompt, markers), int(tokens[0]))
        if tokens
        else phase_after(prompt, markers)
    )
    out, done = [], 1
    for accepted in rounds:
        out.append(phase)
        for token in tokens[done : done + accepted + 1]:
            phase = markers.step(phase, int(token))
        done += accepted + 1
    return out


def by_phase(
    per_prompt: Sequence[tuple[list[str], Sequence[int]]], k: int
) -> dict[str, dict[str, Any]]:
    """phase -> rounds, acceptance length and unconditional per-position rates, over
    (round phases, accepted per round) of each decode; phases without rounds are left out."""
    counts: dict[str, list[int]] = {}
    for phases, rounds in per_prompt:
        for phase, accepted in zip(phases, rounds, strict=True):
            counts.setdefault(phase, []).append(accepted)
    out = {}
    for phase in PHASES:
        per_round = counts.get(phase)
        if not per_round:
            continue
        n = len(per_round)
        out[phase] = {
            "rounds": n,
            "acceptance_length": 1 + sum(per_round) / n,
            "per_position": [sum(a >= i for a in per_round) / n for i in range(1, k + 1)],
        }
    return out

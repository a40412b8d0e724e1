"""Acceptance by context depth: where in the sequence each verification round happens.

A drafter trained on short samples can accept well at 1K tokens of context and almost
nothing at 20K; an overall figure over short prompts hides that. The depth of a round is the
length of the context its drafts follow: the prompt and every token committed before the
round (so the first draft of the round is token number `depth`, counting from 0). Rounds are
grouped into buckets by ascending edges, by default < 1K, 1K-4K, 4K-16K and >= 16K tokens.

This is the one definition: bench accept counts its decoding rounds with it, bench server
the engine's per-request rounds (vLLM's --per-request-spec-decode-metrics detailed), and
train's held-out prediction the chain starts its decode walk visits (a chain drafted at
position t follows ids[:t+2]: depth t+2). Nothing here imports torch.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from itertools import pairwise
from typing import Any

DEPTH_EDGES = (1024, 4096, 16384)
"""Default bucket edges in tokens: < 1K, 1K-4K, 4K-16K, >= 16K."""
DEPTH_EDGES_TEXT = ",".join(map(str, DEPTH_EDGES))


def parse_edges(text: str, flag: str = "--depth-buckets") -> tuple[int, ...]:
    """'1024,4096,16384' -> (1024, 4096, 16384): positive, strictly ascending token counts.
    ValueError names `flag` (the config turns it into the one-line user error)."""
    try:
        edges = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(
            f"{flag} {text}: expected ascending token counts separated by "
            f"commas, e.g. {flag} {DEPTH_EDGES_TEXT}"
        ) from None
    if any(e < 1 for e in edges) or any(a >= b for a, b in pairwise(edges)):
        raise ValueError(f"{flag} {text}: the edges must be positive and strictly ascending")
    return edges


def _tokens(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def labels(edges: Sequence[int]) -> list[str]:
    """The name of each bucket, in order: '<1K', '1K-4K', ..., '>=16K'."""
    if not edges:
        return ["all"]
    inner = [f"{_tokens(a)}-{_tokens(b)}" for a, b in pairwise(edges)]
    return [f"<{_tokens(edges[0])}", *inner, f">={_tokens(edges[-1])}"]


def bounds(edges: Sequence[int], bucket: int) -> tuple[int, int | None]:
    """[from, to) of bucket number `bucket` in tokens; to is None for the last."""
    lows = [0, *edges]
    return lows[bucket], (edges[bucket] if bucket < len(edges) else None)


def bucket_of(depth: int, edges: Sequence[int]) -> int:
    """The bucket a round at `depth` falls in: depth < edges[0] is 0, an edge itself opens
    the next bucket."""
    return bisect.bisect_right(edges, depth)


def round_depths(prompt_tokens: int, rounds: Sequence[int]) -> list[int]:
    """The depth of each verification round of one decode: the prefill made the first new
    token, and a round that accepts a drafts commits a + 1 tokens."""
    depth, out = prompt_tokens + 1, []
    for accepted in rounds:
        out.append(depth)
        depth += accepted + 1
    return out


def by_depth(
    decodes: Iterable[tuple[int, Sequence[int]]], k: int, edges: Sequence[int] = DEPTH_EDGES
) -> dict[str, dict[str, Any]]:
    """bucket -> from, to (tokens), rounds, acceptance length and unconditional per-position
    rates, over (prompt tokens, accepted per round) of each decode; buckets without rounds
    are left out."""
    counts: dict[int, list[int]] = {}
    for prompt_tokens, rounds in decodes:
        for depth, accepted in zip(round_depths(prompt_tokens, rounds), rounds, strict=True):
            counts.setdefault(bucket_of(depth, edges), []).append(accepted)
    out = {}
    for bucket, name in enumerate(labels(edges)):
        per_round = counts.get(bucket)
        if not per_round:
            continue
        low, high = bounds(edges, bucket)
        n = len(per_round)
        out[name] = {
            "from": low,
            "to": high,
            "rounds": n,
            "acceptance_length": 1 + sum(per_round) / n,
            "per_position": [sum(a >= i for a in per_round) / n for i in range(1, k + 1)],
        }
    return out

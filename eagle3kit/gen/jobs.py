"""What gen works through: a chain of turns per conversation and sample index, and the job
(one rendered request) for each turn."""

from __future__ import annotations

from dataclasses import dataclass, field

import xxhash

from eagle3kit.chat.conversation import Conversation, generation_points
from eagle3kit.chat.render import Renderer
from eagle3kit.format import make_sample_id
from eagle3kit.gen.config import GenConfig
from eagle3kit.gen.types import GenRequest

HEAD_CHARS_PER_TOKEN = 16
"""A prompt longer than this many characters per token of the context is measured on its
head first: tokenizing a 100 MB prompt whole takes gigabytes and minutes."""
HEAD_SLACK_TOKENS = 64
"""Tokens a cut can add at its edge: a head that is this much over the context proves the
whole prompt is."""


@dataclass
class Chain:
    """The turns of one conversation for one sample index, generated in order."""

    conv: Conversation
    index: int
    ids: list[str]
    answers: list[dict] = field(default_factory=list)
    """The model's own answers to the turns done so far (for --history own)."""
    turn: int = 0
    blocked: str | None = None
    """Why the remaining turns cannot be generated (an earlier turn did not finish)."""


@dataclass
class Job:
    chain: Chain
    turn: int
    request: GenRequest
    long: bool
    messages: list[dict] = field(default_factory=list)
    """The history the prompt ids render, stored so validate can check the round trip."""
    attempts: int = 0
    last_error: str = ""
    retry_spent: float = 0.0
    """Seconds of backoff this request has waited so far (--retry-for bounds it)."""
    violations: list[str] = field(default_factory=list)
    """What the last unusable answer to it broke."""


@dataclass
class Unsendable:
    """A turn that cannot be sent, recorded as a skipped sample with this finish reason."""

    finish: str
    why: str


def make_chains(convs: list[Conversation], n: int) -> list[Chain]:
    chains = []
    for conv in convs:
        points = generation_points(conv)
        for index in range(n):
            ids = [
                make_sample_id(
                    conv.source,
                    {"messages": conv.messages[:point], "tools": conv.tools},
                    turn,
                    index,
                )
                for turn, point in enumerate(points)
            ]
            chains.append(Chain(conv, index, ids))
    return chains


def resume_point(chain: Chain, done: set[str]) -> int:
    """The first turn of `chain` not yet in the dataset (len(ids) when all are)."""
    for turn, sample_id in enumerate(chain.ids):
        if sample_id not in done:
            return turn
    return len(chain.ids)


def sample_seed(sampling_seed: int | None, sample_id: str) -> int | None:
    """Each sample's own seed: n samples of one prompt differ, and a rerun reproduces them."""
    if sampling_seed is None:
        return None
    return xxhash.xxh64_intdigest(f"{sampling_seed}:{sample_id}".encode()) & 0x7FFFFFFF


def build_job(
    cfg: GenConfig, renderer: Renderer, context_len: int | None, chain: Chain, turn: int
) -> Job | Unsendable:
    """Render the prompt of `turn` as a job, or say why it cannot be sent."""
    answers = chain.answers if cfg.history == "own" else None
    try:
        history = renderer.history(chain.conv, turn, answers)
        text = renderer.render_text(history, chain.conv.tools)
        too_long = surely_too_long(renderer, context_len, text)
        prompt_ids = [] if too_long else renderer.encode(text)
    except (ValueError, IndexError) as exc:  # one record the template refuses
        return Unsendable("skipped:render_error", str(exc))
    if too_long:
        return Unsendable("skipped:prompt_too_long", too_long)
    long = cfg.long_threshold is not None and len(prompt_ids) >= cfg.long_threshold
    max_tokens = _max_tokens(cfg, long)
    if context_len is not None:
        room = context_len - len(prompt_ids)
        if room < max(1, cfg.min_completion_tokens):
            # The ids are not kept: a sample that cannot be sent is no training data, and an
            # enormous prompt would be stored whole.
            return Unsendable(
                "skipped:prompt_too_long",
                f"{len(prompt_ids)} prompt tokens leave {room} of {context_len}",
            )
        max_tokens = min(max_tokens, room)
    return Job(
        chain,
        turn,
        _request(cfg, renderer, chain, turn, prompt_ids, max_tokens, history),
        long,
        history,
    )


def _request(
    cfg: GenConfig,
    renderer: Renderer,
    chain: Chain,
    turn: int,
    prompt_ids: list[int],
    max_tokens: int,
    history: list[dict],
) -> GenRequest:
    sample_id = chain.ids[turn]
    return GenRequest(
        sample_id=sample_id,
        prompt_ids=prompt_ids,
        max_tokens=max_tokens,
        stop_token_ids=renderer.stop_token_ids,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        top_k=cfg.top_k,
        min_p=cfg.min_p,
        seed=sample_seed(cfg.sampling_seed, sample_id),
        messages=history if cfg.api == "openai-chat" else None,
        tools=chain.conv.tools,
    )


def _max_tokens(cfg: GenConfig, long: bool) -> int:
    chosen = cfg.long_max_tokens if long else cfg.short_max_tokens
    return chosen or cfg.max_tokens


def surely_too_long(renderer: Renderer, context_len: int | None, text: str) -> str | None:
    """Why a huge prompt cannot fit, found from its head alone; None when it may fit."""
    if context_len is None:
        return None
    cut = context_len * HEAD_CHARS_PER_TOKEN
    if len(text) <= cut:
        return None
    head = len(renderer.encode(text[:cut]))
    if head <= context_len + HEAD_SLACK_TOKENS:
        return None
    return (
        f"{len(text):,} characters, the first {cut:,} of them already {head:,} tokens: "
        f"more than the {context_len} of the context (not tokenized whole)"
    )

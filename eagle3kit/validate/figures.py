"""validate's scan: every per-sample figure, one shard at a time, as numpy passes.

Marker positions come from `np.flatnonzero` over a shard's flat token array and are mapped
to samples with `np.searchsorted` against its offsets, so no sample is decoded to text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields

import numpy as np

from eagle3kit.chat.reasoning import Profile
from eagle3kit.format import Dataset

LOOP_MAX_PERIOD = 32
"""Longest repeated unit (tokens) the loop detector looks for."""
LOOP_MIN_TOKENS = 128
"""A loop: at least this many tokens each equal to the token one period earlier."""
FINISH_CODES = {"stop": 0, "length": 1}
"""`DatasetFigures.finish`: these codes, 2 for anything else (filtered:*, skipped:*)."""


@dataclass
class DatasetFigures:
    """Per-sample figures for the whole dataset, in commit order: one entry per sample in
    every array. The fields after `violated` need a tokenizer (None without one); the marker
    fields need reasoning markers or harmony channels, the harmony ones harmony."""

    ids: list[str]
    partition: np.ndarray
    """Each sample's index into `partition_names`."""
    partition_names: list[str]
    meta: list[dict]
    """Each sample's metadata (empty unless the scan was asked for it)."""
    violations: dict[str, int]
    """The invariant violations gen recorded (metadata.violations), numbers taken out, with
    how many samples recorded each."""
    prompt_len: np.ndarray
    comp_len: np.ndarray
    finish: np.ndarray
    """FINISH_CODES of the finish reason."""
    reconstructed: np.ndarray
    loss: np.ndarray
    """Loss tokens."""
    prompt_loss: np.ndarray
    """Loss tokens on prompt positions."""
    violated: np.ndarray
    """gen recorded an invariant violation for the sample."""
    oov: np.ndarray | None = None
    """Ids at or past the tokenizer's size."""
    tail_ok: np.ndarray | None = None
    """The prompt ends with the generation prompt."""
    ends_stop: np.ndarray | None = None
    """The completion ends with a stop id."""
    answer: np.ndarray | None = None
    """Non-blank tokens of the answer."""
    after_end: np.ndarray | None = None
    """Tokens after think-end (the final channel's header), the stop id left out."""
    literal: np.ndarray | None = None
    """Markers written as plain text."""
    loop: np.ndarray | None = None
    """The completion holds a repeated n-gram loop."""
    n_start: np.ndarray | None = None
    """Think-starts (analysis headers) in the final turn."""
    n_end: np.ndarray | None = None
    """Think-ends (final headers) in the final turn."""
    order_ok: np.ndarray | None = None
    reasoning: np.ndarray | None = None
    """Non-blank tokens of reasoning."""
    open_at_end: np.ndarray | None = None
    """The reasoning is still open at the end."""
    unclosed: np.ndarray | None = None
    """Harmony: the analysis message is not closed by `<|end|>` before the final channel."""
    tool_call: np.ndarray | None = None
    """Harmony: a tool-call turn (ends at `<|call|>`, no final channel)."""

    def __len__(self) -> int:
        return len(self.ids)


_ARRAYS = {f.name for f in fields(DatasetFigures)} - {
    "ids",
    "partition_names",
    "meta",
    "violations",
}


@dataclass
class _Scan:
    """What the scan collects, shard by shard, before it becomes `DatasetFigures`."""

    ids: list[str] = field(default_factory=list)
    parts: dict[str, int] = field(default_factory=dict)
    meta: list[dict] = field(default_factory=list)
    violations: dict[str, int] = field(default_factory=dict)
    cols: dict[str, list[np.ndarray]] = field(default_factory=dict)

    def add(self, **arrays: np.ndarray) -> None:
        for k, v in arrays.items():
            assert k in _ARRAYS, k
            self.cols.setdefault(k, []).append(v)

    def figures(self) -> DatasetFigures:
        names = [p for p, _ in sorted(self.parts.items(), key=lambda kv: kv[1])]
        arrays = {k: np.concatenate(v) for k, v in self.cols.items()}
        return DatasetFigures(
            ids=self.ids,
            partition_names=names,
            meta=self.meta,
            violations=self.violations,
            **arrays,
        )


def _count_in(pos: np.ndarray, owner: np.ndarray, lo: np.ndarray, n: int) -> np.ndarray:
    """How many of the positions `pos` (owned by sample `owner`) are >= lo[owner]."""
    keep = pos >= lo[owner]
    return np.bincount(owner[keep], minlength=n)


def _first_in(pos: np.ndarray, owner: np.ndarray, lo: np.ndarray, n: int) -> np.ndarray:
    """The first position >= lo[owner] of each sample; -1 when none."""
    keep = pos >= lo[owner]
    out = np.full(n, -1, np.int64)
    pos, owner = pos[keep], owner[keep]
    first_owner, at = np.unique(owner, return_index=True)
    out[first_owner] = pos[at]
    return out


def _positions(
    tokens: np.ndarray, token: int | None, offsets: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    if token is None:
        empty = np.zeros(0, np.int64)
        return empty, empty
    pos = np.flatnonzero(tokens == token)
    return pos, np.searchsorted(offsets, pos, side="right") - 1


def _literal_hits(tokens: np.ndarray, prof: Profile) -> np.ndarray:
    """Start positions of every marker written as plain text."""
    hits = []
    firsts: dict[int, np.ndarray] = {}  # many patterns share a first id ("<", "|")
    for pat in prof.literal:
        core, k = pat.core, len(pat.core)
        if len(tokens) <= k:
            continue
        if int(core[0]) not in firsts:
            firsts[int(core[0])] = np.flatnonzero(tokens == core[0])
        cand = firsts[int(core[0])]
        cand = cand[cand < len(tokens) - k - (pat.after is not None) + 1]
        for j in range(1, k):
            cand = cand[tokens[cand + j] == core[j]]
        if pat.before is not None:
            cand = cand[cand > 0]
            cand = cand[np.isin(tokens[cand - 1], pat.before)]
        if pat.after is not None:
            cand = cand[np.isin(tokens[cand + k], pat.after)]
        hits.append(cand)
    return np.unique(np.concatenate(hits)) if hits else np.zeros(0, np.int64)


def _seq_starts(
    tokens: np.ndarray, seq: np.ndarray | None, offsets: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Where the id sequence `seq` starts in `tokens`, and the sample of each start (a
    sequence that runs into the next sample is not counted)."""
    if seq is None or not len(seq) or len(tokens) < len(seq):
        empty = np.zeros(0, np.int64)
        return empty, empty
    k = len(seq)
    cand = np.flatnonzero(tokens[: len(tokens) - k + 1] == seq[0])
    for j in range(1, k):
        cand = cand[tokens[cand + j] == seq[j]]
    owner = np.searchsorted(offsets, cand, side="right") - 1
    keep = cand + k <= offsets[owner + 1]
    return cand[keep], owner[keep]


def _loop_hits(tokens: np.ndarray, comp_start: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Samples whose completion holds a run of LOOP_MIN_TOKENS tokens each equal to the one a
    period (1..LOOP_MAX_PERIOD) earlier: the same phrase repeated over and over."""
    n = len(offsets) - 1
    flagged = np.zeros(n, bool)
    for p in range(1, LOOP_MAX_PERIOD + 1):
        if len(tokens) <= p + LOOP_MIN_TOKENS:
            break
        eq = np.flatnonzero(tokens[p:] == tokens[:-p])  # tokens[j + p] == tokens[j]
        if len(eq) < LOOP_MIN_TOKENS:
            continue
        # Runs of consecutive positions: a loop is LOOP_MIN_TOKENS in a row.
        breaks = np.flatnonzero(np.diff(eq) != 1)
        starts = np.concatenate([[0], breaks + 1])
        ends = np.concatenate([breaks, [len(eq) - 1]])
        long = (ends - starts + 1) >= LOOP_MIN_TOKENS
        for s, e in zip(eq[starts[long]], eq[ends[long]], strict=True):
            owner = np.searchsorted(offsets, s, side="right") - 1
            if s >= comp_start[owner] and e + p < offsets[owner + 1]:
                flagged[owner] = True
    return flagged


def scan(ds: Dataset, prof: Profile, want_meta: bool) -> DatasetFigures:
    out = _Scan()
    for shard in ds.columns():
        tokens = np.asarray(shard.tokens, np.int64)
        offsets = shard.offsets
        n = len(offsets) - 1
        plen = shard.prompt_lens
        c0 = offsets[:-1] + plen
        end = offsets[1:]
        meta = shard.meta
        out.ids.extend(shard.ids)
        gidx = np.asarray(
            [out.parts.setdefault(p, len(out.parts)) for p in shard.partition_names], np.int64
        )
        partition = (
            gidx[np.asarray(shard.partition_index, np.int64)] if n else np.zeros(0, np.int64)
        )
        finish = np.asarray([FINISH_CODES.get(m["finish_reason"], 2) for m in meta], np.int8)
        recon = np.asarray([bool(m.get("metadata", {}).get("reconstructed")) for m in meta], bool)
        violated = np.asarray([_note_violations(out, m) for m in meta], bool)
        if want_meta:
            out.meta.extend(meta)
        # Loss tokens per sample, from the span arrays.
        spans = shard.loss_spans
        span_len = spans[:, 1] - spans[:, 0]
        span_owner = np.repeat(np.arange(n), np.diff(shard.loss_span_offsets))
        loss = np.bincount(span_owner, weights=span_len, minlength=n).astype(np.int64)
        prompt_loss = (
            np.bincount(
                span_owner,
                minlength=n,
                weights=np.clip(plen[span_owner] - spans[:, 0], 0, span_len),
            ).astype(np.int64)
            if len(spans)
            else np.zeros(n, np.int64)
        )
        out.add(
            partition=partition,
            prompt_len=plen,
            comp_len=end - c0,
            finish=finish,
            reconstructed=recon,
            loss=loss,
            prompt_loss=prompt_loss,
            violated=violated,
        )
        if prof.renderer is not None:
            outside = np.flatnonzero(tokens >= prof.vocab_size)
            out.add(
                oov=np.bincount(np.searchsorted(offsets, outside, side="right") - 1, minlength=n)[
                    :n
                ]
            )
            out.add(**_token_figures(tokens, offsets, c0, end, prof))
        del shard
    return out.figures()


def _note_violations(out: _Scan, meta: dict) -> bool:
    recorded = meta.get("metadata", {}).get("violations")
    if not recorded:
        return False
    for v in recorded if isinstance(recorded, list) else [recorded]:
        kind = re.sub(r"-?\d+(\.\d+)?", "N", str(v))
        out.violations[kind] = out.violations.get(kind, 0) + 1
    return True


def _token_figures(
    tokens: np.ndarray, offsets: np.ndarray, c0: np.ndarray, end: np.ndarray, prof: Profile
) -> dict[str, np.ndarray]:
    """Marker counts and positions in each final turn, and what lies between them."""
    n = len(c0)
    L = len(prof.tail)
    r0 = np.maximum(c0 - L, offsets[:-1])
    tail_ok = np.ones(n, bool)
    if L:
        pl = c0 - offsets[:-1]
        tail_ok = pl >= L
        for j in range(L):
            idx = np.clip(c0 - L + j, 0, max(len(tokens) - 1, 0))
            tail_ok &= tokens[idx] == prof.tail[j] if len(tokens) else False
    nonempty = end > c0
    last = (
        tokens[np.clip(end - 1, 0, max(len(tokens) - 1, 0))]
        if len(tokens)
        else np.zeros(n, np.int64)
    )
    ends_stop = nonempty & np.isin(last, prof.stop_ids)
    content = np.arange(len(tokens) + 1)
    if prof.blank is not None:
        # An id past the vocabulary (the vocabulary check names it) counts as content here.
        blank = np.append(prof.blank, False)
        content = np.concatenate([[0], np.cumsum(~blank[np.minimum(tokens, len(blank) - 1)])])
    figures: dict[str, np.ndarray] = dict(tail_ok=tail_ok, ends_stop=ends_stop)
    ans_end = end - ends_stop
    if prof.analysis is not None:
        figures.update(_channel_figures(tokens, offsets, r0, end, ans_end, content, prof))
        figures["tool_call"] = ends_stop & np.isin(last, prof.call_end)
    elif prof.markers:
        sp, so = _positions(tokens, prof.start, offsets)
        ep, eo = _positions(tokens, prof.end, offsets)
        n_start = _count_in(sp, so, r0, n)
        n_end = _count_in(ep, eo, r0, n)
        first_s = _first_in(sp, so, r0, n)
        first_e = _first_in(ep, eo, r0, n)
        has_e = first_e >= 0
        # Reasoning: after think-start up to think-end (or the end, when never closed).
        r_lo = np.where(first_s >= 0, first_s + 1, end)
        r_hi = np.where(has_e, first_e, end)
        reasoning = np.where(r_hi > r_lo, content[np.maximum(r_hi, r_lo)] - content[r_lo], 0)
        a_lo = np.where(has_e, first_e + 1, ans_end)
        after_end = np.maximum(ans_end - a_lo, 0)
        answer = content[np.maximum(ans_end, a_lo)] - content[a_lo]
        open_at_end = n_start > n_end
        figures.update(
            n_start=n_start,
            n_end=n_end,
            order_ok=~(has_e & (first_e < first_s)),
            reasoning=reasoning,
            after_end=after_end,
            answer=answer,
            open_at_end=open_at_end,
        )
    else:
        figures.update(answer=content[ans_end] - content[c0], after_end=ans_end - c0)
    lit = _literal_hits(tokens, prof)
    figures["literal"] = np.bincount(np.searchsorted(offsets, lit, side="right") - 1, minlength=n)[
        :n
    ]
    figures["loop"] = _loop_hits(tokens, c0, offsets)
    return figures


def _channel_figures(
    tokens: np.ndarray,
    offsets: np.ndarray,
    r0: np.ndarray,
    end: np.ndarray,
    ans_end: np.ndarray,
    content: np.ndarray,
    prof: Profile,
) -> dict[str, np.ndarray]:
    """The harmony counterpart of the think-marker figures: the analysis channel's header
    plays think-start, the final channel's header think-end (same column names, so the
    checks read both alike), plus whether the analysis message was closed by `<|end|>`."""
    assert prof.analysis is not None
    n = len(r0)
    ap, ao = _seq_starts(tokens, prof.analysis, offsets)
    fp, fo = _seq_starts(tokens, prof.final, offsets)
    n_a = _count_in(ap, ao, r0, n)
    n_f = _count_in(fp, fo, r0, n)
    first_a = _first_in(ap, ao, r0, n)
    first_f = _first_in(fp, fo, r0, n)
    has_a, has_f = first_a >= 0, first_f >= 0
    final_after = has_a & has_f & (first_f > first_a)
    # Reasoning: the analysis body, from its header to the first <|end|> after it (or the
    # final header, or the end of the sample when never closed).
    body = np.where(has_a, first_a + len(prof.analysis), end)
    r_hi = np.where(final_after, first_f, end)
    k = len(prof.analysis_end)
    closed = np.ones(n, bool)
    if k and len(tokens):
        cp, _ = _seq_starts(tokens, prof.analysis_end, offsets)
        if len(cp):
            at = np.searchsorted(cp, body)
            r_hi = np.minimum(r_hi, np.where(at < len(cp), cp[np.minimum(at, len(cp) - 1)], r_hi))
        # The final header must follow the analysis end: `...<|end|><|start|>assistant...`.
        closed = first_f - k >= body
        for j in range(k):
            closed &= tokens[np.clip(first_f - k + j, 0, len(tokens) - 1)] == prof.analysis_end[j]
    r_hi = np.maximum(r_hi, body)
    a_lo = np.where(has_f, first_f + len(prof.final if prof.final is not None else ()), ans_end)
    return dict(
        n_start=n_a,
        n_end=n_f,
        order_ok=~(has_a & has_f & (first_f < first_a)),
        unclosed=final_after & ~closed,
        reasoning=content[r_hi] - content[np.minimum(body, r_hi)],
        after_end=np.maximum(ans_end - a_lo, 0),
        answer=content[np.maximum(ans_end, a_lo)] - content[np.minimum(a_lo, ans_end)],
        open_at_end=n_a > n_f,
    )

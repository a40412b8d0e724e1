"""validate's checks: a registry of small functions, each returning its ✓/✗ row from the
typed figures of the scan (figures.py). The order of registration is the order of the
report, which config.py's `CHECKS` lists (the names `--only` and `--skip` take, written out
there so the command line's config loads no numpy)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from eagle3kit.chat.reasoning import Profile
from eagle3kit.format import Dataset
from eagle3kit.validate.config import CHECKS, ValidateConfig
from eagle3kit.validate.figures import LOOP_MAX_PERIOD, LOOP_MIN_TOKENS, DatasetFigures

if TYPE_CHECKING:
    from eagle3kit.chat.render import Renderer

EXAMPLES = 5
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
"""A date as templates that write today's date (gpt-oss: `strftime_now`) write it."""


@dataclass
class CheckResult:
    name: str
    status: str
    """pass, fail or skip."""
    detail: str
    failing: int = 0
    total: int = 0
    threshold: float | None = None
    rate: float | None = None
    examples: list[str] = field(default_factory=list)
    reasons: dict[str, int] = field(default_factory=dict)
    flagged: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    """Global indices of the samples this check flags (not in the JSON)."""

    @property
    def passed(self) -> bool:
        return self.status != "fail"

    @property
    def title(self) -> str:
        return REGISTRY[self.name].title

    def to_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "flagged"}
        d["title"] = self.title
        return d


@dataclass
class Context:
    """What the checks read: the settings, the dataset, its profile and its figures."""

    cfg: ValidateConfig
    ds: Dataset
    prof: Profile
    f: DatasetFigures


@dataclass(frozen=True)
class Check:
    name: str
    title: str
    run: Callable[[Context], CheckResult]
    needs_tokenizer: bool
    """Skipped (saying why) when no tokenizer is stored or given."""


REGISTRY: dict[str, Check] = {}


def check(
    name: str, title: str, *, needs_tokenizer: bool = False
) -> Callable[[Callable[[Context], CheckResult]], Callable[[Context], CheckResult]]:
    """Register a check under `name` (what --only/--skip take) with its report title."""

    def register(fn: Callable[[Context], CheckResult]) -> Callable[[Context], CheckResult]:
        REGISTRY[name] = Check(name, title, fn, needs_tokenizer)
        return fn

    return register


def run_checks(selected: list[str], ctx: Context) -> list[CheckResult]:
    rows = []
    for name in selected:
        entry = REGISTRY[name]
        if entry.needs_tokenizer and ctx.prof.renderer is None:
            rows.append(_skip(name, f"skipped: {ctx.prof.why_none}"))
        else:
            rows.append(entry.run(ctx))
    return rows


def _result(
    name: str,
    mask: np.ndarray,
    scope: np.ndarray,
    ids: list[str],
    detail: str,
    reasons: dict[str, np.ndarray] | None = None,
    threshold: float | None = None,
    fail_above: float | None = 0.0,
) -> CheckResult:
    flagged = np.flatnonzero(mask & scope)
    total = int(scope.sum())
    rate = len(flagged) / total if total else 0.0
    failed = fail_above is not None and rate > fail_above
    return CheckResult(
        name,
        "fail" if failed else "pass",
        detail,
        failing=len(flagged),
        total=total,
        threshold=threshold,
        rate=round(rate, 6),
        examples=[ids[i] for i in flagged[:EXAMPLES]],
        reasons={
            k: int((v & scope).sum()) for k, v in (reasons or {}).items() if (v & scope).any()
        },
        flagged=flagged,
    )


def _skip(name: str, why: str) -> CheckResult:
    return CheckResult(name, "skip", why)


def _any(reasons: dict[str, np.ndarray], n: int) -> np.ndarray:
    mask = np.zeros(n, bool)
    for v in reasons.values():
        mask |= v
    return mask


@check("integrity", "integrity")
def integrity(c: Context) -> CheckResult:
    ds, f, prof = c.ds, c.f, c.prof
    problems: dict[str, int] = {}
    n = len(f)
    flagged = np.zeros(n, bool)
    ids = np.asarray(f.ids, dtype=object)
    _, first, counts = np.unique(ids, return_index=True, return_counts=True)
    if (counts > 1).any():
        dup = ~np.isin(np.arange(n), first)
        flagged |= dup
        problems["duplicate sample ids"] = int(dup.sum())
    tokens = int((f.prompt_len + f.comp_len).sum()) if n else 0
    if tokens != ds.num_tokens or n != len(ds):
        problems["counts differ from the manifest"] = 1
    loss = int(f.loss.sum()) if n else 0
    if ds.shards and loss != ds.num_loss_tokens:
        problems["loss tokens differ from the manifest"] = 1
    recorded = ds.recorded()
    if len(set(recorded.renderers)) > 1:
        problems["several tokenizers or templates (continued with --force)"] = 1
    if (
        prof.renderer is not None
        and recorded.chat_template_xxh3
        and prof.renderer.identity()["chat_template_xxh3"] != recorded.chat_template_xxh3
    ):
        problems["the template used differs from the one recorded"] = 1
    detail = (
        "checksums, counts, ids and tokenizer agree"
        if not problems
        else "; ".join(f"{k} ({v})" if v > 1 else k for k, v in problems.items())
    )
    res = _result("integrity", flagged, np.ones(n, bool), f.ids, detail)
    res.reasons = problems
    if problems:
        res.status = "fail"
    return res


def damaged(problems: list[str], shards: int) -> CheckResult:
    """The integrity row of a dataset whose shards cannot be read: every damaged or missing
    shard, named (the other checks need the data and are skipped)."""
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    return CheckResult(
        "integrity",
        "fail",
        f"{'; '.join(problems[:3])}{more}; the dataset cannot be validated until the shard "
        "is restored or the run that wrote it is repeated",
        failing=len(problems),
        total=shards,
        reasons={"damaged or missing shards": len(problems)},
    )


@check("structure", "final-turn structure", needs_tokenizer=True)
def structure(c: Context) -> CheckResult:
    f, prof = c.f, c.prof
    # A tokenizer check (run_checks skips it without one), so the tokenizer's figures exist.
    assert f.tail_ok is not None and f.ends_stop is not None
    finish = f.finish
    scope = finish <= 1
    stop = finish == 0
    reasons: dict[str, np.ndarray] = {
        "prompt does not end with the generation prompt": ~f.tail_ok,
        "no end-of-turn token last": stop & ~f.ends_stop,
    }
    if prof.analysis is not None:
        # Harmony: its figures exist along with the markers'.
        assert f.tool_call is not None and f.unclosed is not None
        assert (
            f.n_start is not None
            and f.n_end is not None
            and f.order_ok is not None
            and f.after_end is not None
        )
        answering = stop & ~f.tool_call  # a tool-call turn ends at <|call|>, no final
        reasons.update(
            {
                "analysis channel missing": f.n_start == 0,
                "analysis channel repeated": f.n_start > 1,
                "final channel missing": answering & (f.n_end == 0),
                "final channel repeated": f.n_end > 1,
                "final channel before the analysis": ~f.order_ok,
                "analysis not closed before the final channel": f.unclosed,
                "no content after the final channel": answering
                & (f.n_end == 1)
                & (f.after_end == 0),
            }
        )
        what = (
            "the analysis channel once, the final channel once after it, an answer, "
            "end-of-turn last"
        )
    elif prof.markers:
        assert (
            f.n_start is not None
            and f.n_end is not None
            and f.order_ok is not None
            and f.after_end is not None
        )
        reasons.update(
            {
                "think-start missing": f.n_start == 0,
                "think-start repeated": f.n_start > 1,
                "think-end missing": stop & (f.n_end == 0),
                "think-end repeated": f.n_end > 1,
                "think-end before think-start": ~f.order_ok,
                "no content after think-end": stop & (f.n_end == 1) & (f.after_end == 0),
            }
        )
        what = f"{prof.start_text} once, {prof.end_text} once after it, an answer, end-of-turn last"
    else:
        what = "generation prompt, then end-of-turn last (no reasoning markers: those skipped)"
    return _result("structure", _any(reasons, len(finish)), scope, f.ids, what, reasons)


@check("literal_markers", "no literal markers", needs_tokenizer=True)
def literal_markers(c: Context) -> CheckResult:
    if not c.prof.markers:
        return _skip("literal_markers", "skipped: the tokenizer has no reasoning markers")
    scope = np.ones(len(c.f), bool)
    assert c.f.literal is not None  # a tokenizer check: the tokenizer's figures exist
    return _result(
        "literal_markers",
        c.f.literal > 0,
        scope,
        c.f.ids,
        f"{' / '.join(c.prof.literal_names)} never written as plain text",
    )


@check("truncation", "truncation")
def truncation(c: Context) -> CheckResult:
    f, limit = c.f, c.cfg.max_truncation
    length = f.finish == 1
    scope = f.finish <= 1
    reasons: dict[str, np.ndarray] = {}
    if f.open_at_end is not None:
        reasons = {
            "cut inside the reasoning": length & f.open_at_end,
            "cut inside the answer": length & ~f.open_at_end,
        }
    res = _result(
        "truncation", length, scope, f.ids, "", reasons, threshold=limit, fail_above=limit
    )
    over = [
        p
        for i, p in enumerate(f.partition_names)
        if (scope & (f.partition == i)).any()
        and (length & (f.partition == i)).sum() / (scope & (f.partition == i)).sum() > limit
    ]
    res.detail = f"{res.rate:.1%} finished by length (max {limit:.0%})" + (
        f"; over the limit in {', '.join(over)}" if over else ""
    )
    return res


@check("reasoning", "reasoning capture", needs_tokenizer=True)
def reasoning(c: Context) -> CheckResult:
    if not c.prof.markers:
        return _skip("reasoning", "skipped: the tokenizer has no reasoning markers")
    if c.prof.thinking_off:
        return _skip(
            "reasoning",
            "skipped: thinking is off (the template closes the reasoning block in the prompt)",
        )
    f, least = c.f, c.cfg.min_reasoning
    assert f.reasoning is not None  # a tokenizer check: the tokenizer's figures exist
    scope = f.finish <= 1
    res = _result(
        "reasoning", ~(f.reasoning > 0), scope, f.ids, "", threshold=least, fail_above=None
    )
    share = 1 - (res.rate or 0.0) if res.total else 0.0  # _result always sets the rate
    res.rate = round(share, 6)
    res.status = "fail" if res.total and share < least else "pass"
    res.detail = f"{share:.1%} with non-empty reasoning (min {least:.0%})"
    return res


@check("degenerate", "no degenerate output", needs_tokenizer=True)
def degenerate(c: Context) -> CheckResult:
    f = c.f
    # A tokenizer check: the tokenizer's figures exist, the markers' ones with the markers.
    assert f.loop is not None and f.answer is not None
    stop = f.finish == 0
    scope = f.finish <= 1
    reasons = {"repeated n-gram loop": f.loop}
    if c.prof.markers:
        assert f.n_end is not None and f.n_start is not None
        closed = f.n_end >= 1  # think-end, or the final channel's header
        answering = stop & ~f.tool_call if f.tool_call is not None else stop
        reasons["empty answer"] = stop & closed & (f.answer == 0)
        reasons["all reasoning, no answer"] = answering & (f.n_start >= 1) & ~closed
    else:
        reasons["empty answer"] = stop & (f.answer == 0)
    return _result(
        "degenerate",
        _any(reasons, len(stop)),
        scope,
        f.ids,
        f"empty answers, loops (a {LOOP_MAX_PERIOD}-token unit or shorter repeated "
        f"over {LOOP_MIN_TOKENS} tokens), reasoning with no answer",
        reasons,
    )


@check("round_trip", "template round trip", needs_tokenizer=True)
def round_trip(c: Context) -> CheckResult:
    ds, f, prof = c.ds, c.f, c.prof
    stored = [
        i for i, m in enumerate(f.meta) if isinstance(m.get("metadata", {}).get("messages"), list)
    ]
    if not stored:
        return _skip(
            "round_trip", "skipped: the dataset stores no source messages (metadata.messages)"
        )
    from eagle3kit.chat.render import RenderError

    renderer = prof.renderer
    assert renderer is not None
    bad = np.zeros(len(f), bool)
    scope = np.zeros(len(f), bool)
    scope[stored] = True
    # gpt-oss's template writes today's date into its system message: a prompt rendered on
    # another day differs from today's rendering there only, and that is no defect.
    dated = "strftime_now" in str(renderer.template or renderer.tokenizer.chat_template or "")
    other_day = 0
    rendered: list[tuple[int, str]] = []
    for i in stored:
        meta = f.meta[i]["metadata"]
        try:
            rendered.append((i, renderer.render_text(meta["messages"], meta.get("tools"))))
        except RenderError:
            bad[i] = True
    for i, ids in _encode_all(renderer, rendered):
        view = ds.token_view(i)
        prompt = view.input_ids[: view.prompt_len]
        bad[i] = view.prompt_len != len(ids) or not np.array_equal(prompt, ids)
        decodable = prompt.max(initial=0) < prof.vocab_size
        if (
            bad[i]
            and dated
            and decodable
            and (
                DATE.sub("", renderer.decode(prompt.tolist())) == DATE.sub("", renderer.decode(ids))
            )
        ):
            bad[i] = False
            other_day += 1
    detail = "prompt ids equal the template's rendering of the stored messages"
    if other_day:
        detail += f" ({other_day:,} rendered on another day: the template writes the date)"
    return _result("round_trip", bad, scope, f.ids, detail)


def _encode_all(
    renderer: Renderer, texts: list[tuple[int, str]], batch: int = 256
) -> Iterator[tuple[int, list[int]]]:
    """`renderer.encode` over many texts, a batch per tokenizer call: one call per text
    costs more in Python overhead than the tokenizing itself."""
    for at in range(0, len(texts), batch):
        chunk = texts[at : at + batch]
        encoded = renderer.tokenizer([t for _, t in chunk], add_special_tokens=False)
        for (i, _), ids in zip(chunk, encoded["input_ids"], strict=True):
            yield i, list(ids)


@check("coverage", "training coverage")
def coverage(c: Context) -> CheckResult:
    f = c.f
    scope = (f.finish <= 1) & (f.comp_len > 0)
    no_loss = f.loss == 0
    total = int(f.loss.sum())
    res = _result("coverage", no_loss, scope, f.ids, "", {"no loss tokens": no_loss})
    res.detail = f"{total:,} loss tokens; {int(f.prompt_loss.sum()):,} of them on prompt positions"
    if total == 0:
        res.status = "fail"
    return res


@check("reconstructed", "exact token ids")
def reconstructed(c: Context) -> CheckResult:
    text_api = c.ds.recorded().text_api
    mask = c.f.reconstructed | text_api
    return _result(
        "reconstructed",
        mask,
        np.ones(len(c.f), bool),
        c.f.ids,
        "token ids as the server returned them, not rebuilt from text",
    )


@check("vocabulary", "ids in vocabulary", needs_tokenizer=True)
def vocabulary(c: Context) -> CheckResult:
    """Ids the tokenizer has no entry for: a server that answered garbage, or a dataset made
    with another tokenizer. gen flags them as violations; convert takes what the file says."""
    f = c.f
    assert f.oov is not None  # a tokenizer check: the tokenizer's figures exist
    res = _result(
        "vocabulary",
        f.oov > 0,
        np.ones(len(f), bool),
        f.ids,
        f"every id below the tokenizer's {c.prof.vocab_size:,} entries",
    )
    total = int(f.oov.sum())
    if total:
        res.reasons = {"ids outside the vocabulary": total}
    return res


@check("invariants", "server invariants")
def invariants(c: Context) -> CheckResult:
    """The answers gen stored or skipped while recording that they broke a server invariant
    (reference/SERVER_APIS.md §4: counts that disagree, ids out of range...)."""
    f = c.f
    res = _result(
        "invariants",
        f.violated,
        np.ones(len(f), bool),
        f.ids,
        "no answer recorded breaking the server invariants when it was generated",
    )
    top = sorted(f.violations.items(), key=lambda kv: -kv[1])
    res.reasons = dict(top[:EXAMPLES])
    return res


if tuple(REGISTRY) != CHECKS:  # a check registered here but not listed could never be run
    raise ImportError(f"validate's CHECKS {CHECKS} are not the registered checks {tuple(REGISTRY)}")

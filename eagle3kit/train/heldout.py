"""The held-out acceptance a trained drafter predicts (EAGLE3.md §4): per-position
conditional acceptance of chain drafts over the rounds chain decoding of the held-out
completions would make, per reasoning phase and per context depth, at temperature 0 or
(`Sampled`) at a temperature under a verification rule.

Three methods (EvalResult.prediction): "greedy" at temperature 0 (the target's argmax is the
verdict, the rounds walked along the data); "data-path" at a temperature the data were
sampled at, under a rule that keeps a draft exactly when the target's sample equals it (the
data's tokens are the verdicts, the rounds walked as a decode walks them); "expected"
otherwise (each draft's chance to be kept, over every chain start)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

import eagle3kit.train.sharding as sharding
from eagle3kit._ranks import Ranks
from eagle3kit.model import Eagle3Drafter, TTTState
from eagle3kit.model.acceptance import predicted_acceptance_length
from eagle3kit.model.depth import DEPTH_EDGES
from eagle3kit.train.config import TrainConfig
from eagle3kit.train.rounds import chain_starts, decoding_rounds, round_buckets, start_phases
from eagle3kit.train.target import TargetBatch, TargetHead
from eagle3kit.train.ttt import shifted

if TYPE_CHECKING:
    from eagle3kit.train.feed import Feed


@dataclass
class EvalResult:
    """Chain acceptance as chain decoding counts it, by the method `prediction` names."""

    k: int
    per_position: list[float]
    """a_i: acceptance of draft position i given positions < i were accepted, over the
    rounds a chain decode of the held-out completions makes (decoding_rounds)."""
    accepted: list[int]
    tried: list[int]
    predicted_acceptance_length: float
    """1 + Σ_j Π_{i≤j} a_i."""
    chains: int
    """Verification rounds evaluated: the chain starts such a decode visits."""
    unobservable: float
    """Share of (chain, position) pairs left out: past the sample's end (or, at
    temperature 0, after data tokens that are not the target's greedy ones: its verdict there
    followed another token)."""
    temperature: float = 0.0
    prediction: str = "greedy"
    """How the figure was made: "greedy", "data-path" or "expected" (the module docstring)."""
    step: int | None = None
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(d.pop("extra"))
        return d


def conditional_counts(
    accept: torch.Tensor, observable: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(accepted, tried) per position from [N, k] matrices: position j is tried where
    it is observable and positions < j were all accepted, accepted where it is too. `accept`
    may hold chances instead of verdicts (the sampled prediction): the counts are then
    expected ones."""
    chance = accept.double()
    earlier = torch.cumprod(chance, dim=1)
    before = torch.cat([torch.ones_like(earlier[:, :1]), earlier[:, :-1]], dim=1)
    seen = observable.double()
    return (before * seen * chance).sum(0), (before * seen).sum(0)


@torch.no_grad()
def chain_verdicts(
    drafter: Eagle3Drafter, batch: TargetBatch, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, k] (accepted, observable) for every chain start of `batch`, in row-major order.

    A chain starts at position t when token t+1 carries loss (the drafter proposes after
    a verified completion token). Step 0 gets the data token t+1; step j > 0 gets the
    target's greedy token for t+1+j, which is what chain decoding feeds once the earlier
    drafts were accepted. Draft j (argmax, mapped through d2t) is accepted when it equals the
    target's greedy token after t+1+j. That verdict comes from the target's pass over the
    data, so it is only the decoding verdict where the data's tokens t+2..t+1+j are the
    greedy ones: elsewhere position j is unobservable and left out of a_j (with data
    generated at temperature 0 nothing is left out).
    """
    accepted, observable = position_verdicts(drafter, batch, k)
    start = chain_starts(batch)
    return accepted[start], observable[start]


@dataclass(frozen=True)
class Sampled:
    """The held-out prediction at a temperature: the chance each draft is kept under `rule`
    (eagle3kit.model.verification), from the target's distribution at `temperature` (its
    lm_head over the batch's normed states) and the drafter's; or, `along_data`, the
    verdicts read off data the target sampled at `temperature` (data_path_verdicts)."""

    rule: Any
    temperature: float
    lm_head: torch.Tensor
    """[V, H] the target's."""
    along_data: bool = False
    """The held-out completions were drawn from the target's whole distribution at
    `temperature` and the rule keeps a draft exactly when the target's sample equals it, so
    the prediction walks the data (the "data-path" method) instead of expecting."""

    @property
    def prediction(self) -> str:
        """The method's name, as EvalResult.prediction records it."""
        return "data-path" if self.along_data else "expected"

    @torch.no_grad()
    def keep(
        self, drafter: Eagle3Drafter, hidden: torch.Tensor, normed: torch.Tensor
    ) -> torch.Tensor:
        """[B, L] the expected acceptance of the drafts `hidden` [B, L, H'] proposes, where
        `normed` [B, L, H] are the target's states that predict the same tokens. Both
        distributions live on the draft vocabulary: the target's is normalised over the
        whole of its own first, and q is zero elsewhere, so nothing is lost."""
        from eagle3kit.model.verification import draft_probs

        ids = drafter.draft_to_target(
            torch.arange(drafter.config.draft_vocab_size, device=hidden.device)
        )
        b, length = hidden.shape[:2]
        rows = max(1, LOGIT_ROWS_BYTES // (4 * self.lm_head.shape[0] * max(b, 1)))
        out = []
        for i in range(0, length, rows):
            logits = (
                torch.matmul(normed[:, i : i + rows].to(self.lm_head.dtype), self.lm_head.T).float()
                / self.temperature
            )
            p = torch.exp(logits[..., ids] - torch.logsumexp(logits, -1, keepdim=True))
            q = draft_probs(drafter.logits(hidden[:, i : i + rows]), self.temperature)
            out.append(self.rule.expected(p, q))
        return torch.cat(out, dim=1) if out else hidden.new_zeros((b, 0))


LOGIT_ROWS_BYTES = 64 << 20
"""Largest [B, rows, V] fp32 block of target logits the sampled prediction makes at once."""


def unrolled(
    drafter: Eagle3Drafter, batch: TargetBatch, k: int, fed: torch.Tensor
) -> Iterator[torch.Tensor]:
    """The drafter's output [B, T-1, H'] at each of k training-time-test steps, at every
    position t: step 0 is fed data token t+1, step j > 0 token t+1+j of `fed` [B, T] (and
    the step before's output), as chain decoding feeds a chain whose earlier drafts were
    kept. The caller holds no_grad."""
    length = batch.ids.shape[1] - 1
    positions = torch.arange(length, device=batch.ids.device)[None].expand(batch.ids.shape[0], -1)
    state = TTTState()
    hidden = drafter.project(batch.aux[:, :length].to(drafter.fc.weight.dtype))
    for j in range(k):
        ids = shifted(batch.ids if j == 0 else fed, j, length)
        hidden = drafter.ttt_step(hidden, ids, positions + j, state)
        yield hidden


@torch.no_grad()
def position_verdicts(
    drafter: Eagle3Drafter, batch: TargetBatch, k: int, sampled: Sampled | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, T-1, k] (accepted, observable) at every position, chain start or not; with
    `sampled`, `accepted` is the chance the draft is kept (float) instead of a verdict."""
    length = batch.ids.shape[1] - 1
    positions = torch.arange(length, device=batch.ids.device)[None]
    greedy = torch.cat([batch.ids[:, :1], batch.argmax[:, :-1]], dim=1)  # greedy[j]: token j
    follows = batch.ids == greedy
    accepted, observable = [], []
    seen = torch.ones((batch.ids.shape[0], length), dtype=torch.bool, device=batch.ids.device)
    for j, hidden in enumerate(unrolled(drafter, batch, k, greedy)):
        if j > 0:
            seen = seen & shifted(follows, j, length, False)
        inside = positions + 1 + j < batch.lengths[:, None]
        observable.append(seen & inside)
        if sampled is not None:
            accepted.append(sampled.keep(drafter, hidden, shifted(batch.normed, j, length)))
            continue
        draft = drafter.draft_to_target(drafter.top_draft(hidden))
        accepted.append(draft == shifted(batch.argmax, j, length, -1))
    return torch.stack(accepted, -1), torch.stack(observable, -1)


@torch.no_grad()
def data_path_drafts(drafter: Eagle3Drafter, batch: TargetBatch, k: int) -> torch.Tensor:
    """[B, T-1, k] the target ids a chain started at each position t drafts when step j's
    input is data token t+1+j (and its hidden the step before's output): what a decode
    drafts there as long as the chain's earlier drafts equalled the data."""
    steps = unrolled(drafter, batch, k, batch.ids)
    return torch.stack([drafter.draft_to_target(drafter.top_draft(h)) for h in steps], -1)


def data_path_verdicts(
    drafter: Eagle3Drafter, batch: TargetBatch, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, T-1, k] (kept, observable) at every position, when the data are the target's
    own samples at the serving temperature and a draft is kept exactly when the target's
    sample equals it (vLLM's default `onehot`: argmax drafts).

    A decode whose target samples are the data's tokens keeps draft j of a round at t
    exactly when it equals data token t+2+j, and after the first miss the data's token is
    the target's replacement; so the verdicts are read off the data. The drafts are
    data_path_drafts': a chain only reaches step j when the earlier drafts equalled the
    data, so the data's tokens are what the decode fed. Observable where token t+2+j is a
    sampled one (carries loss); nothing else is left out.
    """
    drafts = data_path_drafts(drafter, batch, k)
    length = drafts.shape[1]
    kept = [drafts[..., j] == shifted(batch.ids, j + 1, length, -1) for j in range(k)]
    observable = [shifted(batch.loss_mask, j + 1, length, False) for j in range(k)]
    return torch.stack(kept, -1), torch.stack(observable, -1)


def round_verdicts(
    drafter: Eagle3Drafter, batch: TargetBatch, k: int, sampled: Sampled | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """([B, T-1, k] accepted, [B, T-1, k] observable, [B, T-1] the chain starts counted) by
    the method `sampled` asks for: walked rounds for "greedy" and "data-path", every chain
    start for "expected" (sampled decoding visits them at random)."""
    starts = chain_starts(batch)
    if sampled is None:
        accepted, observable = position_verdicts(drafter, batch, k)
    elif sampled.along_data:
        accepted, observable = data_path_verdicts(drafter, batch, k)
    else:
        accepted, observable = position_verdicts(drafter, batch, k, sampled)
        return accepted, observable, starts
    return accepted, observable, decoding_rounds(starts, accepted, observable)


def evaluate(
    drafter: Eagle3Drafter,
    batches,
    k: int = 3,
    reduce=None,
    markers: Any = None,
    depth_edges: Sequence[int] = DEPTH_EDGES,
    sampled: Sampled | None = None,
) -> EvalResult:
    """Per-position conditional acceptance and the predicted acceptance length of a chain
    of `k` drafts at temperature 0 over `batches` (TargetBatch), e.g. a held-out split,
    counted over the rounds chain decoding of those completions would make; the same per
    reasoning phase (with `markers`) and per context-depth bucket (`depth_edges`).

    With `sampled` (a temperature and a verification rule): the expected acceptance
    instead, each draft kept with the rule's chance and a chain going on with the product of
    its drafts' chances, over every chain start (sampled decoding visits them at random); or,
    with `sampled.along_data`, the rounds walked along data sampled at that temperature
    (data_path_verdicts).

    `reduce(tensor)` sums counts across processes (torch.distributed all_reduce) when
    the batches are spread over ranks.
    """
    was_training = drafter.training
    drafter.eval()
    accepted = torch.zeros(k, dtype=torch.float64)
    tried = torch.zeros(k, dtype=torch.float64)
    chains = torch.zeros(1, dtype=torch.float64)
    hidden_pairs = torch.zeros(1, dtype=torch.float64)
    from eagle3kit.chat.phases import PHASES

    by_phase = torch.zeros(len(PHASES), 2 * k + 1, dtype=torch.float64)
    """phase -> accepted per position, tried per position, chains."""
    by_depth = torch.zeros(len(depth_edges) + 1, 2 * k + 1, dtype=torch.float64)
    """depth bucket -> the same."""
    for batch in batches:
        every_acc, every_obs, rounds = round_verdicts(drafter, batch, k, sampled)
        acc, obs = every_acc[rounds], every_obs[rounds]
        a, t = conditional_counts(acc, obs)
        accepted += a.double().cpu()
        tried += t.double().cpu()
        chains += acc.shape[0]
        hidden_pairs += (~obs).sum().item()
        if markers is not None and markers.known:
            phase = start_phases(batch, markers, rounds)
            for p in range(len(PHASES)):
                mine = phase == p
                pa, pt = conditional_counts(acc[mine], obs[mine])
                by_phase[p] += torch.cat(
                    [pa.double().cpu(), pt.double().cpu(), mine.sum().double().cpu()[None]]
                )
        bucket = round_buckets(rounds, depth_edges)
        for b in bucket.unique().tolist():
            mine = bucket == b
            da, dt = conditional_counts(acc[mine], obs[mine])
            by_depth[b] += torch.cat(
                [da.double().cpu(), dt.double().cpu(), mine.sum().double().cpu()[None]]
            )
    drafter.train(was_training)
    totals = torch.cat(
        [accepted, tried, chains, hidden_pairs, by_phase.reshape(-1), by_depth.reshape(-1)]
    )
    if reduce is not None:
        reduce(totals)
    accepted, tried = totals[:k], totals[k : 2 * k]
    n = int(totals[2 * k].item())
    rates = [float(a / t) if t > 0 else 0.0 for a, t in zip(accepted, tried, strict=True)]
    extra: dict[str, Any] = {}
    phase_end = 2 * k + 2 + by_phase.numel()
    if markers is not None and markers.known:
        extra["phases"] = _phase_figures(totals[2 * k + 2 : phase_end].reshape(len(PHASES), -1), k)
    extra["depth_edges"] = list(depth_edges)
    extra["depths"] = _depth_figures(
        totals[phase_end:].reshape(len(depth_edges) + 1, -1), k, depth_edges
    )
    if sampled is not None:
        extra["verify"] = sampled.rule.name
    return EvalResult(
        k=k,
        per_position=[round(r, 6) for r in rates],
        accepted=[round(float(a)) for a in accepted],
        tried=[round(float(t)) for t in tried],
        predicted_acceptance_length=round(predicted_acceptance_length(rates), 6),
        chains=n,
        unobservable=round(float(totals[2 * k + 1].item()) / max(n * k, 1), 6),
        temperature=sampled.temperature if sampled is not None else 0.0,
        prediction=sampled.prediction if sampled is not None else "greedy",
        extra=extra,
    )


def _phase_figures(counts: torch.Tensor, k: int) -> dict:
    """phase -> chains, conditional per-position rates and the predicted acceptance length,
    for the phases that had chain starts."""
    from eagle3kit.chat.phases import PHASES

    out = {}
    for name, row in zip(PHASES, counts, strict=True):
        figures = _row_figures(row, k)
        if figures:
            out[name] = figures
    return out


def _depth_figures(counts: torch.Tensor, k: int, edges: Sequence[int]) -> dict:
    """depth bucket -> from, to (tokens) and _phase_figures' figures, for the buckets that
    had chain starts."""
    from eagle3kit.model.depth import bounds, labels

    out = {}
    for b, (name, row) in enumerate(zip(labels(edges), counts, strict=True)):
        figures = _row_figures(row, k)
        if figures:
            low, high = bounds(edges, b)
            out[name] = {"from": low, "to": high, **figures}
    return out


def _row_figures(row: torch.Tensor, k: int) -> dict | None:
    """chains, conditional per-position rates and the predicted acceptance length of one
    row of counts (accepted per position, tried per position, chains); None without chains."""
    chains = int(row[2 * k].item())
    if not chains:
        return None
    rates = [float(a / t) if t > 0 else 0.0 for a, t in zip(row[:k], row[k : 2 * k], strict=True)]
    return {
        "chains": chains,
        "per_position": [round(r, 6) for r in rates],
        "predicted_acceptance_length": round(predicted_acceptance_length(rates), 6),
    }


# A run's held-out evaluation ----------------------------------------------------------------
class HeldOut:
    """The held-out evaluation of a training run: this rank's share of the held-out split
    (`feed`) through the drafter, the counts summed over the ranks, at --eval-k, with
    --eval-temperature and --eval-verify, per reasoning phase where the target's tokenizer
    marks them."""

    def __init__(self, cfg: TrainConfig, ranks: Ranks, feed: Feed, head: TargetHead) -> None:
        self.cfg, self.ranks, self.feed, self.head = cfg, ranks, feed, head

    @cached_property
    def markers(self) -> Any:
        """The target tokenizer's think / tool-call markers (bench accept's), for the
        prediction per reasoning phase; None without a loadable tokenizer."""
        assert self.cfg.target is not None  # TrainConfig refuses a run without --target
        return markers_of(self.cfg.target, self.cfg.trust_remote_code)

    def evaluate(self, drafter: Eagle3Drafter, model: nn.Module, step: int) -> dict | None:
        """The evaluation after `step` (every rank takes part); None without a held-out
        split."""
        if not self.feed.pool.heldout:
            return None
        with sharding.gathered(model):
            result = evaluate(
                drafter,
                self.feed.heldout_batches(),
                self.cfg.eval_k,
                reduce=self.ranks.sum,
                markers=self.markers,
                sampled=self.sampled(),
            )
        result.step = step
        return result.to_dict()

    def sampled(self) -> Sampled | None:
        """--eval-temperature and --eval-verify, for the prediction at a temperature: walked
        along the data where a decode's verdicts can be read off it (Sampled.along_data)."""
        if self.cfg.eval_temperature == 0:
            return None
        from eagle3kit.model.verification import Rule

        rule = Rule(self.cfg.eval_verify)
        along = rule.keeps_matching_samples and self.drawn_at_eval_temperature
        return Sampled(rule, self.cfg.eval_temperature, self.head.lm_head, along)

    def conditions(self) -> dict:
        """How this run's evaluations predict, under EvalResult's keys: temperature, verify
        rule (None at temperature 0) and method (EvalResult.prediction)."""
        sampled = self.sampled()
        if sampled is None:
            return {"temperature": 0.0, "verify": None, "prediction": "greedy"}
        return {
            "temperature": float(sampled.temperature),
            "verify": sampled.rule.name,
            "prediction": sampled.prediction,
        }

    @cached_property
    def drawn_at_eval_temperature(self) -> bool:
        """Every held-out sample's dataset records that its completions were drawn from the
        target's whole distribution at --eval-temperature (format's Recorded.drawn_at), so a
        decode at that temperature samples them. A mix, or a dataset that does not say
        (made by another tool, an older extract), keeps the expected prediction."""
        used = {item.source for item in self.feed.pool.heldout}
        drawn = {self.feed.sources[s].dataset.recorded().drawn_at for s in used}
        return drawn == {self.cfg.eval_temperature}


def markers_of(target: Path, trust_remote_code: bool) -> Any:
    """The think / tool-call markers of `target`'s tokenizer; None without a loadable
    tokenizer or without markers."""
    from transformers import AutoTokenizer

    from eagle3kit.chat.phases import Markers

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(target), trust_remote_code=trust_remote_code)
    except Exception:  # a target without a tokenizer: the prediction goes without phases
        return None
    markers = Markers.of(tokenizer)
    return markers if markers.known else None

"""Speculative decoding with a transformers target and an EAGLE-3 drafter, batch size 1.

Everything here is torch and nothing else: no files, no terminal. `plain` is the target's own
decoding (one token per forward), the reference that speculation must reproduce; `speculate`
drafts a chain of k tokens per round, verifies them in one target forward and
keeps the longest accepted prefix plus the target's own next token.

Alignment (EAGLE3.md §2): the drafter's context at position s is the fused target state g_s
and the token at s+1, at position id s. So once the target has produced token n (from the
state at n-1), every position up to n-1 has both and can enter the drafter's cache; the
drafter's output at n-1 proposes token n+1, and each chain step feeds the previous step's
pre-norm output with the token just drafted, one position further on.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from eagle3kit.model.drafter import DraftCache, Eagle3Drafter
from eagle3kit.model.verification import Rule, draft_probs, target_probs

TOP_STORED = 8
"""Logits kept per plain-decoding step, to tell a near-tie from a real mismatch later."""


@dataclass
class Decoded:
    """One generation: the new tokens and how long it took."""

    tokens: list[int]
    """New tokens, cut after the first stop token and at max_new_tokens."""
    seconds: float
    rounds: list[int] = field(default_factory=list)
    """Accepted draft tokens of each verification round (speculation only)."""
    top_ids: list[list[int]] = field(default_factory=list)
    """Per step, the TOP_STORED highest-logit ids (plain decoding only)."""
    top_logits: list[list[float]] = field(default_factory=list)


class Target:
    """A transformers causal LM that also returns the drafter's auxiliary states.

    `layer_ids` are boundary ids: id k is HF `hidden_states[k]`, the state entering decoder
    layer k. HF's `hidden_states[N]` is after the final norm, but id N means the last layer's
    output before it (EAGLE3.md §1.1), so that one is taken with a hook.
    """

    def __init__(self, model: Any, layer_ids: Sequence[int] = ()) -> None:
        self.model = model
        self.layer_ids = list(layer_ids)
        self.num_layers = int(model.config.num_hidden_layers)
        params = inspect.signature(model.forward).parameters
        # transformers 5 renamed past_key_values to cache.
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._last: torch.Tensor | None = None
        if self.num_layers in self.layer_ids:
            self._decoder_layers()[-1].register_forward_hook(self._keep_last)

    def _decoder_layers(self) -> Any:
        base = getattr(self.model, "model", self.model)
        return base.layers

    def _keep_last(self, module: Any, args: Any, output: Any) -> None:
        self._last = output[0] if isinstance(output, tuple) else output

    def new_cache(self) -> Any:
        from transformers import DynamicCache

        try:
            return DynamicCache(config=self.model.config)
        except TypeError:  # transformers 4.x takes no config
            return DynamicCache()

    @staticmethod
    def crop(cache: Any, length: int) -> None:
        """Keep the first `length` positions (a negative count works in transformers 4 and 5)."""
        extra = cache.get_seq_length() - length
        if extra > 0:
            cache.crop(-extra)

    @torch.no_grad()
    def forward(
        self, ids: Sequence[int], cache: Any, *, aux: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits [T, V] (float32) for `ids` appended to `cache`, and the aux states [T, 3H]."""
        logits, states = self.forward_rows([list(ids)], cache, aux=aux)
        return logits[0], None if states is None else states[0]

    @torch.no_grad()
    def forward_rows(
        self, rows: list[list[int]], cache: Any, *, aux: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`forward` for B rows of equal length, each appended to its own copy of the
        cache (which holds B copies): logits [B, T, V] and aux states [B, T, 3H]."""
        device = self.model.device
        kwargs: dict[str, Any] = {
            self._cache_arg: cache,
            "use_cache": True,
            "output_hidden_states": aux,
        }
        out = self.model(torch.tensor(rows, device=device), **kwargs)
        logits = out.logits.float()
        if not aux:
            return logits, None
        # (cast: the hook set _last during this forward, as num_layers is among the ids)
        states = [
            cast(torch.Tensor, self._last) if k == self.num_layers else out.hidden_states[k]
            for k in self.layer_ids
        ]
        return logits, torch.cat(states, dim=-1)


@dataclass
class Sampler:
    """Greedy at temperature 0; else sampling from the target's distribution as the server
    builds it (temperature, top-k, top-p) and verifying drafts by `rule`
    (eagle3kit.model.verification)."""

    temperature: float = 0.0
    generator: torch.Generator | None = None
    rule: Rule = field(default_factory=Rule)
    top_k: int = -1
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """p: the target's sampling distribution."""
        return target_probs(logits, self.temperature, self.top_k, self.top_p)

    def draft_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """q: the drafter's distribution (temperature only, as the engines draft)."""
        return draft_probs(logits, self.temperature)

    def pick(self, logits: torch.Tensor) -> int:
        if self.greedy:
            return int(logits.argmax())
        return self.draw(self.probs(logits))

    def draw(self, probs: torch.Tensor) -> int:
        return int(torch.multinomial(probs.cpu(), 1, generator=self.generator))

    def uniform(self) -> float:
        return float(torch.rand((), generator=self.generator))


def _finished(tokens: list[int], max_new: int, stops: set[int]) -> bool:
    return len(tokens) >= max_new or (bool(tokens) and tokens[-1] in stops)


def _cut(tokens: list[int], max_new: int, stops: set[int]) -> list[int]:
    """Up to and including the first stop token, at most max_new tokens."""
    for i, tok in enumerate(tokens[:max_new]):
        if tok in stops:
            return tokens[: i + 1]
    return tokens[:max_new]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plain(
    target: Target, prompt: Sequence[int], max_new: int, stops: set[int], sampler: Sampler
) -> Decoded:
    """The target alone, one token per forward, through its KV cache."""
    device = target.model.device
    _sync(device)
    start = time.perf_counter()
    cache = target.new_cache()
    logits, _ = target.forward(prompt, cache)
    tokens: list[int] = []
    top_ids: list[list[int]] = []
    top_logits: list[list[float]] = []
    while True:
        last = logits[-1]
        top = torch.topk(last, min(TOP_STORED, last.shape[-1]))
        top_ids.append(top.indices.tolist())
        top_logits.append(top.values.tolist())
        tokens.append(sampler.pick(last))
        if _finished(tokens, max_new, stops):
            break
        logits, _ = target.forward(tokens[-1:], cache)
    _sync(device)
    return Decoded(tokens, time.perf_counter() - start, top_ids=top_ids, top_logits=top_logits)


@dataclass
class DraftTree:
    """Drafted tokens as a tree, level by level: node i is target id `tokens[i]`, a child of
    node `parents[i]` (-1: of the newest committed token)."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)

    def ancestors(self, node: int) -> list[int]:
        """The nodes from the top of the tree down to `node`, itself included."""
        line = []
        while node >= 0:
            line.append(node)
            node = self.parents[node]
        return line[::-1]

    def branches(self) -> list[list[int]]:
        """The token ids along every path from the top to a leaf."""
        inner = set(self.parents)
        return [
            [self.tokens[n] for n in self.ancestors(leaf)]
            for leaf in range(len(self.tokens))
            if leaf not in inner
        ]


class Drafting:
    """The drafter's side of one generation: its cache, and the context not yet fed to it."""

    def __init__(self, drafter: Eagle3Drafter, sampler: Sampler) -> None:
        self.drafter = drafter
        self.sampler = sampler
        self.cache = DraftCache()
        self.device = drafter.lm_head.weight.device
        self.dtype = drafter.lm_head.weight.dtype
        self._aux: torch.Tensor | None = None
        self._tokens: list[int] = []

    def extend(self, aux: torch.Tensor, next_tokens: list[int]) -> None:
        """Queue context: aux states of positions len(cache).. and the token after each."""
        self._aux, self._tokens = aux, next_tokens

    def _ids(self, ids: Sequence[int]) -> torch.Tensor:
        return torch.tensor([list(ids)], device=self.device)

    def _positions(self, start: int, count: int) -> torch.Tensor:
        return torch.arange(start, start + count, device=self.device)[None]

    @torch.no_grad()
    def context(self) -> torch.Tensor:
        """Feed the queued context; the drafter's output at its last position [1, 1, H]."""
        assert self._aux is not None
        g = self.drafter.project(self._aux.to(self.device, self.dtype)[None])
        start = len(self.cache)
        out = self.drafter.decode(
            g, self._ids(self._tokens), self._positions(start, len(self._tokens)), self.cache
        )
        return out[:, -1:]

    @torch.no_grad()
    def chain(self, k: int) -> tuple[list[int], list[torch.Tensor | None]]:
        """k drafted target ids, and the draft distribution over the target vocabulary each
        was drawn from where the rule samples drafts (None for an argmax draft)."""
        hidden = self.context()
        context_len = len(self.cache)
        drafts: list[int] = []
        dists: list[torch.Tensor | None] = []
        for i in range(k):
            logits = self.drafter.logits(hidden)[0, -1].float()
            if self.sampler.greedy or not self.sampler.rule.samples_drafts:
                draft_id, dist = int(logits.argmax()), None
            else:
                probs = self.sampler.draft_probs(logits)
                draft_id = self.sampler.draw(probs)
                dist = self._on_target_vocab(probs)
            drafts.append(self._target_id(draft_id))
            dists.append(dist)
            if i < k - 1:  # the last draft is never fed: its successor is not needed
                hidden = self.drafter.decode(
                    hidden, self._ids(drafts[-1:]), self._positions(context_len + i, 1), self.cache
                )
        return drafts, dists

    @torch.no_grad()
    def tree(self, topk: int, depth: int) -> DraftTree:
        """A beam of drafts, like SGLang's EAGLE tree (`--speculative-eagle-topk`, `-num-steps`):
        the `topk` likeliest next tokens, then at each further level the `topk` likeliest of
        their children by summed log-probability, `topk` x `depth` nodes in all. One
        drafter pass per level; each node sees the context and its own ancestors only."""
        hidden = self.context()
        context_len = len(self.cache)
        tree = DraftTree()
        scores: list[float] = []
        frontier: list[int] = []
        inputs = hidden  # the hidden state each frontier node is fed with: its parent's output
        logp = torch.log_softmax(self.drafter.logits(hidden)[0].float(), dim=-1)  # [1, Vd]
        parent_of_row = [-1]
        in_cache: list[int] = []  # the tree node at each cached position past the context
        for level in range(depth):
            totals = (
                logp
                + torch.tensor(
                    [scores[n] if n >= 0 else 0.0 for n in parent_of_row], device=logp.device
                )[:, None]
            )
            best = torch.topk(totals.flatten(), min(topk, totals.numel()))
            frontier, rows = [], []
            for flat, score in zip(best.indices.tolist(), best.values.tolist(), strict=True):
                row, draft_id = divmod(flat, logp.shape[1])
                tree.tokens.append(self._target_id(draft_id))
                tree.parents.append(parent_of_row[row])
                scores.append(score)
                frontier.append(len(tree.tokens) - 1)
                rows.append(row)
            if level == depth - 1:  # the deepest nodes are never fed: no children needed
                break
            fed = inputs[:, rows]
            mask = self._tree_mask(tree, frontier, in_cache, context_len)
            out = self.drafter.decode(
                fed,
                self._ids([tree.tokens[n] for n in frontier]),
                torch.full((1, len(frontier)), context_len + level, device=self.device),
                self.cache,
                mask,
            )
            in_cache += frontier
            logp = torch.log_softmax(self.drafter.logits(out)[0].float(), dim=-1)
            inputs, parent_of_row = out, frontier
        return tree

    def _target_id(self, draft_id: int) -> int:
        return int(self.drafter.draft_to_target(torch.tensor(draft_id, device=self.device)))

    def _tree_mask(
        self, tree: DraftTree, new: list[int], in_cache: list[int], context_len: int
    ) -> torch.Tensor:
        """[new, cache + new]: the context, each new node's ancestors among the cached tree
        nodes, and itself."""
        mask = torch.zeros(
            len(new), context_len + len(in_cache) + len(new), dtype=torch.bool, device=self.device
        )
        mask[:, :context_len] = True
        where = {node: context_len + i for i, node in enumerate(in_cache)}
        for row, node in enumerate(new):
            for ancestor in tree.ancestors(tree.parents[node]):
                mask[row, where[ancestor]] = True
            mask[row, context_len + len(in_cache) + row] = True
        return mask

    def _on_target_vocab(self, probs: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary probabilities scattered onto target ids (zero elsewhere)."""
        target_ids = self.drafter.draft_to_target(torch.arange(len(probs), device=self.device))
        full = torch.zeros(self.drafter.config.vocab_size, device=self.device)
        return full.scatter(0, target_ids, probs.float())

    def rollback(self, context_len: int) -> None:
        self.cache.crop(context_len)


def verify_greedy(logits: torch.Tensor, drafts: list[int]) -> tuple[int, int]:
    """(accepted drafts, the target's own next token): the longest prefix of drafts that
    equals the target's argmax at each position, then the argmax after it."""
    choice = logits.argmax(-1).tolist()
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == choice[accepted]:
        accepted += 1
    return accepted, choice[accepted]


def verify_sampled(
    logits: torch.Tensor, drafts: list[int], dists: list[torch.Tensor | None], sampler: Sampler
) -> tuple[int, int]:
    """Verification at temperature > 0 by the sampler's rule: draft i is kept with the rule's
    probability (p(x) for an argmax draft, min(1, p(x)/q(x)) for one drawn from q); at the
    first rejection the token is drawn from the rule's residual, and after k acceptances
    from p itself. With onehot and probabilistic the output is distributed exactly as p."""
    rule = sampler.rule
    for i, (draft, q) in enumerate(zip(drafts, dists, strict=True)):
        p = sampler.probs(logits[i])
        if sampler.uniform() < rule.keep_probability(p, q, draft):
            continue
        return i, sampler.draw(rule.residual(p, q, draft))
    return len(drafts), sampler.draw(sampler.probs(logits[len(drafts)]))


def verify_tree(
    target: Target, cache: Any, newest: int, tree: DraftTree
) -> tuple[list[int], torch.Tensor]:
    """Greedy verification of a drafted tree in one target forward, its branches as a batch:
    the accepted drafts of the branch that keeps most, then the target's own next token;
    and the aux states of those positions. `cache` is left holding that branch alone."""
    rows = [[newest, *branch] for branch in tree.branches()]
    width = max(len(r) for r in rows)
    cache.batch_repeat_interleave(len(rows))
    logits, aux = target.forward_rows(
        [r + [r[-1]] * (width - len(r)) for r in rows], cache, aux=True
    )
    assert aux is not None
    verdicts = [verify_greedy(logits[b, : len(r)], r[1:]) for b, r in enumerate(rows)]
    best = max(range(len(rows)), key=lambda b: verdicts[b][0])  # the first of the longest
    accepted, bonus = verdicts[best]
    cache.batch_select_indices(torch.tensor([best], device=logits.device))
    return [*rows[best][1 : accepted + 1], bonus], aux[best, : accepted + 1]


def verify_chain(
    target: Target, cache: Any, newest: int, drafting: Drafting, k: int, sampler: Sampler
) -> tuple[list[int], torch.Tensor]:
    """A chain of k drafts checked in one target forward: the accepted drafts, then the
    target's own next token; and the aux states of those positions."""
    drafts, dists = drafting.chain(k)
    logits, aux = target.forward([newest, *drafts], cache, aux=True)
    assert aux is not None
    if sampler.greedy:
        accepted, bonus = verify_greedy(logits, drafts)
    else:
        accepted, bonus = verify_sampled(logits, drafts, dists, sampler)
    return [*drafts[:accepted], bonus], aux[: accepted + 1]


def speculate(
    target: Target,
    drafter: Eagle3Drafter,
    prompt: Sequence[int],
    max_new: int,
    stops: set[int],
    sampler: Sampler,
    k: int,
    tree: tuple[int, int] | None = None,
) -> Decoded:
    """EAGLE-3 with a chain of k drafts per round, or with `tree` (top-k, depth) a tree of
    them (greedy only), each round verified by one target forward."""
    if tree is not None and not sampler.greedy:
        raise ValueError("a drafted tree is verified greedily: sample with a chain")
    device = target.model.device
    _sync(device)
    start = time.perf_counter()
    cache = target.new_cache()
    logits, aux = target.forward(prompt, cache, aux=True)
    assert aux is not None
    tokens = [sampler.pick(logits[-1])]
    drafting = Drafting(drafter, sampler)
    drafting.extend(aux, [*prompt[1:], tokens[0]])
    rounds: list[int] = []
    while not _finished(tokens, max_new, stops):
        # The target's cache holds every committed token but the newest one, which goes first.
        committed = cache.get_seq_length()
        if tree is None:
            new, aux = verify_chain(target, cache, tokens[-1], drafting, k, sampler)
        else:
            new, aux = verify_tree(target, cache, tokens[-1], drafting.tree(*tree))
        rounds.append(len(new) - 1)
        target.crop(cache, committed + len(new))
        drafting.rollback(committed)
        drafting.extend(aux, new)
        tokens.extend(new)
        if stops.intersection(new):  # a stop among the accepted drafts ends it too
            break
    _sync(device)
    return Decoded(_cut(tokens, max_new, stops), time.perf_counter() - start, rounds=rounds)

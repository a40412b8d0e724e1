"""bench accept: real EAGLE-3 speculative decoding on tiny fp32 models.

The pair: a random 8-layer Llama target with the stdlib tokenizer and chat template, and
drafters for it: one fitted here for a few seconds on the target's own greedy continuations
(it accepts often, so rounds end at every position and both caches roll back partially), a
random one with a reduced draft vocabulary (acceptance near 1), and two wrappers whose
proposals are the target's own next tokens (the oracle) or never are.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from bench_fit import DATA, fit_drafter, greedy_sequences, subset
from small_pair import build_small_pair
from typer.testing import CliRunner

from eagle3kit.bench import accept, decode
from eagle3kit.bench.stats import Acceptance, percentile, predicted_length
from eagle3kit.checkpoints.native import save_drafter
from eagle3kit.cli import app
from eagle3kit.errors import UserError
from eagle3kit.model import DrafterConfig, Eagle3Drafter, build_vocab

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPT_SETS = [
    *sorted((DATA / "eagle").glob("*/question.jsonl")),
    DATA / "fastchat" / "vicuna_bench" / "question.jsonl",
]
FULL_SETS = [
    DATA / "eagle" / "mt_bench" / "question.jsonl",
    DATA / "eagle" / "qa" / "question.jsonl",
    *sorted((DATA / "eagle_full").glob("*/question.jsonl")),
    DATA / "fastchat" / "vicuna_bench" / "question.jsonl",
]
"""Every prompt of EAGLE's six sets (tests/data/prompts/SOURCES.md) and FastChat's Vicuna set."""
EVAL = {
    "k": 3,
    "temperature": 0.0,
    "predicted_acceptance_length": 2.5,
    "per_position": [0.8, 0.6, 0.5],
}


# Fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from transformers import AutoConfig, AutoModelForCausalLM

    from eagle3kit.tiny import make_target, make_tokenizer, stdlib_docstrings

    root = tmp_path_factory.mktemp("bench")
    make_tokenizer(root / "tok", corpus=stdlib_docstrings(100_000))
    # Heads of 16 (not tiny's servable 32): this random target's greedy text is the one the
    # fitted drafter's thresholds below were set on; vLLM never serves it.
    target = make_target(root / "target", root / "tok", seed=3, head_dim=16)
    config = AutoConfig.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target).eval()

    # A random drafter with a reduced draft vocabulary: d2t offsets are not all zero.
    torch.manual_seed(1)
    counts = np.random.default_rng(0).integers(0, 100, config.vocab_size)
    vocab = build_vocab(counts, 600)
    rand = Eagle3Drafter(DrafterConfig.from_target(config, draft_vocab_size=600))
    rand.set_vocab(torch.from_numpy(vocab.d2t), torch.from_numpy(vocab.t2d))
    save_drafter(rand, root / "random")

    # A fitted drafter, on the target's greedy continuations of a few prompts.
    sequences = greedy_sequences(model, target, 4, 32)
    torch.manual_seed(2)
    fitted = Eagle3Drafter(DrafterConfig.from_target(config))
    fitted.load_target_embedding(model.get_input_embeddings().weight)
    fit_drafter(model, fitted, sequences, steps=80)
    save_drafter(fitted, root / "fitted", extra={"eval": EVAL})
    prompts = subset(root / "subset.jsonl", PROMPT_SETS)
    return {
        "root": root,
        "target": target,
        "model": model,
        "random": root / "random",
        "fitted": root / "fitted",
        "prompts": prompts,
        "sequences": sequences,
    }


def bench(pair, drafter: str = "fitted", prompts: list[Path] | None = None, **options):
    options.setdefault("max_new_tokens", 10)
    options.setdefault("output", accept._ui.OutputOptions(quiet=True))
    cfg = accept.AcceptConfig(
        pair["target"], pair[drafter], prompts or [pair["prompts"]], device="cpu", **options
    )
    return accept.run(cfg)


# Greedy losslessness ------------------------------------------------------------------------
def test_fitted_drafter_is_lossless_and_accepts(pair):
    report = bench(pair)
    assert report.lossless is True and report.mismatches == 0
    assert len(report.prompts) == len(PROMPT_SETS) + 1  # MT-bench's second turn
    assert report.acceptance_length > 1.5
    rounds = [a for p in report.prompts for a in p.rounds]
    # Rounds end at every position: partial acceptance rolls both caches back partially.
    assert {0, 1, 2, 3} <= set(rounds) or len(set(rounds)) >= 3
    assert report.acceptance_length == pytest.approx(1 + sum(rounds) / len(rounds))
    assert report.per_position[0] >= report.per_position[1] >= report.per_position[2]
    assert report.predicted_acceptance_length == 2.5
    assert set(report.categories) >= {"writing", "subset"}
    for p in report.prompts:
        assert p.status in ("identical", "near-tie")
        assert 1 <= p.tokens <= 10
    # By reasoning phase: the tiny template opens <think> in the prompt, so rounds start in
    # the reasoning (the untrained target seldom closes it within 10 tokens).
    assert "think" in report.phases
    assert sum(f["rounds"] for f in report.phases.values()) == report.rounds
    assert all(len(p.phases) == len(p.rounds) for p in report.prompts)
    think = [
        a for p in report.prompts for ph, a in zip(p.phases, p.rounds, strict=True) if ph == "think"
    ]
    assert report.phases["think"]["acceptance_length"] == pytest.approx(1 + sum(think) / len(think))


def test_a_variant_drafter_benches_alike_from_its_checkpoint_and_its_export(pair, tmp_path):
    """A drafter of speculators' layout (norm_before_fc, norm_before_residual, norm_output)
    with two decoder layers, fitted like the plain one: bench accept measures it lossless and
    above 1, and the same from eagle3kit's checkpoint and from its vLLM export."""
    from transformers import AutoConfig

    from eagle3kit.export import ExportConfig
    from eagle3kit.export import run as export
    from eagle3kit.model import VARIANTS

    config = DrafterConfig.from_target(AutoConfig.from_pretrained(pair["target"]))
    for name, value in {**VARIANTS["speculators"], "num_hidden_layers": 2}.items():
        setattr(config, name, value)
    torch.manual_seed(2)
    drafter = Eagle3Drafter(config)
    drafter.load_target_embedding(pair["model"].get_input_embeddings().weight)
    fit_drafter(pair["model"], drafter, pair["sequences"], steps=80)
    save_drafter(drafter, tmp_path / "variant")
    export(
        ExportConfig(
            tmp_path / "variant",
            tmp_path / "export",
            dtype="fp32",
            target=pair["target"],
            verifier=str(pair["target"]),
            output=accept._ui.OutputOptions(quiet=True),
        )
    )
    reports = [bench({**pair, "v": tmp_path / where}, "v") for where in ("variant", "export")]
    for report in reports:
        assert report.lossless is True and report.mismatches == 0
        assert report.acceptance_length > 1.2
    assert reports[0].per_position == reports[1].per_position
    assert reports[0].acceptance_length == reports[1].acceptance_length


def test_random_drafter_accepts_nothing_and_output_is_identical(pair):
    report = bench(pair, "random")
    assert report.lossless is True
    assert report.acceptance_length < 1.1
    assert any("configuration error" in w for w in report.warnings)
    assert all(p.status in ("identical", "near-tie") for p in report.prompts)


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["fitted", "random"])
def test_every_prompt_of_every_set_is_lossless(pair, drafter):
    """Every prompt of the EAGLE sets and of FastChat's MT-bench and Vicuna sets, MT-bench's
    second turns included."""
    report = bench(pair, drafter, FULL_SETS, max_new_tokens=6)
    assert report.lossless is True, [p for p in report.prompts if p.status == "mismatch"]
    from eagle3kit.bench.prompts import load
    from eagle3kit.chat.conversation import generation_points

    turns = sum(len(generation_points(c)) for c in load(FULL_SETS))
    assert len(report.prompts) == turns >= 600


def test_a_broken_verifier_is_caught(pair, monkeypatch):
    """Accepting every draft makes the output differ from the target's own: exit 1."""
    monkeypatch.setattr(
        decode, "verify_greedy", lambda logits, drafts: (len(drafts), int(logits[-1].argmax()))
    )
    report = bench(pair, "random", max_samples=2)
    assert report.lossless is False and report.mismatches >= 1
    assert report.exit_code == 1


def test_near_ties_are_told_from_mismatches():
    plain = decode.Decoded(
        [5, 6, 7],
        0.0,
        top_ids=[[5, 9], [6, 8], [7, 1]],
        top_logits=[[3.0, 1.0], [2.0, 2.0 - 1e-5], [1.0, 0.0]],
    )
    assert accept.compare([5, 6, 7], plain, 1e-3) == ("identical", None, None)
    status, where, margin = accept.compare([5, 8, 1], plain, 1e-3)
    assert (status, where) == ("near-tie", 1) and margin == pytest.approx(1e-5)
    assert accept.compare([9, 6], plain, 1e-3)[:2] == ("mismatch", 0)
    assert accept.compare([5, 6, 7], plain, 1e-3) != accept.compare([5, 6, 7, 2], plain, 1e-3)


# Oracle and never drafters: the measurement itself ------------------------------------------
class ProposalDrafter(Eagle3Drafter):
    """A real drafter (its cache, positions and rollbacks run as usual) whose proposals are
    the target's own greedy continuation (`offset` 0), or never are (`offset` 1)."""

    def __init__(self, base: Eagle3Drafter, reference: list[int], offset: int = 0) -> None:
        super().__init__(base.config)
        self.load_state_dict(base.state_dict())
        self.reference, self.offset = reference, offset
        self.position = -1

    def decode(self, hidden, input_ids, positions, cache, mask=None):
        self.position = int(positions[0, -1])
        return super().decode(hidden, input_ids, positions, cache, mask)

    def logits(self, hidden):
        # The output at position s proposes token s + 2 (position s pairs with token s + 1).
        wanted = self.reference[self.position + 2] + self.offset
        out = torch.full((*hidden.shape[:-1], self.config.draft_vocab_size), -1e4)
        out[..., wanted % self.config.draft_vocab_size] = 1e4
        return out


@pytest.mark.parametrize("k", [1, 3, 5])
def test_oracle_measures_k_plus_one_and_never_measures_one(pair, k):
    from eagle3kit.bench.prompts import load, load_renderer, turns

    model = pair["model"]
    base = Eagle3Drafter(DrafterConfig.from_target(model.config)).eval()
    base.load_target_embedding(model.get_input_embeddings().weight)
    target = decode.Target(model, base.config.aux_layer_ids)
    renderer = load_renderer(pair["target"], "--target")
    stops = set(renderer.stop_token_ids)
    oracle, never = Acceptance(k), Acceptance(k)
    for conv in load([DATA / "eagle/gsm8k/question.jsonl"], max_samples=2):
        for _, _, ids in turns(renderer, conv, 1):
            # The reference runs past any stop token, so the proposals never run out.
            ref = ids + decode.plain(target, ids, 12 + k + 2, set(), decode.Sampler()).tokens
            plain = decode.plain(target, ids, 12, stops, decode.Sampler()).tokens
            for offset, acc in ((0, oracle), (1, never)):
                out = decode.speculate(
                    target, ProposalDrafter(base, ref, offset), ids, 12, stops, decode.Sampler(), k
                )
                assert out.tokens == plain
                acc.add_all(out.rounds)
    assert oracle.length == k + 1 and oracle.per_position == [1.0] * k
    assert oracle.conditional == [1.0] * k
    assert never.length == 1 and never.per_position == [0.0] * k


def test_a_stop_accepted_inside_a_round_ends_the_generation(pair):
    """Rounds after an accepted stop token would inflate the acceptance length."""
    from eagle3kit.bench.prompts import load, load_renderer, turns

    model, k = pair["model"], 3
    base = Eagle3Drafter(DrafterConfig.from_target(model.config)).eval()
    base.load_target_embedding(model.get_input_embeddings().weight)
    target = decode.Target(model, base.config.aux_layer_ids)
    renderer = load_renderer(pair["target"], "--target")
    conv = load([DATA / "eagle/gsm8k/question.jsonl"], max_samples=1)[0]
    _, _, ids = next(iter(turns(renderer, conv, 1)))
    free = decode.plain(target, ids, 40, set(), decode.Sampler()).tokens
    # A token first produced at index 5: the first token comes from the prefill, each round
    # adds k + 1 = 4, so it falls inside the second round.
    stop = next(t for i, t in enumerate(free) if i >= 5 and t not in free[:i])
    at = free.index(stop)
    ref = ids + free
    out = decode.speculate(target, ProposalDrafter(base, ref), ids, 40, {stop}, decode.Sampler(), k)
    assert out.tokens == free[: at + 1]
    assert len(out.rounds) == -(-at // (k + 1))  # rounds up to the stop, none after


# Temperature > 0 ----------------------------------------------------------------------------
def chi_square_p(counts: np.ndarray, probs: np.ndarray) -> float:
    """p-value of Pearson's chi-square test of counts against probs (bins with p > 0)."""
    keep = probs > 0
    assert counts[~keep].sum() == 0, "a token of probability 0 was drawn"
    expected = probs[keep] * counts.sum()
    stat = float(((counts[keep] - expected) ** 2 / expected).sum())
    df = int(keep.sum()) - 1
    return float(
        torch.special.gammaincc(
            torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)
        )
    )


# Tree drafting --------------------------------------------------------------------------------
def _context(pair):
    """A prompt's aux states and next tokens, queued on a fresh Drafting of the fitted drafter."""
    from eagle3kit.checkpoints.native import load_drafter

    model = pair["model"]
    drafter = load_drafter(pair["fitted"], model.get_input_embeddings().weight.detach()).eval()
    target = decode.Target(model, drafter.config.aux_layer_ids)
    prompt = list(range(5, 25))
    logits, aux = target.forward(prompt, target.new_cache(), aux=True)
    first = int(logits[-1].argmax())
    drafting = decode.Drafting(drafter, decode.Sampler())
    drafting.extend(aux, [*prompt[1:], first])
    return drafter, drafting, (aux, [*prompt[1:], first])


def _path_logprobs(drafter, queued, path: list[int]) -> torch.Tensor:
    """The drafter's next-token log-probabilities after `path`, fed as a plain chain."""
    drafting = decode.Drafting(drafter, decode.Sampler())
    drafting.extend(*queued)
    with torch.no_grad():
        hidden = drafting.context()
        start = len(drafting.cache)
        for i, token in enumerate(path):
            hidden = drafter.decode(
                hidden, torch.tensor([[token]]), torch.tensor([[start + i]]), drafting.cache
            )
        return torch.log_softmax(drafter.logits(hidden)[0, -1].float(), -1)


@pytest.mark.parametrize("topk,depth", [(2, 3), (3, 4)])
def test_the_drafted_tree_is_the_beam_its_chains_give(pair, topk, depth):
    """Rebuilt from chains (each path fed alone from the same context), the beam keeps the
    same nodes: every node saw its own ancestors and nothing of its cousins."""
    drafter, drafting, queued = _context(pair)
    tree = drafting.tree(topk, depth)
    assert len(tree.tokens) == topk * depth
    beam: list[tuple[float, list[int]]] = [(0.0, [])]
    want: list[tuple[tuple[int, ...], int]] = []
    for _ in range(depth):
        candidates = []
        for score, path in beam:
            logp = _path_logprobs(drafter, queued, path)
            top = torch.topk(logp, topk)
            for value, draft_id in zip(top.values.tolist(), top.indices.tolist(), strict=True):
                token = int(drafter.draft_to_target(torch.tensor(draft_id)))
                candidates.append((score + value, [*path, token]))
        beam = sorted(candidates, key=lambda c: -c[0])[:topk]
        want += [(tuple(path[:-1]), path[-1]) for _, path in beam]
    got = []
    for node in range(len(tree.tokens)):
        line = [tree.tokens[n] for n in tree.ancestors(node)]
        got.append((tuple(line[:-1]), line[-1]))
    assert sorted(got) == sorted(want)


def test_a_one_wide_tree_drafts_the_chain(pair):
    """Top-1 trees are chains: the same tokens, the same rounds as --k DEPTH."""
    chain = bench(pair, k=3, max_new_tokens=16, max_samples=3)
    tree = bench(pair, tree=(1, 3), max_new_tokens=16, max_samples=3)
    assert [r.rounds for r in tree.prompts] == [r.rounds for r in chain.prompts]
    assert tree.shape == "tree top-1 depth 3" and tree.k == 3


def test_a_tree_is_lossless_and_accepts_more_than_its_chain(pair):
    chain = bench(pair, k=4, max_new_tokens=24, max_samples=4)
    tree = bench(pair, tree=(4, 4), max_new_tokens=24, max_samples=4)
    assert tree.lossless is True and tree.mismatches == 0
    assert len(tree.per_position) == 4
    assert tree.acceptance_length > chain.acceptance_length
    assert any(max(r.rounds) == 4 for r in tree.prompts)  # whole branches are accepted


def test_a_tree_at_temperature_above_zero_is_refused(pair):
    with pytest.raises(UserError, match="--tree verifies greedily"):
        accept.AcceptConfig(
            pair["target"], pair["fitted"], [pair["prompts"]], tree=(2, 3), temperature=0.7
        )


def test_k_given_with_a_tree_is_refused_and_a_chain_drafts_three_by_default(pair):
    given = (pair["target"], pair["fitted"], [pair["prompts"]])
    with pytest.raises(UserError, match="--k and --tree exclude each other"):
        accept.AcceptConfig(*given, k=3, tree="2,3")
    assert accept.AcceptConfig(*given, tree="2,3").tree_shape == (2, 3)
    assert accept.AcceptConfig(*given).chain_k == 3
    assert accept.AcceptConfig(*given, k=5).chain_k == 5


def test_rejection_sampling_keeps_the_target_distribution():
    """One round, k = 2, fixed p and q: the first and second emitted tokens follow p."""
    p = torch.tensor(
        [[0.5, 0.3, 0.1, 0.1, 0.0], [0.1, 0.1, 0.2, 0.3, 0.3], [0.2, 0.2, 0.2, 0.2, 0.2]]
    )
    q = [torch.tensor([0.1, 0.2, 0.4, 0.2, 0.1]), torch.tensor([0.3, 0.3, 0.2, 0.1, 0.1])]
    logits = p.clamp_min(1e-30).log()
    gen = torch.Generator().manual_seed(0)
    sampler = decode.Sampler(1.0, gen)
    first, second, naive = np.zeros(5), np.zeros(5), np.zeros(5)
    for _ in range(3000):
        drafts = [sampler.draw(q[0]), sampler.draw(q[1])]
        naive[drafts[0]] += 1
        accepted, bonus = decode.verify_sampled(logits, drafts, q, sampler)
        out = [*drafts[:accepted], bonus]
        first[out[0]] += 1
        if accepted >= 1:  # the second token is p[1]-distributed given the first was a draft
            second[out[1]] += 1
    assert chi_square_p(first, p[0].numpy()) > 1e-3
    assert second.sum() > 300 and chi_square_p(second, p[1].numpy()) > 1e-3
    # The test can tell q from p: the drafts alone are not p-distributed.
    assert naive[4] > 0 and chi_square_p(naive[:4], (p[0, :4] / p[0, :4].sum()).numpy()) < 1e-6


def exact_marginals(model, prompt: list[int], steps: int, temperature: float) -> list[np.ndarray]:
    """P(token i of the output = x) for i < steps, by enumerating every prefix."""
    vocab = model.config.vocab_size
    prefixes, weights = [[]], torch.ones(1, dtype=torch.float64)
    marginals = []
    for _ in range(steps):
        ids = torch.tensor([prompt + p for p in prefixes])
        with torch.no_grad():
            logits = model(ids).logits[:, -1].double()
        probs = torch.softmax(logits / temperature, -1) * weights[:, None]
        marginals.append(probs.sum(0).numpy())
        prefixes = [[*p, x] for p in prefixes for x in range(vocab)]
        weights = probs.reshape(-1)
    return marginals


@pytest.fixture(scope="module")
def small_pair():
    """small_pair.py's target over 6 tokens and random drafter over 4 of them."""
    return build_small_pair()


def sample_outputs(
    model, drafter, prompt, runs: int, temperature: float, k: int = 2, new: int = 3
) -> np.ndarray:
    target = decode.Target(model, drafter.config.aux_layer_ids)
    outs, rounds = [], []
    for seed in range(runs):
        sampler = decode.Sampler(temperature, torch.Generator().manual_seed(seed))
        result = decode.speculate(target, drafter, prompt, new, set(), sampler, k)
        outs.append(result.tokens)
        rounds += result.rounds
    assert 0 < sum(rounds) < k * len(rounds)  # drafts are both kept and rejected
    return np.array(outs)


@pytest.mark.parametrize("temperature", [1.0, pytest.param(0.7, marks=pytest.mark.slow)])
def test_speculative_sampling_matches_the_target(small_pair, temperature):
    model, drafter = small_pair
    prompt = [1, 4, 2]
    marginals = exact_marginals(model, prompt, 3, temperature)
    outs = sample_outputs(model, drafter, prompt, 200, temperature)
    for i in (1, 2):  # token 0 comes from prefill; 1 and 2 from rejection sampling
        counts = np.bincount(outs[:, i], minlength=6).astype(float)
        assert chi_square_p(counts, marginals[i]) > 1e-3, (i, counts, marginals[i])


@pytest.mark.slow
def test_speculative_sampling_matches_the_target_jointly(small_pair):
    model, drafter = small_pair
    prompt = [3, 0]
    outs = sample_outputs(model, drafter, prompt, 3000, 1.0, k=3, new=3)
    marginals = exact_marginals(model, prompt, 3, 1.0)
    for i in range(3):
        counts = np.bincount(outs[:, i], minlength=6).astype(float)
        assert chi_square_p(counts, marginals[i]) > 1e-3


def test_sampled_bench_reports_no_losslessness(pair):
    report = bench(pair, temperature=0.8, max_samples=2)
    assert report.lossless is None and report.temperature == 0.8
    assert all(p.status == "sampled" for p in report.prompts)
    assert report.acceptance_length >= 1


# Figures ------------------------------------------------------------------------------------
def test_acceptance_figures():
    acc = Acceptance(3)
    acc.add_all([3, 1, 0, 2])
    assert acc.length == 2.5
    assert acc.per_position == [0.75, 0.5, 0.25]
    assert acc.conditional == [0.75, pytest.approx(2 / 3), 0.5]
    # τ = 1 + Σ p_n = 1 + Σ Π c_j
    assert acc.length == pytest.approx(1 + sum(acc.per_position))
    assert predicted_length(acc.conditional) == pytest.approx(acc.length)
    assert Acceptance(2).length is None
    assert percentile([1, 2, 3, 4], 50) == 2.5 and percentile([], 90) is None


# The command --------------------------------------------------------------------------------
def cli(*args: str):
    result = CliRunner().invoke(app, ["bench", *args])
    return result.exit_code, result.output


def accept_json(pair, *options: str) -> dict:
    """`bench accept --json` on two conversations of the fitted pair: the printed result."""
    code, out = cli(
        "accept",
        "--target",
        str(pair["target"]),
        "--drafter",
        str(pair["fitted"]),
        str(pair["prompts"]),
        "--max-samples",
        "2",
        "--max-new-tokens",
        "6",
        "--device",
        "cpu",
        "--json",
        *options,
    )
    assert code == 0, out
    return json.loads(out[out.index("{") : out.rindex("}") + 1])


def test_cli_json(pair):
    data = accept_json(pair, "--k", "2")
    for key in (
        "acceptance_length",
        "per_position",
        "k",
        "temperature",
        "lossless",
        "near_ties",
        "predicted_acceptance_length",
        "categories",
    ):
        assert key in data
    assert data["k"] == 2 and data["temperature"] == 0 and data["lossless"] is True
    assert len(data["per_position"]) == 2
    assert any("k=3" in w for w in data["warnings"])  # training predicted for another k


@pytest.mark.parametrize("rule", ["onehot", "probabilistic", "sglang"])
def test_cli_sampled_figures_carry_the_rule_and_their_interval(pair, rule):
    data = accept_json(pair, "--temperature", "0.8", "--verify", rule, "--top-k", "50")
    assert data["verify"] == rule and data["top_k"] == 50 and data["lossless"] is None
    interval = data["interval"]
    assert interval["rounds"] == data["rounds"] and interval["generations"] == 2
    assert interval["low"] <= data["acceptance_length"] <= interval["high"]
    greedy = accept_json(pair)
    assert greedy["interval"] is None and greedy["verify"] is None


def test_cli_tree(pair):
    data = accept_json(pair, "--tree", "2,3")
    assert data["shape"] == "tree top-2 depth 3" and data["k"] == 3 and data["lossless"]
    assert any("for a chain" in w for w in data["warnings"])
    code, out = cli(
        "accept",
        "--target",
        str(pair["target"]),
        "--drafter",
        str(pair["fitted"]),
        str(pair["prompts"]),
        "--tree",
        "2,3",
        "--temperature",
        "0.5",
    )
    assert code == 2 and "--tree verifies greedily" in out and "Traceback" not in out


def test_plot(pair, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    png = tmp_path / "al.png"
    bench(pair, max_samples=1, plot=png)
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_plot_without_matplotlib(pair, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(UserError, match=r"eagle3kit\[plot\]"):
        bench(pair, plot=tmp_path / "x.png")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "--target is required"),
        (["--target", "{target}"], "--drafter is required"),
        (
            ["--target", "{root}/nope", "--drafter", "{fitted}", "{prompts}"],
            "--target {root}/nope: no such model directory",
        ),
        (["--target", "{target}", "--drafter", "{root}", "{prompts}"], "--drafter {root}"),
        (
            ["--target", "{target}", "--drafter", "{fitted}", "{root}/none.jsonl"],
            "{root}/none.jsonl: no such prompt file",
        ),
        (
            ["--target", "{target}", "--drafter", "{fitted}", "{prompts}", "--k", "0"],
            "--k must be at least 1",
        ),
        (
            ["--target", "{target}", "--drafter", "{fitted}", "{prompts}", "--tree", "4"],
            "--tree 4: expected TOPK,DEPTH",
        ),
        (
            [
                "--target",
                "{target}",
                "--drafter",
                "{fitted}",
                "{prompts}",
                "--tree",
                "4,3",
                "--k",
                "3",
            ],
            "--k and --tree exclude each other",
        ),
        (
            ["--target", "{target}", "--drafter", "{fitted}", "{prompts}", "--temperature", "-1"],
            "--temperature must be >= 0",
        ),
        (
            ["--target", "{target}", "--drafter", "{fitted}", "{prompts}", "--dtype", "int8"],
            "--dtype int8: expected one of auto, bfloat16, float16, float32",
        ),
        (
            ["--target", "{target}", "--drafter", "{fitted}", "{prompts}", "--device", "tpu9"],
            "--device tpu9",
        ),
        (
            [
                "--target",
                "{target}",
                "--drafter",
                "{fitted}",
                "{prompts}",
                "--plot",
                "{root}/x.txt",
            ],
            "--plot {root}/x.txt: give a .png",
        ),
        (
            ["--target", "{target}", "--drafter", "{fitted}", "{prompts}", "--verify", "greedy"],
            "--verify must be one of onehot, probabilistic, sglang",
        ),
        (
            ["--target", "{target}", "--drafter", "{fitted}", "{prompts}", "--top-p", "0"],
            "--top-p must be in (0, 1] (got 0.0)",
        ),
        (
            ["--target", "{target}", "--drafter", "{fitted}", "{prompts}", "--top-k", "-2"],
            "--top-k must be -1 (off) or at least 1 (got -2)",
        ),
        (
            [
                "--target",
                "{target}",
                "--drafter",
                "{fitted}",
                "{prompts}",
                "--speculative-accept-threshold-acc",
                "0.5",
            ],
            "--speculative-accept-threshold-acc is SGLang's: give it with --verify sglang",
        ),
    ],
)
def test_bad_input_is_one_message(pair, args, message):
    fill = {k: str(v) for k, v in pair.items() if isinstance(v, Path)}
    code, out = cli("accept", *(a.format(**fill) for a in args))
    assert code == 2, out
    assert message.format(**fill) in out
    assert "Traceback" not in out


def test_prompts_option_is_a_deprecated_alias(pair):
    code, out = cli(
        "accept",
        "--target",
        str(pair["target"]),
        "--drafter",
        str(pair["fitted"]),
        "--prompts",
        str(pair["prompts"]),
        "--max-samples",
        "1",
        "--max-new-tokens",
        "2",
        "--device",
        "cpu",
        "--json",
    )
    assert code == 0, out
    assert "--prompts is deprecated: give the prompt files positionally" in out
    code, out = cli("accept", "--target", str(pair["target"]), "--drafter", str(pair["fitted"]))
    assert code == 2 and "error: give the prompt files" in out, out


def test_a_drafter_for_another_target_is_refused(pair, tmp_path):
    from transformers import LlamaConfig

    other = LlamaConfig(
        vocab_size=pair["model"].config.vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    save_drafter(Eagle3Drafter(DrafterConfig.from_target(other)), tmp_path / "other")
    code, out = cli(
        "accept",
        "--target",
        str(pair["target"]),
        "--drafter",
        str(tmp_path / "other"),
        str(pair["prompts"]),
    )
    assert code == 2 and "--drafter" in out and "--target" in out, out
    assert "Traceback" not in out


def test_unreadable_prompt_file(pair, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"turns": "not a list"}\n')
    code, out = cli(
        "accept", "--target", str(pair["target"]), "--drafter", str(pair["fitted"]), str(bad)
    )
    assert code == 2 and "bad.jsonl:1" in out and "Traceback" not in out


def test_copies_of_the_prompt_sets_are_recorded():
    sources = (DATA / "SOURCES.md").read_text()
    for path in [*PROMPT_SETS, *FULL_SETS]:
        assert str(path.relative_to(DATA)) in sources

"""Acceptance by context depth (eagle3kit.model.depth): the buckets on rounds whose depths are
known, the prompts cut from recorded samples (--context-from), bench accept's JSON and
figure, and train's held-out prediction per bucket."""

from __future__ import annotations

import json
import subprocess
from itertools import pairwise
from pathlib import Path

import numpy as np
import prewarmed
import pytest
import torch
from typer.testing import CliRunner

from eagle3kit.bench.contexts import LAST_TURN, from_dataset
from eagle3kit.cli import app
from eagle3kit.format import Dataset, DatasetWriter, TokenSample
from eagle3kit.model.depth import DEPTH_EDGES, by_depth, labels, parse_edges, round_depths

pytestmark = pytest.mark.usefixtures("one_torch_thread")
K = 3


# The buckets ---------------------------------------------------------------------------------
def test_each_round_is_counted_in_the_bucket_of_its_depth() -> None:
    # A 1000-token prompt: the prefill makes token 1000, so the first round follows 1001
    # tokens; rounds accepting 3, 0, 2, 1 commit 4, 1, 3, 2 tokens.
    assert round_depths(1000, [3, 0, 2, 1]) == [1001, 1005, 1006, 1009]
    decodes = [
        (1000, [3, 0, 2, 1]),  # depths 1001, 1005, 1006, 1009: <1K, <1K, <1K, <1K
        (1020, [3, 1, 0, 0]),  # 1021, 1025, 1027, 1028: <1K, then 1K-4K x3
        (1022, [0, 2]),  # 1023 (<1K), 1024: the edge opens the next bucket
        (4095, [3]),  # 4096: 4K-16K
        (20000, [1, 1]),  # >=16K
    ]
    got = by_depth(decodes, K)
    assert list(got) == ["<1K", "1K-4K", "4K-16K", ">=16K"]
    assert {name: b["rounds"] for name, b in got.items()} == {
        "<1K": 6,
        "1K-4K": 4,
        "4K-16K": 1,
        ">=16K": 2,
    }
    below = [3, 0, 2, 1, 3, 0]  # the accepted counts of the six rounds under 1K
    assert got["<1K"]["acceptance_length"] == pytest.approx(1 + sum(below) / 6)
    assert got["<1K"]["per_position"] == pytest.approx([4 / 6, 3 / 6, 2 / 6])
    assert got["1K-4K"]["acceptance_length"] == pytest.approx(1 + (1 + 0 + 0 + 2) / 4)
    assert got["1K-4K"]["per_position"] == pytest.approx([2 / 4, 1 / 4, 0])
    assert (got["1K-4K"]["from"], got["1K-4K"]["to"]) == (1024, 4096)
    assert (got[">=16K"]["from"], got[">=16K"]["to"]) == (16384, None)
    assert got[">=16K"]["per_position"] == [1.0, 0.0, 0.0]


def test_bucket_edges_are_parsed_once_for_every_command() -> None:
    assert parse_edges("1024,4096,16384") == DEPTH_EDGES
    assert labels((512, 2048)) == ["<512", "512-2K", ">=2K"]
    for bad in ("4096,1024", "1024,1024", "0,10", "1K,4K"):
        with pytest.raises(ValueError, match="--depth-buckets"):
            parse_edges(bad)


# Contexts cut from recorded samples ----------------------------------------------------------
def recorded(path: Path, lengths: list[int], vocab: int, turns: int = 1) -> Path:
    """A token dataset of samples of `lengths` tokens (random ids under `vocab`); with
    `turns` > 1 each sample is a history of that many user/answer pairs (loss spans)."""
    rng = np.random.default_rng(0)
    with DatasetWriter(path, config={"stage": "test"}) as writer:
        for n, length in enumerate(lengths):
            ids = rng.integers(5, vocab, length).tolist()
            mask = np.zeros(length, np.uint8)
            bounds = np.linspace(0, length, turns + 1).astype(int)
            for start, end in pairwise(bounds):
                mask[start + (end - start) // 3 : end] = 1  # a third user, the rest answer
            split = int(np.flatnonzero(mask)[0])
            writer.add(
                TokenSample(
                    f"s{n}",
                    ids[:split],
                    ids[split:],
                    loss_mask=None if turns == 1 else mask.tolist(),
                )
            )
    return path


def test_the_contexts_are_exactly_the_first_n_tokens_of_each_recorded_sample(tmp_path) -> None:
    path = recorded(tmp_path / "ds", [300, 120, 200], vocab=500)
    dataset = Dataset(path)
    whole = [np.asarray(dataset.token_view(i).input_ids).tolist() for i in range(3)]
    contexts = from_dataset(path, (120, 250), None, vocab_size=500)
    # 120 needs a sample longer than 120 (a token left to continue): not s1; 250: s0 only.
    assert [(c.label, c.category) for c in contexts] == [
        (f"{path}:s0@120", "context 120"),
        (f"{path}:s0@250", "context 250"),
        (f"{path}:s2@120", "context 120"),
    ]
    assert contexts[0].ids == whole[0][:120]
    assert contexts[1].ids == whole[0][:250]
    assert contexts[2].ids == whole[2][:120]
    assert [c.label for c in from_dataset(path, (120,), 1, 500)] == [f"{path}:s0@120"]


def test_a_multi_turn_history_is_cut_where_its_last_answer_starts(tmp_path) -> None:
    path = recorded(tmp_path / "ds", [300, 90], vocab=500, turns=3)
    dataset = Dataset(path)
    (got0, got1) = from_dataset(path, (LAST_TURN,), None, vocab_size=500)
    for got, index, length in ((got0, 0, 300), (got1, 1, 90)):
        view = dataset.token_view(index)
        mask = np.asarray(view.loss_mask)
        third = length // 3 * 2  # the third turn's user part, then its answer
        start = third + (length - third) // 3
        assert mask[start] == 1 and mask[start - 1] == 0 and mask[start:].all()
        assert got.ids == np.asarray(view.input_ids)[:start].tolist()
        assert got.category == "last turn"


def test_a_dataset_of_another_tokenizer_is_refused_by_flag(tmp_path) -> None:
    from eagle3kit.errors import UserError

    path = recorded(tmp_path / "ds", [300], vocab=900)
    with pytest.raises(
        UserError,
        match=r"--context-from .*ds: sample 0 holds token id \d+, "
        r"outside the tokenizer's vocabulary of 600",
    ):
        from_dataset(path, (100,), None, vocab_size=600)
    with pytest.raises(
        UserError,
        match=r"no sample is long enough for --context-tokens 400 "
        r"\(the longest holds 300 tokens\)",
    ):
        from_dataset(path, (400,), None, vocab_size=None)


# bench accept -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> dict[str, Path]:
    """A random tiny target and a random drafter for it; a dataset recorded in its vocabulary."""
    from transformers import AutoConfig

    from eagle3kit.checkpoints.native import save_drafter
    from eagle3kit.model import DrafterConfig, Eagle3Drafter
    from eagle3kit.tiny import make_target, make_tokenizer, stdlib_docstrings

    root = tmp_path_factory.mktemp("depth")
    make_tokenizer(root / "tok", corpus=stdlib_docstrings(20_000))
    target = make_target(root / "target", root / "tok", seed=3, head_dim=16, num_layers=4)
    config = AutoConfig.from_pretrained(target)
    torch.manual_seed(1)
    save_drafter(Eagle3Drafter(DrafterConfig.from_target(config)), root / "drafter")
    return {
        "root": root,
        "target": target,
        "drafter": root / "drafter",
        "data": recorded(root / "ds", [200, 140, 90], vocab=config.vocab_size),
    }


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*prewarmed.argv(), "bench", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_bench_accept_reports_acceptance_per_context_depth(pair, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.image

    png = tmp_path / "al.png"
    result = run_cli(
        "accept",
        "--target",
        str(pair["target"]),
        "--drafter",
        str(pair["drafter"]),
        "--context-from",
        str(pair["data"]),
        "--context-tokens",
        "60,100,150",
        "--depth-buckets",
        "64,128",
        "--max-new-tokens",
        "8",
        "--device",
        "cpu",
        "--json",
        "--no-progress",
        "--plot",
        str(png),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    prompts = report["prompts"]
    data = pair["data"]
    assert [(p["prompt"], p["prompt_tokens"], p["category"]) for p in prompts] == [
        (f"{data}:s0@60", 60, "context 60"),
        (f"{data}:s0@100", 100, "context 100"),
        (f"{data}:s0@150", 150, "context 150"),
        (f"{data}:s1@60", 60, "context 60"),
        (f"{data}:s1@100", 100, "context 100"),
        (f"{data}:s2@60", 60, "context 60"),
    ]
    assert report["depth_edges"] == [64, 128]
    expected: dict[str, list[int]] = {}
    for p in prompts:
        depth = p["prompt_tokens"] + 1
        assert p["depths"][0] == depth
        for d, accepted in zip(p["depths"], p["rounds"], strict=True):
            assert d == depth
            name = "<64" if d < 64 else "64-128" if d < 128 else ">=128"
            expected.setdefault(name, []).append(accepted)
            depth += accepted + 1
    # The 60-token contexts straddle the edge at 64: their rounds fall on both sides of it.
    assert set(expected) == {"<64", "64-128", ">=128"}
    assert list(report["depths"]) == ["<64", "64-128", ">=128"]
    for name, bucket in report["depths"].items():
        mine = expected[name]
        assert bucket["rounds"] == len(mine)
        assert bucket["acceptance_length"] == pytest.approx(1 + sum(mine) / len(mine))
        assert bucket["per_position"] == pytest.approx(
            [sum(a >= i for a in mine) / len(mine) for i in range(1, K + 1)]
        )
    assert sum(b["rounds"] for b in report["depths"].values()) == report["rounds"]
    assert "per context depth in tokens" in result.stderr
    assert "64-128" in result.stderr

    image = matplotlib.image.imread(png)
    assert image.shape[:2] == (400, 1600)  # three panels: figsize (16, 4) at 100 dpi
    depth_panel = image[40:360, 1110:1580, :3].reshape(-1, 3)
    assert (depth_panel < 0.5).any()  # the axes, ticks and the line of that third panel


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--depth-buckets", "4096,1024"],
            "--depth-buckets 4096,1024: the edges must be positive and strictly ascending",
        ),
        (
            ["--context-tokens", "8192"],
            "--context-tokens cuts the samples of --context-from DATASET: give the dataset",
        ),
        (["--context-from", "{data}"], "--context-from {data} needs --context-tokens"),
        (
            ["--context-from", "{root}/nope", "--context-tokens", "10"],
            "--context-from {root}/nope: no such dataset directory",
        ),
        (
            ["--context-from", "{data}", "--context-tokens", "10,many"],
            "--context-tokens 10,many: expected token counts or last-turn",
        ),
    ],
)
def test_bad_depth_options_are_one_line_naming_the_flag(pair, args, message) -> None:
    fill = {k: str(v) for k, v in pair.items()}
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "accept",
            "--target",
            str(pair["target"]),
            "--drafter",
            str(pair["drafter"]),
            *(a.format(**fill) for a in args),
        ],
    )
    assert result.exit_code == 2, result.output
    assert message.format(**fill) in result.output
    assert "Traceback" not in result.output


# bench server: the engine's own rounds -----------------------------------------------------
MT_BENCH = Path(__file__).parent / "data" / "prompts" / "eagle" / "mt_bench" / "question.jsonl"


def test_bench_server_buckets_the_engines_rounds_by_depth(pair) -> None:
    from fake_spec_server import SpecServer

    from eagle3kit._ui import OutputOptions
    from eagle3kit.bench import result, server
    from eagle3kit.bench.contexts import DepthOptions

    def measure(per_request: bool) -> tuple[result.ServerReport, SpecServer]:
        with SpecServer(
            "vllm",
            tokenizer=str(pair["root"] / "tok"),
            k=K,
            mean_tokens=40,
            per_request_metrics=per_request,
        ) as srv:
            report = server.run(
                server.ServerBenchConfig(
                    srv.url,
                    [MT_BENCH],
                    pair["root"] / "tok",
                    max_new_tokens=24,
                    max_samples=4,
                    depth=DepthOptions(depth_buckets="40,80"),
                    output=OutputOptions(quiet=True),
                )
            )
        return report, srv

    report, srv = measure(True)
    expected: dict[str, list[int]] = {}
    for prompt_tokens, steps in srv.per_request:  # each answer's rounds, placed by hand
        depth = prompt_tokens + 1
        for accepted in steps:
            expected.setdefault(
                "<40" if depth < 40 else "40-80" if depth < 80 else ">=80", []
            ).append(accepted)
            depth += accepted + 1
    assert len(srv.per_request) == 8 and len(expected) >= 2  # MT-bench's second turns go deeper
    assert report.depth_edges == [40, 80]
    assert {n: b["rounds"] for n, b in report.depths.items()} == {
        n: len(a) for n, a in expected.items()
    }
    for name, bucket in report.depths.items():
        mine = expected[name]
        assert bucket["acceptance_length"] == pytest.approx(1 + sum(mine) / len(mine))
        assert len(bucket["per_position"]) == K
    # The buckets split the rounds the counters count.
    rounds = sum(b["rounds"] for b in report.depths.values())
    assert rounds == sum(len(r) for _, _, r in srv.log)
    assert report.acceptance_length == pytest.approx(
        1
        + sum(
            b["acceptance_length"] - 1 for b in report.depths.values() for _ in range(b["rounds"])
        )
        / rounds
    )
    assert measure(False)[0].depths == {}  # a server that does not report its rounds


# train's held-out prediction -----------------------------------------------------------------
def test_train_predicts_per_depth_bucket_where_each_chain_starts() -> None:
    from transformers import LlamaConfig

    from eagle3kit.model import DrafterConfig, Eagle3Drafter
    from eagle3kit.train.heldout import evaluate
    from eagle3kit.train.target import TargetBatch

    rows = [list(range(1, 16)), list(range(1, 11))]  # 15 and 10 tokens, prompts of 3
    length, hidden = 15, 32
    ids = torch.zeros(2, length, dtype=torch.long)
    mask = torch.zeros(2, length, dtype=torch.bool)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, 3 : len(row)] = True
    g = torch.Generator().manual_seed(0)
    batch = TargetBatch(
        ids,
        mask,
        torch.tensor([15, 10]),
        torch.randn(2, length, 3 * hidden, generator=g),
        torch.randn(2, length, hidden, generator=g),
        torch.full((2, length), 63),
    )  # the target never says what is drafted
    target = LlamaConfig(
        vocab_size=64,
        hidden_size=hidden,
        intermediate_size=64,
        num_hidden_layers=8,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
    )
    torch.manual_seed(0)
    # A draft vocabulary of the target's first 32 ids: its drafts are never the target's
    # token 63, so every round accepts nothing.
    drafter = Eagle3Drafter(DrafterConfig.from_target(target, draft_vocab_size=32))
    result = evaluate(drafter, [batch], K, depth_edges=(5, 10))
    # Nothing accepted: a round at every chain start t = 2 .. len-2, following t+2 tokens:
    # depths 4..15 (row 1) and 4..10 (row 2).
    depths = result.extra["depths"]
    assert result.extra["depth_edges"] == [5, 10]
    assert {name: b["chains"] for name, b in depths.items()} == {"<5": 2, "5-10": 10, ">=10": 6 + 1}
    assert sum(b["chains"] for b in depths.values()) == result.chains == 19
    assert all(b["predicted_acceptance_length"] == 1.0 for b in depths.values())
    assert (depths[">=10"]["from"], depths[">=10"]["to"]) == (10, None)
    default = evaluate(drafter, [batch], K).extra
    assert default["depth_edges"] == list(DEPTH_EDGES) and list(default["depths"]) == ["<1K"]

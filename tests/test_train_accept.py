"""Training raises the held-out predicted acceptance length, offline and online (slow).

A random target's outputs have no structure for a drafter to learn, so the module first
trains a tiny 8-layer target for a few hundred steps on stdlib docstrings, then makes the
training data the way gen would: chat-formatted prompts and the target's own greedy
continuations. The drafter must gain at least 0.5 in predicted acceptance length (k = 3)
over its untrained self on the held-out prompts, and `bench accept` (real chain decoding
on the same prompts) must agree with the prediction within 5%.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from eagle3kit._ui import OutputOptions
from eagle3kit.format import DatasetWriter, TokenSample
from eagle3kit.train import TrainConfig, run
from eagle3kit.train import data as tdata

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(2400),
    pytest.mark.usefixtures("one_torch_thread"),
]
QUIET = OutputOptions(quiet=True)


def train_target(root: Path, steps: int = 300, seq: int = 64, batch: int = 16) -> Path:
    """A tiny target trained briefly on stdlib docstrings (tiny.train_target when there is
    one)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eagle3kit.tiny import make_target, make_tokenizer, stdlib_docstrings

    docs = stdlib_docstrings(200_000)
    make_tokenizer(root / "tok", vocab_size=400, corpus=docs)
    target = make_target(root / "target", root / "tok", hidden_size=64, seed=0)
    tok = AutoTokenizer.from_pretrained(str(target))
    stream = torch.tensor([t for d in docs for t in tok(d + "\n")["input_ids"]])
    model = AutoModelForCausalLM.from_pretrained(str(target))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        starts = torch.randint(0, len(stream) - seq - 1, (batch,), generator=gen)
        x = torch.stack([stream[s : s + seq] for s in starts])
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(target)
    return target


def greedy_dataset(root: Path, target: Path, n: int = 64, new: int = 48) -> Path:
    """Chat prompts (docstring openings) and the target's greedy continuations, plus the
    prompts as a JSONL file for bench."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eagle3kit.tiny import stdlib_docstrings

    tok = AutoTokenizer.from_pretrained(str(target))
    model = AutoModelForCausalLM.from_pretrained(str(target)).eval()
    prompts = []
    with DatasetWriter(root / "tokens", config={"stage": "test"}) as w:
        for i, doc in enumerate(stdlib_docstrings(200_000)[-n:]):
            messages = [{"role": "user", "content": " ".join(doc.split()[:8])}]
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
            out = model.generate(torch.tensor([ids]), max_new_tokens=new, do_sample=False)
            w.add(TokenSample(f"p{i}", ids, out[0, len(ids) :].tolist()))
            prompts.append({"id": f"p{i}", "messages": messages})
    (root / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    return root / "tokens"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from eagle3kit import extract

    root = tmp_path_factory.mktemp("accept")
    target = train_target(root)
    tokens = greedy_dataset(root, target)
    extract.run(
        extract.ExtractConfig(tokens, root / "hidden", target=target, device="cpu", output=QUIET)
    )
    return {"root": root, "target": target, "tokens": tokens, "hidden": root / "hidden"}


def train(trained, data: Path, out: Path, **kw):
    return run(
        TrainConfig(
            [data],
            out,
            trained["target"],
            epochs=20,
            batch_tokens=1024,
            eval_split=12,
            eval_every=50,
            lr=3e-3,
            device="cpu",
            output=QUIET,
            **kw,
        )
    )


def heldout_prompts(trained) -> Path:
    src = tdata.open_source(trained["tokens"], 1.0, online=True)
    mask = tdata.held_out([src], 12)[0]
    held = {i for i, m in zip(src.ids, mask, strict=True) if m}
    lines = [
        line
        for line in (trained["root"] / "prompts.jsonl").read_text().splitlines()
        if json.loads(line)["id"] in held
    ]
    path = trained["root"] / "heldout.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("mode", ["offline", "online"])
def test_training_raises_the_predicted_acceptance_length(trained, tmp_path, mode):
    data = trained["hidden"] if mode == "offline" else trained["tokens"]
    result = train(trained, data, tmp_path / mode, online=mode == "online")
    before = result.initial_eval["predicted_acceptance_length"]
    after = result.eval["predicted_acceptance_length"]
    print(
        f"{mode}: predicted AL (k=3) {before:.3f} -> {after:.3f}, per position "
        f"{result.eval['per_position']}"
    )
    assert after >= before + 0.5
    assert result.eval["unobservable"] < 0.2  # greedy data: only the samples' ends
    if mode != "offline":
        return
    bench = pytest.importorskip("eagle3kit.bench.accept")
    report = bench.run(
        bench.AcceptConfig(
            trained["target"],
            tmp_path / mode / "drafter",
            [heldout_prompts(trained)],
            max_new_tokens=48,
            device="cpu",
            output=QUIET,
        )
    )
    print(f"bench accept: {report.acceptance_length:.3f}, predicted {after:.3f}")
    assert report.acceptance_length == pytest.approx(after, rel=0.05)

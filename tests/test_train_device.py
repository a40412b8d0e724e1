"""Train on an accelerator without stalls: no host synchronisation in the step loop beyond
the one read-back of each step's logged figures, every tensor of a step on the configured
device, and pinned host memory for states fed from disk only where the device is CUDA
(issue 28). Checked on the CPU by counting the calls that synchronise a CUDA stream."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from eagle3kit._ui import OutputOptions
from eagle3kit.format import DatasetWriter, TokenSample
from eagle3kit.target import to_device, wants_pinned_memory
from eagle3kit.train import TrainConfig, run
from eagle3kit.train.loop import TrainLoop

pytestmark = pytest.mark.usefixtures("one_torch_thread")

QUIET = OutputOptions(quiet=True)
PACKAGE = str(Path(__file__).resolve().parent.parent / "eagle3kit")
# Each of these waits for the device's queue on CUDA (a tensor's value brought to the host).
SYNCING = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__", "__index__")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A random tiny target and a hidden-state dataset of 30 docstring samples."""
    from transformers import AutoTokenizer

    from eagle3kit import extract
    from eagle3kit.tiny import make_target, make_tokenizer, stdlib_docstrings

    root = tmp_path_factory.mktemp("device")
    docs = stdlib_docstrings(30_000)
    make_tokenizer(root / "tok", vocab_size=400, corpus=docs)
    target = make_target(root / "target", root / "tok", hidden_size=32, seed=1)
    tok = AutoTokenizer.from_pretrained(str(target))
    with DatasetWriter(root / "tokens", config={"stage": "test"}) as w:
        for i, doc in enumerate(docs[:30]):
            ids = tok(doc)["input_ids"][:48]
            if len(ids) >= 12:
                w.add(TokenSample(f"s{i}", ids[:4], ids[4:]))
    extract.run(
        extract.ExtractConfig(
            root / "tokens", root / "hidden", target=target, device="cpu", output=QUIET
        )
    )
    return {"target": target, "hidden": root / "hidden"}


def short_run(tiny, out: Path) -> TrainConfig:
    return TrainConfig(
        [tiny["hidden"]],
        out,
        tiny["target"],
        max_steps=6,
        batch_tokens=128,
        draft_vocab=200,
        eval_split=0,
        checkpoint_every=1000,
        lr=3e-3,
        warmup=1,
        device="cpu",
        output=QUIET,
    )


def test_a_step_reads_back_from_the_device_once(tiny, tmp_path, monkeypatch) -> None:
    """Per step, `TrainLoop.step` and `.control` bring one tensor to the host: the step's logged
    figures, in one `.tolist()` (every step is logged, to metrics.jsonl and the progress
    line). Before, each figure was read on its own (float x2, int, .tolist() x3) and the
    stop flags twice more: 8 waits for the GPU's queue per step."""
    calls: list[str] = []
    active = [False]
    for name in SYNCING:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _name=name, _original=original, **kwargs):
            # eagle3kit's own reads: torch's AdamW reads its step counts, which it keeps on
            # the host for this reason (no wait on CUDA), with .item() of its own.
            if active[0] and PACKAGE in sys._getframe(1).f_code.co_filename:
                calls.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    per_call: dict[str, list[list[str]]] = {"step": [], "control": []}
    for method in per_call:
        original = getattr(TrainLoop, method)

        def watched(self, *args, _method=method, _original=original, **kwargs):
            calls.clear()
            active[0] = True
            try:
                return _original(self, *args, **kwargs)
            finally:
                active[0] = False
                per_call[_method].append(list(calls))

        monkeypatch.setattr(TrainLoop, method, watched)
    result = run(short_run(tiny, tmp_path / "r"))
    assert result.steps == 6 and result.loss is not None
    assert len(per_call["step"]) == 6
    # The first step also runs the attention kernel's one-time self-check (model/attention.py),
    # which compares a few results on the host once per run.
    assert all(c == ["tolist"] for c in per_call["step"][1:]), per_call["step"]
    assert per_call["step"][0][-1:] == ["tolist"]
    assert all(c == [] for c in per_call["control"]), per_call["control"]


def test_pinned_memory_and_non_blocking_copies_only_for_cuda(monkeypatch) -> None:
    assert wants_pinned_memory(torch.device("cuda", 0)) and wants_pinned_memory("cuda:1")
    assert not wants_pinned_memory(torch.device("cpu"))
    assert not wants_pinned_memory(torch.device("meta"))
    pinned: list[torch.Tensor] = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: pinned.append(self) or self)
    host = torch.arange(4.0)
    assert to_device(host, torch.device("cpu")) is host and not pinned
    on_meta = to_device(host, torch.device("meta"))
    assert on_meta.device.type == "meta" and not pinned


def test_a_training_step_keeps_its_tensors_on_the_configured_device(
    tiny, tmp_path, monkeypatch
) -> None:
    """Every tensor a step makes and every tensor of its batch lives on --device: the
    factory functions are watched during the steps of a real run."""
    made: list[torch.device] = []
    for name in ("zeros", "zeros_like", "full", "ones", "arange", "cat", "stack", "tensor"):
        original = getattr(torch, name)

        def watched(*args, _original=original, **kwargs):
            out = _original(*args, **kwargs)
            if isinstance(out, torch.Tensor):
                made.append(out.device)
            return out

        monkeypatch.setattr(torch, name, watched)
    batches: list = []
    original_step = TrainLoop.step

    def step(self, items):
        made.clear()
        batches.append(self.setup.feed.batch(items))
        out = original_step(self, items)
        assert {d.type for d in made} == {self.setup.device.type}, made
        return out

    monkeypatch.setattr(TrainLoop, "step", step)
    run(short_run(tiny, tmp_path / "r"))
    for b in batches:
        for t in (b.ids, b.loss_mask, b.lengths, b.aux, b.normed, b.argmax):
            assert t.device.type == "cpu"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_train_on_cuda_keeps_every_tensor_there(tiny, tmp_path) -> None:
    from dataclasses import replace

    result = run(replace(short_run(tiny, tmp_path / "r"), device="cuda"))
    assert result.steps == 6 and result.loss is not None

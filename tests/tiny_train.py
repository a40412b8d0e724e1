"""The tiny training world every training test shares, and the helpers that read a run.

Not a test module: conftest.py builds the world once per test run (`train_world`), and the
training tests import these helpers from here.
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

import torch

from eagle3kit._options import WRITE_KEYS, WriteOptions
from eagle3kit._ui import OutputOptions
from eagle3kit.format import DatasetWriter, TokenSample
from eagle3kit.train import TrainConfig

REPO = Path(__file__).resolve().parent.parent
QUIET = OutputOptions(quiet=True)


def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE3KIT_")}
    out.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    return out


def write_tokens(path: Path, sequences: list[list[int]], prompt: int = 4) -> Path:
    with DatasetWriter(path, config={"stage": "test"}) as w:
        for i, ids in enumerate(sequences):
            w.add(TokenSample(f"s{i}", ids[:prompt], ids[prompt:]))
    return path


def extract(tokens: Path, out: Path, target: Path) -> Path:
    from eagle3kit import extract as stage

    stage.run(stage.ExtractConfig(tokens, out, target=target, device="cpu", output=QUIET))
    return out


def config(world, data, out, **kw) -> TrainConfig:
    options = dict(
        max_steps=4,
        batch_tokens=256,
        draft_vocab=200,
        eval_split=4,
        eval_every=2,
        checkpoint_every=2,
        lr=3e-3,
        warmup=1,
        device="cpu",
        output=QUIET,
    )
    options.update(kw)
    options["write"] = WriteOptions(**{k: options.pop(k) for k in WRITE_KEYS if k in options})
    return TrainConfig([data], out, world["target"], **options)


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "drafter" / "model.safetensors"))


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def losses(run_dir: Path) -> list[float]:
    return [m["loss"] for m in metrics(run_dir) if "loss" in m]


def build_train_world(root: Path) -> dict[str, Path]:
    """A random tiny 8-layer target (so the default layer ids 2, 4, 5 are distinct) with a
    small stdlib tokenizer, 40 docstring samples as tokens and as hidden states made by the
    real `extract`, under `root`."""
    from transformers import AutoTokenizer

    from eagle3kit.tiny import make_target, make_tokenizer, stdlib_docstrings

    docs = stdlib_docstrings(40_000)
    make_tokenizer(root / "tok", vocab_size=400, corpus=docs)
    target = make_target(root / "target", root / "tok", hidden_size=32, seed=1)
    tok = AutoTokenizer.from_pretrained(str(target))
    seqs = [tok(d)["input_ids"][:48] for d in docs[:40]]
    seqs = [s for s in seqs if len(s) >= 12]
    tokens = write_tokens(root / "tokens", seqs)
    hidden = extract(tokens, root / "hidden", target)
    return {"root": root, "target": target, "tokens": tokens, "hidden": hidden}


def train_cmd(world, out: Path, *extra: str) -> list[str]:
    return [
        "train",
        str(world["hidden"]),
        str(out),
        "--target",
        str(world["target"]),
        "--device",
        "cpu",
        "--batch-tokens",
        "256",
        "--draft-vocab",
        "200",
        "--eval-split",
        "4",
        "--lr",
        "3e-3",
        "--warmup",
        "1",
        "--no-progress",
        *extra,
    ]


def torchrun(*args: str, port: int | None = None) -> list[str]:
    port = port or 29500 + random.Random().randint(0, 20000)
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(port),
        "-m",
        "eagle3kit",
        *args,
    ]


def close_weights(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-4, atol=1e-5, msg=k)


def interrupt_at_step(monkeypatch, n: int) -> None:
    """The n-th optimizer step (counted from this call) raises KeyboardInterrupt, as a ^C
    there would; monkeypatch.undo() or its context's end restores the loop."""
    from eagle3kit.train.loop import TrainLoop

    calls = {"n": 0}
    original = TrainLoop.step

    def dies(self, batch):
        calls["n"] += 1
        if calls["n"] == n:
            raise KeyboardInterrupt
        return original(self, batch)

    monkeypatch.setattr(TrainLoop, "step", dies)

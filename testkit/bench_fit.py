"""A drafter fitted to a tiny target by a short TTT loop, and the target's own greedy
sequences to fit it on: what makes acceptance lengths worth measuring in the bench tests, the
vLLM window test and the bench benchmark. Not a test module."""

from __future__ import annotations

from pathlib import Path

import torch

from eagle3kit.bench import decode
from eagle3kit.model import Eagle3Drafter, TTTState

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "prompts"


def fit_drafter(
    model,
    drafter: Eagle3Drafter,
    sequences: list[list[int]],
    steps: int = 120,
    ttt: int = 3,
    lr: float = 3e-3,
    seed: int = 0,
) -> Eagle3Drafter:
    """A few seconds of training-time test on the target's own predictions (EAGLE3.md §2):
    step j at index t gets token t+1+j and learns the target's argmax for token t+2+j."""
    torch.manual_seed(seed)
    target = decode.Target(model, drafter.config.aux_layer_ids)
    data = []
    for ids in sequences:
        logits, aux = target.forward(ids, target.new_cache(), aux=True)
        data.append((torch.tensor(ids), aux, logits.argmax(-1)))
    opt = torch.optim.Adam(drafter.trainable_parameters(), lr=lr)
    drafter.train()
    for step in range(steps):
        ids, aux, greedy = data[step % len(data)]
        t_len = len(ids)
        idx = torch.arange(t_len)
        hidden, state, loss = drafter.project(aux[None]), TTTState(), torch.zeros(())
        for j in range(ttt):
            inputs = ids[(idx + 1 + j).clamp(max=t_len - 1)]
            labels = greedy[(idx + 1 + j).clamp(max=t_len - 1)]
            valid = idx + 2 + j < t_len
            hidden = drafter.ttt_step(hidden, inputs[None], (idx + j)[None], state)
            logits = drafter.logits(hidden)[0]
            loss = loss + 0.8**j * torch.nn.functional.cross_entropy(logits[valid], labels[valid])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return drafter.eval()


def greedy_sequences(model, target: Path, max_samples: int, new_tokens: int) -> list[list[int]]:
    """The target's greedy continuations of the first alpaca prompts, what a drafter is fitted
    on (also benchmarks/bench_bench.py's)."""
    from eagle3kit.bench.prompts import load, load_renderer, turns

    renderer = load_renderer(target, "--target")
    t = decode.Target(model)
    sequences = []
    for conv in load([DATA / "eagle/alpaca/question.jsonl"], max_samples=max_samples):
        for _, _, ids in turns(renderer, conv, 1):
            sequences.append(ids + decode.plain(t, ids, new_tokens, set(), decode.Sampler()).tokens)
    return sequences


def subset(path: Path, files: list[Path], per_file: int = 1) -> Path:
    """The first record(s) of each prompt file, in one JSONL file."""
    with open(path, "w") as out:
        for f in files:
            lines = [line for line in f.read_text().splitlines() if line.strip()]
            out.write("\n".join(lines[:per_file]) + "\n")
    return path

"""A tiny target and a train-style run directory holding an (untrained) drafter for it.

For trying `eagle3kit export` and `eagle3kit info` in seconds, offline:

    python examples/make_tiny_run.py tiny-target tiny-run

TARGET gets a random 8-layer Llama (hidden size 64, 1,026-token vocabulary; no tokenizer).
RUN gets what `eagle3kit train` writes there: run.json (the target's identity and the aux
layer ids) and drafter/ (eagle3kit's checkpoint layout), with a 300-token draft vocabulary
picked from made-up counts. `--layers` sets the aux layer ids (default 2,4,5 = 2, N//2, N-3).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def make_target(out: Path, max_positions: int = 2048) -> None:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig
    from transformers.utils import logging

    logging.disable_progress_bar()
    config = LlamaConfig(
        vocab_size=1026,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(out)


def make_run(
    run: Path, target: Path, layers: list[int], draft_vocab: int = 300, seed: int = 0
) -> None:
    import numpy as np
    import torch
    from transformers import AutoConfig

    from eagle3kit.checkpoints.native import save_drafter
    from eagle3kit.model import DrafterConfig, Eagle3Drafter, build_vocab
    from eagle3kit.target import TargetInfo, location

    target_config = AutoConfig.from_pretrained(target)
    config = DrafterConfig.from_target(
        target_config,
        draft_vocab_size=draft_vocab,
        aux_layer_ids=layers,
        target_name_or_path=str(target),
    )
    torch.manual_seed(seed)
    model = Eagle3Drafter(config)
    for p in model.trainable_parameters():  # norms start at 1: perturb them so a swap shows
        torch.nn.init.normal_(p, std=0.3)
    counts = np.random.default_rng(seed).integers(0, 50, target_config.vocab_size)
    vocab = build_vocab(counts, draft_vocab)
    model.set_vocab(torch.from_numpy(vocab.d2t), torch.from_numpy(vocab.t2d))
    identity = {**location(target), **TargetInfo.load(target).identity}
    save_drafter(
        model,
        run / "drafter",
        extra={"target": identity, "layer_ids": layers, "vocab": {"coverage": vocab.coverage}},
    )
    (run / "run.json").write_text(
        json.dumps({"config": {}, "target": identity, "layer_ids": layers}, indent=2) + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", type=Path)
    parser.add_argument("run", type=Path)
    parser.add_argument("--layers", default="2,4,5")
    parser.add_argument("--max-positions", type=int, default=2048)
    args = parser.parse_args()
    make_target(args.target, args.max_positions)
    make_run(args.run, args.target, [int(x) for x in args.layers.split(",")])


if __name__ == "__main__":
    main()

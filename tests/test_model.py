"""The drafter's two attention paths agree, and the draft vocabulary follows EAGLE3.md §1.3."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaConfig

from eagle3kit.model import (
    DraftCache,
    DrafterConfig,
    DraftVocab,
    Eagle3Drafter,
    TTTState,
    build_vocab,
    vocab_problems,
)


def tiny_drafter(seed: int = 0, norm_before_residual: bool = False) -> Eagle3Drafter:
    target = LlamaConfig(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    config = DrafterConfig.from_target(target, draft_vocab_size=50)
    config.norm_before_residual = norm_before_residual
    torch.manual_seed(seed)
    model = Eagle3Drafter(config)
    for p in model.parameters():  # norms start at 1; perturb so a swapped norm shows
        torch.nn.init.normal_(p, std=0.3)
    return model.eval()


def test_shape_follows_the_target():
    model = tiny_drafter()
    assert model.fc.weight.shape == (32, 96)
    assert model.layers[0].self_attn.q_proj.weight.shape == (32, 64)
    assert model.layers[0].self_attn.k_proj.weight.shape == (16, 64)
    assert model.lm_head.weight.shape == (50, 32)
    assert not model.embed_tokens.weight.requires_grad
    names = set(model.state_dict())
    assert {"fc.weight", "layers.0.hidden_norm.weight", "norm.weight", "d2t", "t2d"} <= names
    assert "inv_freq" not in names


@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_training_time_test_equals_chain_decoding(norm_before_residual):
    """Step k of the training-time test at index t is what decoding computes for the k-th
    draft after a context ending at t."""
    model = tiny_drafter(norm_before_residual=norm_before_residual)
    t_len, steps = 9, 3
    torch.manual_seed(1)
    aux = torch.randn(1, t_len, 96)
    ids = torch.randint(0, 97, (1, t_len + steps))
    positions = torch.arange(t_len)[None]
    state = TTTState()
    hidden = model.project(aux)
    ttt_outputs = []
    for k in range(steps):
        hidden = model.ttt_step(hidden, ids[:, k : k + t_len], positions + k, state)
        ttt_outputs.append(hidden)
    for t in (0, 4, t_len - 1):
        cache = DraftCache()
        out = model.decode(
            model.project(aux[:, : t + 1]), ids[:, : t + 1], positions[:, : t + 1], cache
        )
        torch.testing.assert_close(out[:, t], ttt_outputs[0][:, t])
        h = out[:, t : t + 1]
        for k in range(1, steps):
            h = model.decode(h, ids[:, t + k : t + k + 1], torch.tensor([[t + k]]), cache)
            torch.testing.assert_close(h[:, 0], ttt_outputs[k][:, t], rtol=1e-5, atol=1e-5)


def test_padding_does_not_leak_into_real_positions():
    model = tiny_drafter()
    torch.manual_seed(2)
    aux, ids = torch.randn(1, 6, 96), torch.randint(0, 97, (1, 6))
    pos = torch.arange(6)[None]
    alone = model.ttt_step(model.project(aux[:, :4]), ids[:, :4], pos[:, :4], TTTState())
    # Right padding: positions 4 and 5 hold whatever a batch pads with.
    padded = model.ttt_step(model.project(aux), ids, pos, TTTState())
    torch.testing.assert_close(padded[:, :4], alone)


def test_rope_matches_transformers():
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    from eagle3kit.model.drafter import apply_rope

    target = LlamaConfig(hidden_size=32, num_attention_heads=4, rope_theta=500000.0)
    config = DrafterConfig.from_target(target)
    model = Eagle3Drafter(config)
    x = torch.randn(1, 4, 7, 8)
    pos = torch.arange(3, 10)[None]
    cos, sin = LlamaRotaryEmbedding(target)(x, pos)
    expected, _ = apply_rotary_pos_emb(x, x, cos, sin)
    torch.testing.assert_close(apply_rope(x, pos, model.inv_freq), expected)


@pytest.mark.parametrize(
    "mscales", [{"mscale": 1.0, "mscale_all_dim": 1.0}, {}], ids=["kimi-k2", "plain-yarn"]
)
def test_yarn_rope_matches_transformers(mscales):
    """Kimi-K2's YaRN (beta_fast = beta_slow = 1) moves 12 of the 32 frequencies of a 64-wide
    head even at short positions: a drafter trained without it and served with it (vLLM
    reads the exported rope_scaling) sees rotations it never learnt."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    from eagle3kit.model.drafter import apply_rope, rope_attention_factor

    yarn = {
        "rope_type": "yarn",
        "rope_theta": 50000.0,
        "factor": 32.0,
        "beta_fast": 1.0,
        "beta_slow": 1.0,
        "original_max_position_embeddings": 4096,
        **mscales,
    }
    target = LlamaConfig(
        hidden_size=256, num_attention_heads=4, max_position_embeddings=131072, rope_parameters=yarn
    )
    config = DrafterConfig.from_target(target)
    assert config.rope_scaling["rope_type"] == "yarn"
    model = Eagle3Drafter(config)
    x = torch.randn(1, 4, 7, 64)
    pos = torch.arange(3, 10)[None]
    cos, sin = LlamaRotaryEmbedding(target)(x, pos)
    expected, _ = apply_rotary_pos_emb(x, x, cos, sin)
    plain = 1.0 / (50000.0 ** (torch.arange(0, 64, 2).float() / 64))
    assert ((plain / model.inv_freq) > 31.9).sum() == 12  # the others kept within float
    assert ((plain / model.inv_freq - 1).abs() < 1e-5).sum() == 20
    assert rope_attention_factor(config) == pytest.approx(1.0 if mscales else 1.3466, abs=1e-4)
    torch.testing.assert_close(
        apply_rope(x, pos, model.inv_freq, rope_attention_factor(config)), expected
    )


def test_draft_vocab_keeps_the_most_frequent_sorted():
    counts = np.array([5, 0, 9, 1, 9, 0, 3])
    vocab = build_vocab(counts, 3)
    assert vocab.draft_ids.tolist() == [0, 2, 4]
    assert vocab.d2t.tolist() == [0, 1, 2]
    assert vocab.t2d.tolist() == [True, False, True, False, True, False, False]
    assert vocab.coverage == pytest.approx(23 / 27)
    assert vocab_problems(vocab.d2t, vocab.t2d, 7, 3) == []
    assert DraftVocab.from_d2t(vocab.d2t, 7).draft_ids.tolist() == [0, 2, 4]
    # Fewer distinct ids than asked: pad with the lowest unused ids.
    assert build_vocab(np.array([0, 0, 4, 0]), 3).draft_ids.tolist() == [0, 1, 2]


def test_vocab_problems_are_named():
    assert "offsets" in vocab_problems(np.array([3, 5, 6]), None, 7, 3)[0]
    assert "rows" in vocab_problems(np.array([0, 0]), None, 7, 3)[0]
    assert "t2d" in vocab_problems(np.array([0, 0, 0]), np.ones(7, bool), 7, 3)[0]
    assert "no d2t" in vocab_problems(None, None, 7, 3)[0]


def test_checkpoint_round_trip(tmp_path):
    from eagle3kit.checkpoints.native import load_drafter, save_drafter

    model = tiny_drafter()
    vocab = build_vocab(np.arange(97), 50)
    model.set_vocab(torch.from_numpy(vocab.d2t), torch.from_numpy(vocab.t2d))
    save_drafter(model, tmp_path / "d", extra={"note": 1})
    loaded = load_drafter(tmp_path / "d", embedding=model.embed_tokens.weight)
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor)
    assert loaded.config == model.config

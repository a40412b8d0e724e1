"""A sliding-window drafter computes what a plain masked attention computes.

The reference is written here: the whole [T, T] score matrix with the window's mask (a key
is seen when its position is at most the query's and more than `window` before it), plus,
in the training-time test, the diagonal keys of the later steps. The drafter's two paths are
held to it on random weights: the training-time test (train's loss and gradients, and the
held-out verdicts, through the windowed chunked attention) and decoding (DraftCache). The
YaRN rotary embedding is held to transformers' own.
"""

from __future__ import annotations

import math

import pytest
import torch
import ttt_reference
from transformers import LlamaConfig
from ttt_setup import DECAY, STEPS, drafter_and_head, make_batch

from eagle3kit.model import DraftCache, DrafterConfig, Eagle3Drafter, TTTState
from eagle3kit.model import attention as attn
from eagle3kit.train import soft_ce
from eagle3kit.train.heldout import chain_verdicts
from eagle3kit.train.ttt import TTTLoss, step_counts

pytestmark = pytest.mark.usefixtures("one_torch_thread")

WINDOW = 9


def masked_attention(
    q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor], window: int | None
) -> torch.Tensor:
    """Step len(keys)-1 (k) of the training-time test, as one softmax over an explicit mask:
    the query at index t sits at position t+k and sees the step-0 key at index s when
    s <= t and t+k-s < window; the step-j key at index t (position t+j) when t+k-(t+j) <
    window."""
    k, t = len(keys) - 1, q.shape[2]
    scale = 1.0 / math.sqrt(q.shape[-1])
    rows, cols = torch.arange(t)[:, None], torch.arange(t)[None]
    seen = cols <= rows
    if window is not None:
        seen = seen & (rows + k - cols < window)
    scores = (q @ keys[0].transpose(-1, -2) * scale).masked_fill(~seen, float("-inf"))
    diagonal = [(q * key).sum(-1, keepdim=True) * scale for key in keys[1:]]
    for j, d in enumerate(diagonal, start=1):
        if window is not None and k - j >= window:
            d.fill_(float("-inf"))
    weights = torch.softmax(torch.cat([scores, *diagonal], -1).float(), -1).to(q.dtype)
    out = weights[..., :t] @ values[0]
    for j, value in enumerate(values[1:]):
        out = out + weights[..., t + j : t + j + 1] * value
    return out


@pytest.fixture
def reference(monkeypatch):
    """testkit/ttt_reference.py's quadratic path, its attention replaced by the masked one
    with the drafter's window."""
    window: list[int | None] = [None]

    def quadratic_attention(q, k, v, state, valid):
        state.keys.append(k)
        state.values.append(v)
        return masked_attention(q, state.keys, state.values, window[0])

    monkeypatch.setattr(ttt_reference, "quadratic_attention", quadratic_attention)
    return window


@pytest.fixture(params=["cpu-flash", "chunked"])
def kernel(request, monkeypatch):
    monkeypatch.setattr(attn, "forced", request.param)
    monkeypatch.setattr(attn, "CHUNK_BYTES", 4 * 3 * 4 * 40 * 7)  # several blocks per row
    monkeypatch.setattr(soft_ce, "BLOCK_BYTES", 4 * 50 * 3 * 5)
    return request.param


def windowed(window: int | None, seed: int = 0):
    drafter, head = drafter_and_head(seed)
    drafter.config.sliding_window = window
    return drafter, head


def losses(drafter, head, batch):
    counts = step_counts(batch, drafter.t2d, STEPS)
    params = drafter.trainable_parameters()
    new = TTTLoss(drafter, head, STEPS, DECAY)(batch, counts)
    old = ttt_reference.quadratic_loss(drafter, head, batch, counts, STEPS, DECAY)
    return (new, torch.autograd.grad(new[0], params)), (old, torch.autograd.grad(old[0], params))


@pytest.mark.parametrize("window", [WINDOW, STEPS + 1])
def test_training_loss_and_gradients_equal_the_masked_reference(kernel, reference, window):
    reference[0] = window
    drafter, head = windowed(window)
    batch = make_batch(head, [40, 23, 31])
    (new, new_grads), (old, old_grads) = losses(drafter, head, batch)
    torch.testing.assert_close(new[0], old[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(new[1], old[1], rtol=1e-5, atol=1e-5)
    assert torch.equal(new[2], old[2])
    for a, b in zip(new_grads, old_grads, strict=True):
        assert b.abs().max() > 0
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # The window changes what is learned: full attention gives another loss.
    drafter.config.sliding_window = None
    full = TTTLoss(drafter, head, STEPS, DECAY)(batch, step_counts(batch, drafter.t2d, STEPS))
    assert abs(full[0].item() - new[0].item()) > 1e-4


def test_a_window_longer_than_the_sequence_is_full_attention(kernel, reference):
    drafter, head = windowed(64)
    batch = make_batch(head, [40, 23, 31])
    (new, _), (old, _) = losses(drafter, head, batch)  # the reference without a window
    torch.testing.assert_close(new[0], old[0], rtol=1e-5, atol=1e-5)


def test_held_out_verdicts_equal_the_masked_reference(kernel, reference):
    reference[0] = WINDOW
    drafter, _ = windowed(WINDOW)
    head = drafter_and_head()[1]
    batch = make_batch(head, [40, 23, 31], seed=3)
    new = chain_verdicts(drafter, batch, 3)
    old = ttt_reference.quadratic_verdicts(drafter, batch, 3)
    assert torch.equal(new[0], old[0]) and torch.equal(new[1], old[1])
    assert new[1].any()


def test_a_window_no_wider_than_the_unroll_is_refused():
    drafter, head = windowed(STEPS - 1)
    batch = make_batch(head, [12])
    with pytest.raises(
        ValueError, match="sliding window of 3 keys leaves training-time-test step 3 no context"
    ):
        TTTLoss(drafter, head, STEPS, DECAY)(batch, step_counts(batch, drafter.t2d, STEPS))


# Decoding ---------------------------------------------------------------------------------
def tiny_drafter(window: int | None) -> Eagle3Drafter:
    target = LlamaConfig(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    config = DrafterConfig.from_target(target, draft_vocab_size=50)
    config.sliding_window = window
    config.num_hidden_layers = 2  # the window applies to every draft layer
    torch.manual_seed(0)
    model = Eagle3Drafter(config)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return model.eval()


def plain_forward(model: Eagle3Drafter, hidden, ids, positions, window: int) -> torch.Tensor:
    """The drafter's layers over a whole context with the window as an explicit mask."""

    def attend(index, q, k, v):
        p = positions[0]
        seen = (p[None] <= p[:, None]) & (p[:, None] - p[None] < window)
        return (
            torch.softmax(
                (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(
                    ~seen, float("-inf")
                ),
                -1,
            )
            @ v
        )

    return model.layer(hidden, ids, positions, attend)


def test_decoding_equals_the_masked_reference_and_the_training_time_test():
    """Decoding a context in one pass, then drafting a chain position by position, gives
    the reference's outputs; and step k of the training-time test at index t is the k-th
    draft after a context ending at t, as without a window."""
    model = tiny_drafter(WINDOW)
    t_len, steps = 30, 3
    torch.manual_seed(1)
    aux = torch.randn(1, t_len, 96)
    ids = torch.randint(0, 97, (1, t_len + steps))
    positions = torch.arange(t_len)[None]
    with torch.no_grad():
        cache = DraftCache()
        decoded = model.decode(model.project(aux), ids[:, :t_len], positions, cache)
        expected = plain_forward(model, model.project(aux), ids[:, :t_len], positions, WINDOW)
        torch.testing.assert_close(decoded, expected, rtol=1e-5, atol=1e-5)
        full = tiny_drafter(None)
        assert not torch.allclose(
            full.decode(full.project(aux), ids[:, :t_len], positions, DraftCache()),
            decoded,
            atol=1e-3,
        )
        state, hidden, ttt = TTTState(), model.project(aux), []
        for k in range(steps):
            hidden = model.ttt_step(hidden, ids[:, k : k + t_len], positions + k, state)
            ttt.append(hidden)
        for t in (3, 15, t_len - 1):
            cache = DraftCache()
            out = model.decode(
                model.project(aux[:, : t + 1]), ids[:, : t + 1], positions[:, : t + 1], cache
            )
            torch.testing.assert_close(out[:, t], ttt[0][:, t], rtol=1e-5, atol=1e-5)
            h = out[:, t : t + 1]
            for k in range(1, steps):
                h = model.decode(h, ids[:, t + k : t + k + 1], torch.tensor([[t + k]]), cache)
                torch.testing.assert_close(h[:, 0], ttt[k][:, t], rtol=1e-5, atol=1e-5)


def test_a_cropped_cache_keeps_its_positions():
    """bench rolls the cache back after each round; the positions go with the keys."""
    model = tiny_drafter(4)
    torch.manual_seed(2)
    aux, ids = torch.randn(1, 8, 96), torch.randint(0, 97, (1, 8))
    with torch.no_grad():
        cache = DraftCache()
        model.decode(model.project(aux[:, :6]), ids[:, :6], torch.arange(6)[None], cache)
        cache.crop(5)
        again = model.decode(
            model.project(aux[:, 5:8]), ids[:, 5:8], torch.arange(5, 8)[None], cache
        )
        whole = model.decode(model.project(aux), ids, torch.arange(8)[None], DraftCache())
    assert cache.positions is not None and cache.positions.tolist() == [list(range(8))]
    torch.testing.assert_close(again, whole[:, 5:], rtol=1e-5, atol=1e-5)


# YaRN -------------------------------------------------------------------------------------
def test_yarn_rope_matches_transformers():
    """A YaRN target's positions as transformers (and vLLM) rotate them: the scaled
    frequencies and the attention factor on cos and sin."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    from eagle3kit.model.drafter import apply_rope

    target = LlamaConfig(
        hidden_size=256,
        num_attention_heads=4,
        rope_theta=10000.0,
        max_position_embeddings=32768,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192},
    )
    model = Eagle3Drafter(DrafterConfig.from_target(target))
    assert model.rope_factor == pytest.approx(0.1 * math.log(4.0) + 1)
    x = torch.randn(1, 4, 5, 64)
    pos = torch.tensor([[0, 7, 4000, 12000, 30000]])
    cos, sin = LlamaRotaryEmbedding(target)(x, pos)
    expected, _ = apply_rotary_pos_emb(x, x, cos, sin)
    torch.testing.assert_close(
        apply_rope(x, pos, model.inv_freq, model.rope_factor), expected, rtol=1e-4, atol=1e-4
    )

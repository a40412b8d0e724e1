"""The linear-memory training-time test computes what the quadratic one did.

The reference is the code as it was (testkit/ttt_reference.py): a [B, heads, T, T] score
matrix and [B, T, draft_vocab] logits per step. The new path (fused causal attention merged
with the diagonal terms through the log-sum-exp, the loss in blocks of positions) must give
the same loss, step sums, accuracies and gradients (1e-5, fp32), through every kernel and
with blocks small enough that every loop runs several times.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ttt_reference import quadratic_loss, quadratic_verdicts
from ttt_setup import DECAY, DRAFT, STEPS, drafter_and_head, make_batch

from eagle3kit.model import attention as attn
from eagle3kit.train import soft_ce
from eagle3kit.train.heldout import chain_verdicts
from eagle3kit.train.target import TargetBatch
from eagle3kit.train.ttt import TTTLoss, step_counts

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def both_losses(drafter, head, batch):
    counts = step_counts(batch, drafter.t2d, STEPS)
    params = drafter.trainable_parameters()
    new = TTTLoss(drafter, head, STEPS, DECAY)(batch, counts)
    new_grads = torch.autograd.grad(new[0], params)
    old = quadratic_loss(drafter, head, batch, counts, STEPS, DECAY)
    old_grads = torch.autograd.grad(old[0], params)
    return (new, new_grads), (old, old_grads)


@pytest.fixture(params=["cpu-flash", "chunked"])
def kernel(request, monkeypatch):
    monkeypatch.setattr(attn, "forced", request.param)
    # Blocks of a few positions: every loop of the chunked attention and of the loss runs
    # several times.
    monkeypatch.setattr(attn, "CHUNK_BYTES", 4 * 3 * 4 * 40 * 7)
    monkeypatch.setattr(soft_ce, "BLOCK_BYTES", 4 * DRAFT * 3 * 5)
    return request.param


def test_loss_and_gradients_equal_the_quadratic_path(kernel):
    drafter, head = drafter_and_head()
    batch = make_batch(head, [40, 23, 31])
    (new, new_grads), (old, old_grads) = both_losses(drafter, head, batch)
    torch.testing.assert_close(new[0], old[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(new[1], old[1], rtol=1e-5, atol=1e-5)
    assert torch.equal(new[2], old[2])
    assert new[2].sum() > 0
    for a, b in zip(new_grads, old_grads, strict=True):
        assert b.abs().max() > 0
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_a_step_loss_is_one_function_of_the_logits_and_the_target(kernel):
    """--loss's seam (losses.py): TTTLoss weighs and sums what its step loss gives at each
    position; one written with autograd over the logits (half the soft cross-entropy) gives
    half the built-in's loss, per-step sums and gradients, and the same accuracies."""

    def halved(logits, probs, want_grad):
        with torch.enable_grad():
            x = logits.detach().requires_grad_()
            loss = -(probs * torch.log_softmax(x, -1)).sum(-1) / 2
            grad = torch.autograd.grad(loss.sum(), x)[0] if want_grad else None
        return loss.detach(), grad

    drafter, head = drafter_and_head()
    batch = make_batch(head, [40, 23, 31])
    counts = step_counts(batch, drafter.t2d, STEPS)
    params = drafter.trainable_parameters()
    whole = TTTLoss(drafter, head, STEPS, DECAY)(batch, counts)
    half = TTTLoss(drafter, head, STEPS, DECAY, halved)(batch, counts)
    torch.testing.assert_close(half[0], whole[0] / 2, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(half[1], whole[1] / 2, rtol=1e-5, atol=1e-6)
    assert torch.equal(half[2], whole[2])
    for a, b in zip(
        torch.autograd.grad(half[0], params), torch.autograd.grad(whole[0], params), strict=True
    ):
        assert b.abs().max() > 0
        torch.testing.assert_close(a, b / 2, rtol=1e-4, atol=1e-6)


def test_a_batch_shorter_than_the_unroll(kernel):
    """Steps past the padded length carry nothing, as before."""
    drafter, head = drafter_and_head()
    batch = make_batch(head, [4, 3])
    (new, new_grads), (old, old_grads) = both_losses(drafter, head, batch)
    torch.testing.assert_close(new[0], old[0], rtol=1e-5, atol=1e-5)
    assert new[1].shape == (STEPS,) and torch.equal(new[1][3:], old[1][3:])
    for a, b in zip(new_grads, old_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_held_out_verdicts_equal_the_quadratic_path(kernel):
    drafter, head = drafter_and_head()
    batch = make_batch(head, [40, 23, 31], seed=3)
    new = chain_verdicts(drafter, batch, 3)
    old = quadratic_verdicts(drafter, batch, 3)
    assert torch.equal(new[0], old[0]) and torch.equal(new[1], old[1])
    assert new[1].any()


def _loss_of_row(drafter, head, batch, row):
    """The loss and gradients of one row's positions only (the others' masks cleared)."""
    keep = torch.zeros_like(batch.loss_mask)
    keep[row] = batch.loss_mask[row]
    only = TargetBatch(batch.ids, keep, batch.lengths, batch.aux, batch.normed, batch.argmax)
    counts = step_counts(only, drafter.t2d, STEPS)
    loss, sums, _ = TTTLoss(drafter, head, STEPS, DECAY)(only, counts)
    return loss, sums, torch.autograd.grad(loss, drafter.trainable_parameters())


def test_samples_in_one_batch_stay_separate():
    """Sample 1's loss and gradients are the same alone, beside sample 0, and beside a
    different sample 0 (other states, ids and length): nothing crosses a row or leaks from
    the padding."""
    drafter, head = drafter_and_head()
    pair = make_batch(head, [40, 21], seed=5)
    alone = make_batch(head, [21], seed=5)
    for name in ("ids", "loss_mask", "aux", "normed", "argmax"):
        setattr(alone, name, getattr(pair, name)[1:2, :21].clone())
    other = make_batch(head, [33, 21], seed=6)
    for name in ("ids", "loss_mask", "aux", "normed", "argmax"):
        getattr(other, name)[1] = getattr(pair, name)[1, :33]
    assert not torch.equal(other.aux[0], pair.aux[0])
    reference = _loss_of_row(drafter, head, alone, 0)
    for batch in (pair, other):
        loss, sums, grads = _loss_of_row(drafter, head, batch, 1)
        torch.testing.assert_close(loss, reference[0], rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(sums, reference[1], rtol=1e-6, atol=1e-7)
        for a, b in zip(grads, reference[2], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_bf16_autocast_stays_close_to_the_quadratic_path():
    drafter, head = drafter_and_head()
    batch = make_batch(head, [40, 23])
    counts = step_counts(batch, drafter.t2d, STEPS)
    new = TTTLoss(drafter, head, STEPS, DECAY)(batch, counts, torch.bfloat16)[0]
    old = quadratic_loss(drafter, head, batch, counts, STEPS, DECAY, torch.bfloat16)[0]
    torch.testing.assert_close(new, old, rtol=2e-2, atol=0)


def test_a_kernel_that_fails_its_check_gives_way_to_chunked(monkeypatch, capsys):
    """A fused kernel whose private signature changed, or that computes something else,
    is replaced by the chunked attention, with a warning, instead of training wrong."""
    real = attn.KERNELS
    q = torch.randn(1, 2, 5, 8)
    monkeypatch.setattr(attn, "_checked", {})
    assert attn.kernel_for(q).name == "cpu-flash"
    wrong = attn.Kernel(
        "cpu-flash", lambda q, k, v, s: (q, q[..., 0].float(), ()), real["cpu-flash"].backward
    )
    monkeypatch.setattr(attn, "KERNELS", {**real, "cpu-flash": wrong})
    monkeypatch.setattr(attn, "_checked", {})
    assert attn.kernel_for(q).name == "chunked"
    # model/ prints nothing: the warning waits for train (or bench) to show it, once.
    assert capsys.readouterr().err == ""
    taken = attn.take_warnings()
    assert len(taken) == 1 and "cpu-flash kernel is unusable" in taken[0]
    assert attn.take_warnings() == []


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
def test_the_check_passes_when_first_use_is_without_grad(monkeypatch, capsys, context):
    """The held-out evaluation, under no_grad, may be the first to attend."""
    monkeypatch.setattr(attn, "_checked", {})
    with context():
        assert attn.kernel_for(torch.zeros(1, 1, 4, 8)).name == "cpu-flash"
    assert attn.take_warnings() == []


def test_the_check_leaves_the_global_rng_alone(monkeypatch):
    monkeypatch.setattr(attn, "_checked", {})
    torch.manual_seed(3)
    before = torch.get_rng_state()
    attn.kernel_for(torch.zeros(1, 1, 4, 8))
    assert torch.equal(torch.get_rng_state(), before)
    assert np.array_equal(torch.get_rng_state().numpy(), before.numpy())

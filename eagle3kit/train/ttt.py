"""The training-time-test loss (EAGLE3.md §2); the held-out acceptance is heldout.py's.

Alignment, as in the reference trainer: at position t the drafter gets the fused target
states g_t and the embedding of token t+1, and is trained toward the target's distribution
at t+1 (its prediction of token t+2). Step k of the unroll feeds the step k-1 output back as
the hidden input at the same positions, shifts ids, targets and the mask left by k, and
offsets the RoPE positions by k; `Eagle3Drafter.ttt_step` does the attention.
"""

from __future__ import annotations

import torch
from torch import nn

import eagle3kit.train.losses as losses
from eagle3kit.model import Eagle3Drafter, TTTState
from eagle3kit.train.losses import StepLoss
from eagle3kit.train.soft_ce import Step, soft_cross_entropy
from eagle3kit.train.target import TargetBatch, TargetHead


def shifted(x: torch.Tensor, k: int, length: int, fill: int | bool = 0) -> torch.Tensor:
    """x[:, 1+k : 1+k+length], padded with `fill` past the end: what step k reads."""
    part = x[:, 1 + k : 1 + k + length]
    missing = length - part.shape[1]
    if missing <= 0:
        return part
    pad = torch.full((x.shape[0], missing, *x.shape[2:]), fill, dtype=x.dtype, device=x.device)
    return torch.cat([part, pad], dim=1)


def loss_masks(batch: TargetBatch, t2d: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Per step k, [B, T-1] bool: the data carries loss at t+1+k and the target's greedy
    token there is in the draft vocabulary (positions past a row's end are False)."""
    keep = batch.loss_mask & t2d[batch.argmax]
    length = batch.ids.shape[1] - 1
    return [shifted(keep, k, length, False) for k in range(steps)]


def step_counts(batch: TargetBatch, t2d: torch.Tensor, steps: int) -> torch.Tensor:
    """[steps] loss-carrying positions per step: the denominators of the loss."""
    return torch.stack([m.sum() for m in loss_masks(batch, t2d, steps)]).double()


class TTTLoss(nn.Module):
    """Σ_k decay^k · the step loss of step k against the target's draft-vocabulary
    distribution, each step summed over its masked positions and divided by `counts[k]`
    (the global batch's count, so micro-batches and ranks add up to one mean). The step
    loss (losses.py, --loss) is the soft cross-entropy unless another is given; `auf`
    weighs the steps by accept-until-fail (soft_ce.py) and the target's distribution is
    taken at `teacher_temperature`."""

    head: TargetHead
    draft_ids: torch.Tensor  # a buffer

    def __init__(
        self,
        drafter: Eagle3Drafter,
        head: TargetHead,
        steps: int,
        decay: float,
        step_loss: StepLoss = losses.soft_cross_entropy,
        auf: str = "off",
        teacher_temperature: float = 1.0,
    ) -> None:
        super().__init__()
        self.drafter = drafter
        self.step_loss, self.auf = step_loss, auf
        self.teacher_temperature = teacher_temperature
        # Frozen and shared with the target: kept out of this module's parameters, state and
        # DDP's broadcast.
        self.__dict__["head"] = head
        self.steps, self.decay = steps, decay
        self.register_buffer(
            "draft_ids",
            drafter.d2t + torch.arange(len(drafter.d2t), device=drafter.d2t.device),
            persistent=False,
        )

    def forward(
        self, batch: TargetBatch | None, counts: torch.Tensor, autocast: torch.dtype | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(loss, per-step loss sums [steps], per-step correct counts [steps])."""
        if batch is None:  # a rank with nothing in this micro-batch still joins the reduce
            zero = sum((p * 0).sum() for p in self.drafter.trainable_parameters())
            assert isinstance(zero, torch.Tensor)  # a drafter always has trainable parameters
            empty = torch.zeros(self.steps, dtype=torch.float64, device=counts.device)
            return zero, empty, empty.clone()
        masks = loss_masks(batch, self.drafter.t2d, self.steps)
        length = batch.ids.shape[1] - 1
        positions = torch.arange(length, device=batch.ids.device)[None].expand(
            batch.ids.shape[0], -1
        )
        probs = self.head.draft_probs(
            batch.normed, self.draft_ids, self.teacher_temperature
        )  # [B, T, Vd]
        best = probs.argmax(-1)  # the target's top draft token, for the step accuracies
        state = TTTState()
        steps: list[Step] = []
        with torch.autocast(
            batch.ids.device.type, dtype=autocast or torch.bfloat16, enabled=autocast is not None
        ):
            hidden = self.drafter.project(batch.aux[:, :length])
            for k in range(self.steps):
                ids = shifted(batch.ids, k, length)
                hidden = self.drafter.ttt_step(hidden, ids, positions + k, state)
                n = length - k  # positions whose target lies inside the padded batch
                if n > 0:
                    coef = (self.decay**k) / counts[k].clamp_min(1).float()
                    steps.append(
                        Step(k, self.drafter.head_input(hidden[:, :n]), masks[k][:, :n], coef)
                    )
            total, sums, correct = soft_cross_entropy(
                self.drafter.lm_head.weight, probs, best, steps, self.step_loss, self.auf
            )
        pad = self.steps - len(steps)  # steps past a short batch's end carry nothing
        return (
            total,
            torch.cat([sums, sums.new_zeros(pad)]),
            torch.cat([correct, correct.new_zeros(pad)]),
        )

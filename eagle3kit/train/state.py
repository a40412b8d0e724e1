"""What a Trainer holds, declared once for its parts: `Setup`, `Checkpointing` and `Batches`
read and set these on the one Trainer object, and each part's methods are type-checked
against this list. Annotations only: nothing here sets a value (a part that asks
`getattr(self, "lock", None)` still finds nothing before the run directory is held)."""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

    import eagle3kit.train.data as tdata
    from eagle3kit import _ui
    from eagle3kit._lock import RunLock
    from eagle3kit._ranks import Ranks
    from eagle3kit.checkpoints.rundir import RunDir
    from eagle3kit.model import DraftVocab, Eagle3Drafter
    from eagle3kit.target import TargetHead
    from eagle3kit.train.config import TrainConfig
    from eagle3kit.train.online_server import ServedStates
    from eagle3kit.train.stopping import CheckpointClock, StopRequests
    from eagle3kit.train.target import OfflineTarget, OnlineTarget
    from eagle3kit.train.trackers import Trackers
    from eagle3kit.train.ttt import TTTLoss


class TrainerState:
    """The Trainer's attributes, in the order a run sets them."""

    # Trainer.__init__
    cfg: TrainConfig
    ranks: Ranks
    run_dir: RunDir
    device: torch.device
    autocast: torch.dtype | None
    # Trainer._run, before the set-up
    trust_remote_code: bool
    target_cfg: Any  # a transformers config of any architecture
    target_id: dict[str, Any]
    sources: list[tdata.Source]
    layers: list[int]
    max_len: int | None
    pool: tdata.Pool
    plan: tdata.Plan
    # Setup
    lock: RunLock
    previous: dict[str, Any]
    online: OnlineTarget
    offline: OfflineTarget
    head: TargetHead
    vocab: DraftVocab
    vocab_source: str
    drafter: Eagle3Drafter
    loss: TTTLoss
    model: nn.Module
    param_names: list[str]
    params: list[nn.Parameter]
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    # Checkpointing (a resumed run)
    tokens_before: int
    resumed_from: int
    # the loop
    trackers: Trackers | None
    """--report-to's trackers, on rank 0 (None elsewhere or without any)."""
    served: ServedStates
    stop: StopRequests
    stop_signal: signal.Signals | None
    clock: CheckpointClock
    progress: _ui.Progress
    tokens: int
    last_eval: dict | None
    best: dict | None
    """The evaluation with the highest held-out predicted AL so far (train/selection.py)."""
    last_loss: float
    _phase_markers: Any

"""`eagle3kit train`, the stage's entry: join the ranks, set the run up (setup.py), open
what it reports to, run the steps (loop.py), report. torch loads only when `run` is called,
so the package's face stays free to import."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from eagle3kit._ranks import Ranks
from eagle3kit.train.config import TrainConfig
from eagle3kit.train.report import report
from eagle3kit.train.result import TrainResult

if TYPE_CHECKING:
    from eagle3kit.train.setup import Setup
    from eagle3kit.train.trackers import Trackers


def run(cfg: TrainConfig) -> TrainResult:
    """Train (or continue) the run `cfg` describes, on every rank of a torchrun job."""
    import eagle3kit.train.checkpointing as checkpointing
    from eagle3kit.train.setup import build

    with Ranks.joined(cfg.device) as ranks:
        cfg = ranks.voiced(cfg)
        setup = build(cfg, ranks)
        try:
            if setup.continuing:  # resumed here: checkpointing reads the set-up, not back
                setup.resumed = checkpointing.resume(setup)
            result = train(setup)
        finally:
            setup.release()
    if ranks.rank == 0:
        report(result, cfg)
    return result


def train(setup: Setup) -> TrainResult:
    """The steps of a set-up run, after its run.json (rank 0) and with its trackers and,
    with --server, the servers' states fetched ahead."""
    import eagle3kit.train.checkpointing as checkpointing
    from eagle3kit.train.loop import TrainLoop

    trackers = None
    try:
        if setup.ranks.rank == 0:
            record = checkpointing.write_run_json(setup)
            setup.run_dir.cut_metrics(setup.start)
            trackers = _start_trackers(setup.cfg, record, setup.start)
        setup.ranks.barrier()
        if not setup.cfg.servers:
            return TrainLoop(setup, trackers).run()
        with setup.feed.serving(setup.start) as served:
            result = TrainLoop(setup, trackers).run()
        result.metrics["served"] = served.stats.to_dict()
        return result
    finally:
        if trackers is not None:
            trackers.finish()
            with contextlib.suppress(OSError, ValueError):  # a run that never began
                checkpointing.record_tracker_ids(setup.run_dir, trackers)


def _start_trackers(cfg: TrainConfig, record: dict, start: int) -> Trackers | None:
    """--report-to's trackers (rank 0), given the run's record minus its history; None
    without any."""
    from eagle3kit.train.trackers import Trackers, parse_report_to

    names, _ = parse_report_to(cfg.report_to)
    if not names:
        return None
    trackers = Trackers(names, cfg.out, start)
    config = {k: v for k, v in record.items() if k not in ("settings_history", "trackers")}
    trackers.start(config, record.get("trackers") or {})
    return trackers

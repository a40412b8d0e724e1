"""One run owns a dataset: every process of the run holds a shared flock on `.run.lock`.

The mechanism is the package's one (`eagle3kit/_lock.py`): the kernel drops the flock when
its process dies, SIGKILL included, and `.owner.json` names the run, so that processes of the
same run (torchrun ranks) join while any other run is refused with a message naming the
holder.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from eagle3kit._lock import Owned, RunLock, new_run_id
from eagle3kit._lock import acquire as _acquire
from eagle3kit.format._io import write_json_atomic
from eagle3kit.format.errors import DatasetError
from eagle3kit.format.layout import GATE_LOCK, OWNER, RUN_LOCK

__all__ = ["RunLock", "acquire", "new_run_id"]


def acquire(directory: Path, run_id: str, setup: Callable[[bool], None]) -> RunLock:
    """Join or start the run owning the dataset `directory`; refuse when another run holds
    it (see `eagle3kit._lock.acquire`)."""
    place = Owned(
        directory,
        "a dataset",
        directory / RUN_LOCK,
        directory / GATE_LOCK,
        directory / OWNER,
        DatasetError,
        write_json_atomic,
    )
    return _acquire(place, run_id, setup)

"""Experiment trackers: train's metrics sent to TensorBoard, Weights & Biases, MLflow or
Trackio (`--report-to`, the names and comma list of transformers' `report_to`).

Each tracker is an optional extra (`pip install 'eagle3kit[wandb]'`) read through one small
adapter: `start(config, recorded)` (the run's resolved config, logged once; what run.json
recorded of the tracker's run, to continue it), `log(step, metrics)`, `finish()`. A tracker
is never allowed to change or stop training: every call runs on one background thread, and an
adapter that raises is warned about once and dropped. Only rank 0 reports.

run.json may have been copied or edited, so the tracker run it names is continued only when
it is this run's own: eagle3kit keeps a random token in the run directory (TOKEN_FILE, never
in run.json) and marks each tracker run it opens with a hash of it and the directory
(`run_identity`). MLflow continues a run only under the tracking URI it was recorded with
and only when the run's tag is that hash; a W&B run's id is derived from the hash, so no
other id is ever resumed; Trackio continues only the run named as this one is. Otherwise a
new tracker run starts, with a note. MLflow without MLFLOW_TRACKING_URI and W&B without
WANDB_DIR write into the run directory, not the working directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import queue
import re
import secrets
import stat
import sys
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from eagle3kit import _text, _ui

KNOWN = ("tensorboard", "wandb", "mlflow", "trackio")
"""The trackers --report-to names, each with the module its extra installs."""
MODULES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow", "trackio": "trackio"}
FINISH_WAIT_S = 120.0
"""How long the end of a run waits for the trackers to take their last metrics."""
QUEUE_DEPTH = 10_000
"""Calls held for a slow tracker before newer metrics are dropped (training never waits)."""
TOKEN_FILE = ".trackers-token"
"""The run directory's secret: 64 hex digits eagle3kit writes once (owner-only)."""
IDENTITY_TAG = "eagle3kit.run_identity"
"""The MLflow tag holding a run's identity (the hash, never the token)."""


def parse_report_to(value: str) -> tuple[list[str], list[str]]:
    """--report-to as a list of tracker names, and the problems found (naming the flag)."""
    names = [n.strip().lower() for n in value.split(",") if n.strip()]
    if names in ([], ["none"]):
        return [], []
    problems = []
    unknown = [n for n in names if n not in KNOWN]
    if unknown:
        problems.append(
            f"--report-to: unknown tracker {', '.join(unknown)} (known: none, {', '.join(KNOWN)})"
        )
    missing = [n for n in names if n in KNOWN and importlib.util.find_spec(MODULES[n]) is None]
    problems += [
        f"--report-to {n}: {MODULES[n]} is not installed (pip install 'eagle3kit[{n}]')"
        for n in missing
    ]
    return list(dict.fromkeys(names)), problems


class Tracker(Protocol):
    """One tracker's adapter; each call may raise (it is then dropped, with one warning)."""

    def start(self, config: dict, recorded: Any) -> Any:
        """Open the tracker's run, continuing the one run.json recorded (`recorded`, as this
        method returned it) only when it is this run's own; what run.json is to record."""

    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def finish(self) -> None: ...


# The metrics sent ------------------------------------------------------------------------------
def step_metrics(record: dict, waiting_share: float | None = None) -> dict[str, float]:
    """A metrics.jsonl record (a step's or an evaluation's) as flat tracker metrics."""
    out: dict[str, float] = {}
    if "eval" in record:
        ev = record["eval"] or {}
        if "predicted_acceptance_length" in ev:
            out["eval/acceptance_length"] = ev["predicted_acceptance_length"]
        for i, a in enumerate(ev.get("per_position", [])):
            out[f"eval/accept_rate_{i + 1}"] = a
        for phase, figures in (ev.get("phases") or {}).items():
            out[f"eval/acceptance_length_{_key(phase)}"] = figures["predicted_acceptance_length"]
        for figures in (ev.get("depths") or {}).values():  # keyed by where the bucket starts
            out[f"eval/acceptance_length_depth_{figures['from']}"] = figures[
                "predicted_acceptance_length"
            ]
        return out
    for name in ("loss", "lr", "grad_norm", "tokens_per_s"):
        if name in record:
            out[f"train/{name}"] = record[name]
    for i, a in enumerate(record.get("acc_k", [])):
        out[f"train/accuracy_step_{i + 1}"] = a
    if waiting_share is not None:
        out["train/server_waiting_share"] = waiting_share
    return {k: float(v) for k, v in out.items()}


def _key(name: str) -> str:
    """A name every tracker takes as part of a metric key."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", str(name))


def flat_config(config: dict, prefix: str = "") -> dict[str, str]:
    """A nested config as flat string parameters (MLflow's params are strings)."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat_config(value, name + "."))
        else:
            out[name] = str(value)[:500]
    return out


# Whose tracker run it is ---------------------------------------------------------------------
def _read_token(path: Path) -> str | None:
    """The token in `path`: a regular file (never through a link), 64 hex digits."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        text = f.read(65).decode(errors="replace").strip()
    return text if re.fullmatch("[0-9a-f]{64}", text) else None


def run_identity(run_dir: Path) -> str | None:
    """This run directory's identity: a hash of its token (written here, owner-only, the
    first time) and its absolute path, so a copy elsewhere is another run; None, with a
    note, when TOKEN_FILE is there but is not a token eagle3kit wrote."""
    path = run_dir / TOKEN_FILE
    try:
        token = _read_token(path)
    except FileNotFoundError:
        token = secrets.token_hex(32)
        try:
            fd = os.open(
                path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
            )
        except FileExistsError:  # a link left dangling there
            token = None
        else:
            with os.fdopen(fd, "w") as f:
                f.write(token + "\n")
    except OSError:  # a link (ELOOP), a FIFO's open, no permission
        token = None
    if token is None:
        _ui.warn(
            f"--report-to: {path} is not the token eagle3kit writes (a link, not a file, "
            "or other content): this run's tracker runs cannot be told from others', so "
            "none is continued; remove it to have a new one written"
        )
        return None
    digest = hashlib.sha256(f"{token}\0{run_dir.resolve()}".encode())
    return digest.hexdigest()


LABELS = {"wandb": "W&B", "mlflow": "MLflow", "trackio": "Trackio"}


def _note_new(name: str, recorded: Any, why: str) -> None:
    label = LABELS[name]
    _ui.warn(
        f"--report-to {name}: run.json names {label} run "
        f"{_text.printable(str(recorded)[:200])}, which {why}; starting a new {label} run"
    )


# The adapters ----------------------------------------------------------------------------------
class TensorBoard:
    """Event files under RUN/tensorboard (or $TENSORBOARD_LOGGING_DIR); a resumed run drops
    the events past its checkpoint and goes on in the same directory."""

    def __init__(self, run_dir: Path, name: str, start_step: int) -> None:
        self.dir = Path(os.environ.get("TENSORBOARD_LOGGING_DIR") or run_dir / "tensorboard")
        self.start_step = start_step
        self.writer: Any = None

    def start(self, config: dict, recorded: Any) -> Any:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(self.dir), purge_step=self.start_step)
        if self.start_step == 0:
            import json

            self.writer.add_text("config", "```\n" + json.dumps(config, indent=2) + "\n```")
        return None

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def finish(self) -> None:
        self.writer.close()


class Wandb:
    """WANDB_PROJECT (default eagle3kit), WANDB_NAME (default the run directory's name),
    WANDB_MODE=offline, WANDB_DIR (default the run directory) and the rest as wandb reads
    them. The run's id is derived from the run directory's identity: a resumed run goes on
    in its own W&B run, and no id run.json names is ever resumed."""

    def __init__(self, run_dir: Path, name: str, start_step: int) -> None:
        self.run_dir, self.name = run_dir, name
        self.run: Any = None

    def start(self, config: dict, recorded: Any) -> Any:
        import wandb

        identity = run_identity(self.run_dir)
        own = None if identity is None else identity[:32]
        if recorded and recorded != own:
            _note_new(
                "wandb",
                recorded,
                "is not this run's own (its id is not the one this run directory's token gives)",
            )
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or "eagle3kit",
            name=os.environ.get("WANDB_NAME") or self.name,
            dir=os.environ.get("WANDB_DIR") or str(self.run_dir),
            config=None if own and recorded == own else config,
            id=own,
            resume="allow" if own else None,
        )
        return str(self.run.id)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def finish(self) -> None:
        self.run.finish()


class Mlflow:
    """MLFLOW_TRACKING_URI (default an SQLite store in the run directory, RUN/mlflow.db),
    MLFLOW_EXPERIMENT_NAME (default eagle3kit) and MLFLOW_RUN_NAME (default the run
    directory's name) as MLflow reads them. run.json records the run's id and tracking URI;
    the run is continued only under that URI and only when its IDENTITY_TAG is this run
    directory's identity (a copied or edited run.json names someone else's run)."""

    def __init__(self, run_dir: Path, name: str, start_step: int) -> None:
        self.run_dir, self.name = run_dir, name
        self.client: Any = None
        self.run_id = ""

    def start(self, config: dict, recorded: Any) -> Any:
        from mlflow.tracking import MlflowClient

        uri = (
            os.environ.get("MLFLOW_TRACKING_URI")
            or f"sqlite:///{(self.run_dir / 'mlflow.db').resolve()}"
        )
        self.client = MlflowClient(tracking_uri=uri)
        identity = run_identity(self.run_dir)
        resumed = self._own(recorded, uri, identity)
        if resumed is not None:
            self.run_id = resumed
            self.client.update_run(resumed, status="RUNNING")
            return {"id": resumed, "uri": uri}
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "eagle3kit"
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self.client.create_experiment(name)
        )
        run = self.client.create_run(
            experiment_id,
            run_name=os.environ.get("MLFLOW_RUN_NAME") or self.name,
            tags={IDENTITY_TAG: identity} if identity else None,
        )
        self.run_id = run.info.run_id
        from mlflow.entities import Param

        params = [Param(k, v) for k, v in flat_config(config).items()]
        for i in range(0, len(params), 100):  # MLflow's batch limit
            self.client.log_batch(self.run_id, params=params[i : i + 100])
        return {"id": self.run_id, "uri": uri}

    def _own(self, recorded: Any, uri: str, identity: str | None) -> str | None:
        """The recorded run's id when it is this run's own; else None, with a note."""
        if not recorded:
            return None
        run_id = recorded.get("id") if isinstance(recorded, dict) else None
        if not isinstance(run_id, str) or not re.fullmatch("[0-9a-f]{1,64}", run_id):
            _note_new(
                "mlflow",
                recorded,
                "is not recorded as eagle3kit records its own (an id and its tracking URI)",
            )
            return None
        if recorded.get("uri") != uri:
            _note_new(
                "mlflow",
                run_id,
                f"was recorded under another tracking URI "
                f"({_text.printable(str(recorded.get('uri'))[:200])})",
            )
            return None
        from mlflow.exceptions import MlflowException

        try:
            tags = self.client.get_run(run_id).data.tags
        except MlflowException:
            _note_new("mlflow", run_id, f"is not in {uri}")
            return None
        if identity is None or tags.get(IDENTITY_TAG) != identity:
            _note_new(
                "mlflow",
                run_id,
                "is not this run's own (its tag is not this run directory's identity)",
            )
            return None
        return run_id

    def log(self, step: int, metrics: dict[str, float]) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(
            self.run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()]
        )

    def finish(self) -> None:
        self.client.set_terminated(self.run_id)


class Trackio:
    """TRACKIO_PROJECT (default eagle3kit), TRACKIO_DIR as trackio reads it, the run named
    after the run directory (or TRACKIO_RUN_NAME); resumed only by that name, whatever other
    name run.json records."""

    def __init__(self, run_dir: Path, name: str, start_step: int) -> None:
        self.name = os.environ.get("TRACKIO_RUN_NAME") or name

    def start(self, config: dict, recorded: Any) -> Any:
        import trackio

        resume = recorded == self.name
        if recorded and not resume:
            _note_new("trackio", recorded, f"is not the name this run reports as ({self.name})")
        trackio.init(
            project=os.environ.get("TRACKIO_PROJECT") or "eagle3kit",
            name=self.name,
            config=None if resume else config,
            resume="allow" if resume else "never",
        )
        return self.name

    def log(self, step: int, metrics: dict[str, float]) -> None:
        import trackio

        trackio.log(metrics, step=step)

    def finish(self) -> None:
        import trackio

        trackio.finish()


ADAPTERS: dict[str, Callable[[Path, str, int], Tracker]] = {
    "tensorboard": TensorBoard,
    "wandb": Wandb,
    "mlflow": Mlflow,
    "trackio": Trackio,
}
"""How each name is opened: (run directory, run name, first step) -> adapter."""


# All of them, off the training thread --------------------------------------------------------
class Trackers:
    """The trackers of one run, fed from one background thread: training only enqueues, and
    each adapter is built, started and called there."""

    def __init__(self, names: list[str], run_dir: Path, start_step: int) -> None:
        self.names, self.run_dir, self.start_step = names, run_dir, start_step
        self.adapters: dict[str, Tracker] = {}
        self.ids: dict[str, Any] = {}
        self._calls: queue.Queue = queue.Queue(QUEUE_DEPTH)
        self._dropped = False
        self._thread: threading.Thread | None = None

    def start(self, config: dict, recorded: dict[str, Any]) -> None:
        """Open every tracker, continuing the runs run.json recorded that are this run's."""
        if not self.names:
            return
        self._thread = threading.Thread(target=self._work, name="trackers", daemon=True)
        self._thread.start()
        recorded = recorded if isinstance(recorded, dict) else {}  # run.json may be edited
        for name in self.names:
            self._put(name, partial(self._open, name, config, recorded.get(name)))

    def _open(self, name: str, config: dict, recorded: Any) -> None:
        adapter = ADAPTERS[name](self.run_dir, self.run_dir.resolve().name, self.start_step)
        run_id = adapter.start(config, recorded)
        self.adapters[name] = adapter
        if run_id is not None:
            self.ids[name] = run_id

    def _call(self, name: str, method: str, *args: Any) -> None:
        getattr(self.adapters[name], method)(*args)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for name in self.names:
            self._put(name, partial(self._call, name, "log", step, metrics))

    def finish(self) -> None:
        """Close every tracker, waiting a bounded time for what is queued."""
        if self._thread is None:
            return
        for name in self.names:
            self._put(name, partial(self._call, name, "finish"))
        self._put(None, None)
        self._thread.join(FINISH_WAIT_S)
        if self._thread.is_alive():
            _ui.warn(
                f"--report-to: the trackers took longer than {FINISH_WAIT_S:.0f} s to "
                "take the last metrics; left behind"
            )

    def _put(self, name: str | None, call: Callable[[], Any] | None) -> None:
        try:
            self._calls.put_nowait((name, call))
        except queue.Full:
            if not self._dropped:
                self._dropped = True
                _ui.warn(
                    "--report-to: the trackers are falling behind; metrics are dropped "
                    "rather than training slowed"
                )

    def _work(self) -> None:
        failed: set[str] = set()
        while True:
            name, call = self._calls.get()
            if call is None:
                return
            if name in failed:
                continue
            try:
                # A tracker's own lines (trackio prints where it logs) go to stderr: stdout
                # holds only the command's result (--json), printed after finish().
                with contextlib.redirect_stdout(sys.stderr):
                    call()
            except Exception as exc:  # any tracker failure: warned once, then it is off
                assert name is not None
                failed.add(name)
                _ui.warn(
                    f"--report-to {name}: {type(exc).__name__}: {exc}; "
                    f"{name} gets nothing more from this run (training goes on)"
                )

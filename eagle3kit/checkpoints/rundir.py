"""The run directory: run.json, metrics.jsonl, vocab.safetensors, checkpoints/, drafter/.

The one module that knows this layout: train writes it, and export, info, quickstart and
the checkpoint readers find a run's record and drafter through `RunDir` (an export's
provenance file is provenance.py's; a checkpoint's random and optimizer state,
resume_state.py's). Importing it loads no torch.

Checkpoints are written whole or not at all: into a hidden temp directory, every file
fsynced, then renamed to checkpoints/step-XXXXXXXX and the parent fsynced. A run killed at
any moment resumes from the newest complete one.

A run directory may have been copied from elsewhere: wherever the run keeps a file or folder
of its own, a symbolic link (or a FIFO, socket or device) is refused by name before anything
is read, written or deleted there (`RunDir.check_no_links`), so that a run never resumes from,
writes into or rotates away another run's checkpoints through a link.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from eagle3kit import __version__
from eagle3kit._durable import (
    fsync_file,
    odd_file,
    publish_dir,
    write_json_atomic,
    write_text_atomic,
)
from eagle3kit._json import json_object
from eagle3kit._lock import Owned, RunLock, acquire
from eagle3kit.errors import UserError

RUN_FORMAT = "eagle3kit-run"
RUN_VERSION = 1
RUN_JSON = "run.json"
DRAFTER = "drafter"
"""The run's drafter, a checkpoint any EAGLE-3 reader loads (eagle3kit's layout): the best
evaluated step, or the last (train --drafter-step); run.json's `selection` says which."""
CHECKPOINTS = "checkpoints"
STEP_DIR = re.compile(r"^step-(\d{8})$")
TENSORBOARD = "tensorboard"
"""Where train's tensorboard tracker writes its event files (unless TENSORBOARD_LOGGING_DIR)."""
OUR_FILES = (RUN_JSON, "metrics.jsonl", "vocab.safetensors", CHECKPOINTS, DRAFTER)
OWN_FOLDERS = (CHECKPOINTS, DRAFTER, TENSORBOARD)
"""The run's folders: every name in them is the run's own too."""
METRICS_LINE_BYTES = 1 << 20
"""The longest metrics.jsonl line read back: train's longest, an evaluation with its phase
and depth figures, is a few KiB."""
METRIC_FIGURES = ("loss", "lr", "grad_norm", "tokens_per_s")
"""The numbers of a step's metrics.jsonl record that are read back (info --plot, trackers)."""
MAX_TTT_STEPS = 64
"""The most TTT accuracies a metrics.jsonl line may hold where run.json names no count."""
MAX_RECORDED_TTT_STEPS = 1024
"""A count run.json records past this is not taken (each step is one series of a plot)."""


def valid_ttt_steps(value: object) -> int | None:
    """A --ttt-steps a file records, when it is one: a positive integer up to
    MAX_RECORDED_TTT_STEPS (run.json and config.json may be someone else's)."""
    if (
        isinstance(value, int)
        and not isinstance(value, bool)
        and 0 < value <= MAX_RECORDED_TTT_STEPS
    ):
        return value
    return None


LOCK_FILES = (".run.lock", ".gate.lock", ".owner.json")
"""The run's lock (held by every process of the train that owns the directory), the gate
taking it goes through, and the file naming the holder (eagle3kit/_lock.py)."""


_LOCK_TEMP = re.compile(r"^\.(" + "|".join(re.escape(n) for n in LOCK_FILES) + r")\.\d+\.tmp$")


def _is_lock_file(name: str) -> bool:
    """One of the lock files, or the temp file the owner file is written through: torchrun's
    first rank may be writing it while another rank looks whether the directory is empty."""
    return name in LOCK_FILES or _LOCK_TEMP.match(name) is not None


def read_json_object(path: Path) -> dict | None:
    """`path` as a JSON object; None when it is missing, unreadable or something else (a link
    or a FIFO is not opened: a FIFO would block the read)."""
    if odd_file(path) is not None:
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class RunDir:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.run_json = self.path / RUN_JSON
        self.metrics = self.path / "metrics.jsonl"
        self.vocab = self.path / "vocab.safetensors"
        self.checkpoints = self.path / CHECKPOINTS
        self.drafter = self.path / DRAFTER
        self.tensorboard = self.path / TENSORBOARD

    @classmethod
    def holding(cls, checkpoint: Path) -> RunDir | None:
        """The run whose drafter/ `checkpoint` is, if it is one."""
        checkpoint = Path(checkpoint)
        run = cls(checkpoint.parent)
        return run if checkpoint.name == DRAFTER and run.exists() else None

    # Opening ----------------------------------------------------------------------------------
    def exists(self) -> bool:
        return self.run_json.is_file()

    def has_drafter(self) -> bool:
        return (self.drafter / "config.json").is_file()

    def record(self) -> dict | None:
        """run.json as it is, for a reader that only looks (None when unreadable)."""
        return read_json_object(self.run_json)

    def load(self, fix: str = "") -> dict:
        """run.json's record for a stage that reads what it can of it (export): a JSON
        object, else one message naming the file (and `fix`)."""
        self.check_no_links()
        try:
            text = self.run_json.read_text()
        except OSError as exc:
            raise UserError(f"{self.run_json}: unreadable ({exc.strerror}){fix}") from None
        try:
            return json_object(text, str(self.run_json))
        except UserError as exc:
            raise UserError(f"{exc}{fix}") from None

    def read(self) -> dict:
        """run.json for continuing the run: refused when it is not a run this eagle3kit
        writes."""
        data = self.load("; rerun with --overwrite to start afresh")
        if data.get("format") != RUN_FORMAT:
            raise UserError(f"{self.run_json}: not an eagle3kit run")
        if data.get("version", 0) > RUN_VERSION:
            raise UserError(
                f"{self.run_json}: run format {data.get('version')} is newer than "
                f"this eagle3kit ({__version__}) reads; upgrade eagle3kit"
            )
        return data

    def is_ours(self) -> bool:
        """run.json is a run record eagle3kit wrote (another trainer's run.json is not)."""
        return (self.record() or {}).get("format") == RUN_FORMAT

    def is_empty(self) -> bool:
        """Nothing here but the run's lock files (a missing directory is empty too)."""
        if not self.path.exists():
            return True
        return all(_is_lock_file(p.name) for p in self.path.iterdir())

    def check_usable(self, mode: str) -> bool:
        """Whether a run continues here; refuse a directory that is something else, or one
        with a link where the run keeps its own files (in every mode: a run resumes from,
        writes into and rotates away only what is inside its directory)."""
        self.check_no_links()
        if mode == "overwrite":
            self._check_overwritable()
            return False
        if self.exists():
            return True
        if mode == "resume":
            raise UserError(
                f"{self.path}: no run to resume (no run.json); drop --resume to start one"
            )
        if not self.is_empty():
            raise UserError(
                f"{self.path}: exists and is not a training run (no run.json); give a new directory"
            )
        return False

    def _check_overwritable(self) -> None:
        """--overwrite deletes checkpoints/, drafter/ and metrics.jsonl: only in a run
        directory eagle3kit wrote, or an empty one, never in another trainer's folder."""
        if self.is_empty() or self.is_ours():
            return
        if self.exists():
            raise UserError(
                f"{self.run_json}: not a run record eagle3kit wrote; --overwrite "
                "starts afresh only in a run directory or an empty one: give a "
                "new directory"
            )
        raise UserError(
            f"{self.path}: not a training run (no run.json); --overwrite starts "
            "afresh only in a run directory or an empty one: give a new directory"
        )

    def own_paths(self) -> list[Path]:
        """Every path the run keeps its own things at that is there now: its files and
        folders, the drafter's temp and set-aside folders, and all that those folders hold
        (looked at without following a link)."""
        drafter_temps = sorted(self.path.glob(f".{DRAFTER}.tmp*"))
        found = [self.path / name for name in (*OUR_FILES, TENSORBOARD)] + drafter_temps
        for top in [self.path / name for name in OWN_FOLDERS] + drafter_temps:
            if odd_file(top) != "a directory":
                continue
            for folder, dirs, files in os.walk(top):  # never descends into a link
                found += [Path(folder) / name for name in (*dirs, *files)]
        return found

    def check_no_links(self) -> None:
        """Refuse a symbolic link (or a FIFO, socket or device) wherever the run keeps its own
        files: a run directory copied from elsewhere may link checkpoints/ to another run's,
        and a link's target is not this run's to resume from, write into or delete."""
        for path in self.own_paths():
            odd = odd_file(path)
            if odd not in (None, "a directory"):
                target = f" (to {os.readlink(path)})" if odd == "a symbolic link" else ""
                raise UserError(
                    f"{path}: {odd}{target} where a run keeps its own files; "
                    "eagle3kit reads and writes a run only inside its directory: "
                    "remove it, or give a new directory"
                )
        for name in LOCK_FILES:  # looked at again as they are opened (eagle3kit/_lock.py)
            odd = odd_file(self.path / name)
            if odd is not None:
                what = (
                    "the file naming a directory's owner"
                    if name == ".owner.json"
                    else "a lock file of its own"
                )
                raise UserError(
                    f"{self.path / name}: {odd} where eagle3kit keeps {what}; "
                    "refused (remove it: eagle3kit makes it again)"
                )

    def clear(self) -> None:
        """--overwrite: remove what a run wrote (and nothing else), refusing links first.
        run.json goes last, so that a clear cut short still leaves a directory --overwrite
        recognises as a run."""
        self.check_no_links()
        for name in (*(n for n in OUR_FILES if n != RUN_JSON), RUN_JSON):
            p = self.path / name
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            elif p.is_symlink() or p.exists():
                p.unlink()

    def hold(self, run_id: str) -> RunLock:
        """Take the run directory for the train `run_id` (its ranks join it) until released
        or the process ends; another train holding it is refused, named."""
        self.path.mkdir(parents=True, exist_ok=True)
        lock, gate, owner = (self.path / name for name in LOCK_FILES)
        return acquire(Owned(self.path, "a run directory", lock, gate, owner), run_id)

    # Checkpoints -------------------------------------------------------------------------------
    def steps(self) -> list[int]:
        if not self.checkpoints.is_dir():
            return []
        found = []
        for p in self.checkpoints.iterdir():
            m = STEP_DIR.match(p.name)
            if m and (p / "state.json").is_file():
                found.append(int(m.group(1)))
        return sorted(found)

    def step_dir(self, step: int) -> Path:
        return self.checkpoints / f"step-{step:08d}"

    def temp_dir(self, step: int) -> Path:
        return self.checkpoints / f".step-{step:08d}.tmp"

    def begin_checkpoint(self, step: int) -> Path:
        tmp = self.temp_dir(step)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        # Temp dirs of checkpoints a crash interrupted are garbage (and old ones it left aside).
        for p in self.checkpoints.glob(".step-*.tmp*"):
            if p != tmp:
                shutil.rmtree(p, ignore_errors=True)
        return tmp

    def commit_checkpoint(self, step: int, keep: int) -> None:
        publish_dir(self.temp_dir(step), self.step_dir(step))
        for old in self.steps()[:-keep]:
            shutil.rmtree(self.step_dir(old), ignore_errors=True)

    # The drafter -----------------------------------------------------------------------------
    @property
    def drafter_temp(self) -> Path:
        """Where the next drafter/ is written before it replaces the one there whole."""
        return self.path / f".{DRAFTER}.tmp"

    def begin_drafter(self) -> Path:
        tmp = self.drafter_temp
        if tmp.exists():
            shutil.rmtree(tmp)
        return tmp

    def publish_drafter(self) -> None:
        """The drafter written into `drafter_temp` becomes drafter/, whole: a run killed at
        any moment leaves the old drafter/ or the new one, never a mix of two steps."""
        publish_dir(self.drafter_temp, self.drafter)

    def recover_drafter(self) -> None:
        """A run killed between publish_dir's two renames left drafter/ under its hidden
        name: put it back."""
        if self.drafter.exists():
            return
        for aside in sorted(self.path.glob(f".{DRAFTER}.tmp-old-*")):
            if (aside / "config.json").is_file():
                aside.rename(self.drafter)
                return

    def update_record(self, **fields: Any) -> None:
        """Set `fields` in run.json (rank 0, atomically), keeping the rest as it is."""
        record = self.record() or {}
        if all(record.get(k) == v for k, v in fields.items()):
            return
        write_json_atomic(self.run_json, {**record, **fields})

    # Metrics -----------------------------------------------------------------------------------
    def log(self, record: dict) -> None:
        # Never through a link planted at that name since the run directory was checked.
        fd = os.open(
            self.metrics,
            os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o644,
        )
        with os.fdopen(fd, "a") as f:
            f.write(json.dumps(record, default=float) + "\n")

    def ttt_steps(self) -> int:
        """The most TTT steps run.json records (a step's `acc_k` has one accuracy each),
        counting settings a forced resume changed; MAX_TTT_STEPS where it records none."""
        record = self.record() or {}
        history = record.get("settings_history")
        settings = [
            record.get("config"),
            record.get("settings"),
            *(
                entry.get("settings")
                for entry in (history if isinstance(history, list) else [])
                if isinstance(entry, dict)
            ),
        ]
        found = [valid_ttt_steps(s.get("ttt_steps")) for s in settings if isinstance(s, dict)]
        return max((n for n in found if n is not None), default=MAX_TTT_STEPS)

    def metric_records(self) -> Iterator[tuple[str, dict]]:
        """(line, record) for each line of metrics.jsonl in the form train writes it; the
        rest is passed over: a line cut short by a kill, and whatever eagle3kit did not
        write (text where a number goes, a bare list, a step that is no count, more TTT
        accuracies than the run has steps, a line past METRICS_LINE_BYTES, bytes that are
        not UTF-8)."""
        if not self.metrics.is_file():
            return
        ttt_steps = self.ttt_steps()
        with open(self.metrics, "rb") as f:
            for raw in _bounded_lines(f, METRICS_LINE_BYTES):
                try:
                    line = raw.decode().rstrip("\n")
                    record = json.loads(line)
                except (ValueError, RecursionError):  # not UTF-8, not JSON, nested too deep
                    continue
                if _is_metrics_record(record, ttt_steps):
                    yield line, record

    def cut_metrics(self, step: int) -> None:
        """Drop the lines of steps after `step` (all of them for 0): a resumed run writes
        them again. Lines train did not write go too."""
        if not self.metrics.is_file():
            return
        kept = [
            line
            for line, record in self.metric_records()
            if 0 < record["step"] <= step or (step and record["step"] == 0)
        ]
        write_text_atomic(self.metrics, "".join(line + "\n" for line in kept))

    def sync_metrics(self) -> None:
        if self.metrics.is_file():
            fsync_file(self.metrics)


def _bounded_lines(f: BinaryIO, limit: int) -> Iterator[bytes]:
    """The lines of `f`, each read whole only up to `limit` bytes: a longer one is skipped
    without being held."""
    while line := f.readline(limit + 1):
        if len(line) <= limit:
            yield line
            continue
        while line and not line.endswith(b"\n"):
            line = f.readline(limit)


def _is_count(value: object) -> bool:
    return type(value) is int and 0 <= value < 2**63


def _is_figure(value: object) -> bool:
    """A number as train logs one: a float (NaN and infinity included: a diverged loss), or
    an int within 64 bits (a 400-digit one does not even convert to a float)."""
    return type(value) is float or (type(value) is int and abs(value) < 2**63)


def _is_metrics_record(record: object, ttt_steps: int) -> bool:
    """Whether a metrics.jsonl record has the form train writes, in the fields read back."""
    if not isinstance(record, dict) or not _is_count(record.get("step")):
        return False
    if any(key in record and not _is_figure(record[key]) for key in METRIC_FIGURES):
        return False
    accuracies = record.get("acc_k", [])
    if not (
        isinstance(accuracies, list)
        and len(accuracies) <= ttt_steps
        and all(_is_figure(a) for a in accuracies)
    ):
        return False
    evaluation = record.get("eval")
    if evaluation is None:
        return True
    return isinstance(evaluation, dict) and (
        evaluation.get("predicted_acceptance_length") is None
        or _is_figure(evaluation["predicted_acceptance_length"])
    )


def options_diff(before: dict, now: dict) -> list[str]:
    """'--flag: old -> new' for each setting that differs."""
    out = []
    for key in sorted(set(before) | set(now)):
        if before.get(key) != now.get(key):
            flag = "--" + key.replace("_", "-")
            if key in ("data", "target"):
                flag = key
            out.append(f"{flag}: {before.get(key)!r} -> {now.get(key)!r}")
    return out

"""Output layer: status lines, plain/live progress, quiet mode, JSON on stdout, lazy rich."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from eagle3kit import _ui
from eagle3kit._ui import OutputOptions, Progress
from eagle3kit.errors import UserError

REPO = Path(__file__).resolve().parents[1]


class FakeClock:
    """A clock the test moves by hand, so timing is exact and nothing sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_status_line_shows_progress_rates_errors_and_eta(capsys: pytest.CaptureFixture[str]):
    clock = FakeClock()
    with Progress("convert", 5000, OutputOptions(), clock=clock) as p:
        clock.now += 4
        p.add(1200, tokens=1_248_000, errors=0)
        line = p.status_line()
    # 1200 in 4 s = 300/s; 1,248,000 tokens in 4 s = 312k/s; 3800 left at 300/s = 12.7 s.
    assert line == (
        "convert 1,200/5,000 (24.0%) 300 samples/s 312k tok/s errors 0 elapsed 4s ETA 12s"
    )
    assert p.elapsed == 4 and p.rate == 300


def test_status_line_without_total_counters_and_gauges(capsys: pytest.CaptureFixture[str]):
    clock = FakeClock()
    with Progress("fetch", None, OutputOptions(), unit="requests", clock=clock) as p:
        clock.now += 90
        p.add(45, errors=1, retries=0, truncated=2)
        p.add(45, errors=2)
        p.set(in_flight=64)
        p.set(in_flight=8)  # a gauge is overwritten, not summed
        line = p.status_line()
    assert line.startswith("fetch 90 requests 1.00 requests/s ")
    assert "errors 3" in line and "truncated 2" in line and "in_flight 8" in line
    assert "retries" not in line  # zero counters stay out of the way
    assert "tok/s" not in line and "ETA" not in line and "%" not in line
    assert "elapsed 1m30s" in line


def test_resumed_work_counts_toward_done_but_not_rate(capsys: pytest.CaptureFixture[str]):
    clock = FakeClock()
    with Progress("convert", 1000, OutputOptions(), clock=clock, initial=600) as p:
        clock.now += 10
        p.add(100)
    assert p.done == 700 and p.rate == 10
    assert "700/1,000 (70.0%)" in p.status_line()
    clock.now += 50
    assert p.elapsed == 10  # frozen at exit, so summaries read the run's own time


def test_plain_mode_logs_at_most_once_per_interval_and_ends_with_totals(
    capsys: pytest.CaptureFixture[str],
):
    clock = FakeClock()
    with Progress("convert", 35, OutputOptions(log_every=10), clock=clock) as p:
        assert p.mode == "plain"  # captured stderr is not a terminal
        for _ in range(35):
            clock.now += 1
            p.add(tokens=100)
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == ""
    # Lines at 10 s, 20 s, 30 s, then the final one at 35 s.
    assert len(lines) == 4
    assert [line.split()[1] for line in lines] == ["10/35", "20/35", "30/35", "35/35"]
    assert lines[-1].startswith("convert 35/35 (100.0%) 1.00 samples/s 100 tok/s errors 0")
    assert "ETA" not in lines[-1]


def test_final_line_says_the_run_stopped(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(RuntimeError), Progress("train", 10, OutputOptions()) as p:
        p.add(3)
        raise RuntimeError("boom")
    err = capsys.readouterr().err
    assert "train 3/10" in err and err.rstrip().endswith("(stopped: RuntimeError)")


def test_no_progress_still_gives_plain_lines(capsys: pytest.CaptureFixture[str]):
    with Progress("x", 2, OutputOptions(no_progress=True)) as p:
        p.add(2)
    assert p.mode == "plain"
    assert capsys.readouterr().err.startswith("x 2/2 (100.0%)")


def test_quiet_prints_only_warnings_and_errors(capsys: pytest.CaptureFixture[str]):
    opts = OutputOptions(quiet=True)
    _ui.info("hello", opts)
    _ui.table("T", ["a"], [[1]], opts)
    _ui.checklist([(True, "a", "")], opts)
    _ui.kv("K", [("a", 1)], opts)
    with Progress("p", 10, opts) as p:
        p.add(10)
    assert p.mode == "off"
    assert capsys.readouterr() == ("", "")
    _ui.warn("disk nearly full")
    _ui.error("no such file: x.jsonl")
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "warning: disk nearly full\nerror: no such file: x.jsonl\n"


def test_info_goes_to_stderr(capsys: pytest.CaptureFixture[str]):
    _ui.info("reading [bold]x[/bold]")
    assert capsys.readouterr() == ("", "reading [bold]x[/bold]\n")


def test_print_json_goes_to_stdout_only_and_parses(capsys: pytest.CaptureFixture[str]):
    obj = {"acc": np.float32(0.5), "n": np.int64(3), "ids": np.arange(3), 7: "k", "p": Path("/d")}
    _ui.print_json(obj)
    out, err = capsys.readouterr()
    assert err == ""
    assert out.endswith("}\n") and '\n  "acc"' in out  # indented two spaces, newline-terminated
    assert json.loads(out) == {"acc": 0.5, "n": 3, "ids": [0, 1, 2], "7": "k", "p": "/d"}


def test_checklist_numbers_marks_and_aligns(capsys: pytest.CaptureFixture[str]):
    items = [(True, "tokenizer", "matches"), (False, "chat template", "differs at 12"),
             (None, "gpu", "skipped: no CUDA")] * 4  # fmt: skip
    _ui.checklist(items)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 12
    assert lines[0] == " 1. ✓ tokenizer      matches"
    assert lines[1] == " 2. ✗ chat template  differs at 12"
    assert lines[2] == " 3. – gpu            skipped: no CUDA"
    assert lines[11].startswith("12. – gpu")


def test_table_and_kv_print_text_verbatim(capsys: pytest.CaptureFixture[str]):
    _ui.table("Acceptance", ["position", "rate"], [["[0]", 0.812345], [":smile:", None]])
    _ui.kv("Dataset", [("path", "/data/[x].jsonl"), ("samples", 1200)])
    err = capsys.readouterr().err
    # Markup and emoji codes are data here: paths and prompts contain them.
    assert "Acceptance" in err and "[0]" in err and ":smile:" in err and "0.8123" in err
    assert "Dataset\n  path     /data/[x].jsonl\n  samples  1200\n" in err


@pytest.mark.parametrize("seconds", [0, -1, float("nan")])
def test_log_every_must_be_positive(seconds: float):
    with pytest.raises(UserError, match="--log-every"):
        OutputOptions(log_every=seconds)


def _env() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def test_importing_ui_does_not_import_rich():
    code = "import sys, eagle3kit._ui; assert 'rich' not in sys.modules, 'rich imported'"
    subprocess.run([sys.executable, "-c", code], env=_env(), check=True, timeout=60)


PTY_CHILD = """
import time
from eagle3kit._ui import OutputOptions, Progress, warn
with Progress("ptylabel", 20, OutputOptions()) as p:
    print(p.mode, flush=True)
    for i in range(20):
        p.add(tokens=10)
        if i == 15:  # after a few frames at 4 per second
            warn("careful")
        time.sleep(0.05)
"""


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
def test_live_display_in_a_real_terminal():
    master, slave = os.openpty()
    env = {**_env(), "TERM": "xterm-256color", "COLUMNS": "120", "LINES": "30"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", PTY_CHILD], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=slave, env=env,
    )  # fmt: skip
    os.close(slave)  # the child holds the only copy, so reads end once it exits
    drawn = b""
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                drawn += chunk
            elif proc.poll() is not None:
                break
        stdout, _ = proc.communicate(timeout=30)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, drawn.decode(errors="replace")
    assert stdout.decode().strip() == "live"
    assert b"ptylabel" in drawn
    assert b"\x1b[?25l" in drawn  # rich hid the cursor: a live display was running
    # A warning during the display lands on a line of its own, not drawn over the bar.
    warned = [seg for seg in drawn.splitlines() if b"warning:" in seg]
    assert warned and all(b"ptylabel" not in seg for seg in warned)
    # The live display cleans up after itself and the totals stay as the last line.
    assert b"ptylabel 20/20 (100.0%)" in drawn.rstrip().splitlines()[-1]

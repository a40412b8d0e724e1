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
    # 1200 in 4 s = 300/s; 1,248,000 tokens in 4 s = 312k/s, 1,040 per sample; 3800 left at
    # 300/s = 12.7 s.
    assert line == (
        "convert 1,200/5,000 (24.0%) 300 samples/s 312k tok/s errors 0 mean 1,040 tok "
        "elapsed 4s ETA 12s"
    )
    assert p.elapsed == 4 and p.rate == 300


def test_a_gauge_with_no_reading_shows_a_dash():
    clock = FakeClock()
    with Progress("train", 10, OutputOptions(quiet=True), unit="steps", clock=clock) as p:
        p.set(AL=None)
        assert " AL – " in p.status_line() + " "
        p.set(AL=2.5)
        assert " AL 2.5" in p.status_line() and "–" not in p.status_line()


def test_status_line_without_total_counters_and_gauges(capsys: pytest.CaptureFixture[str]):
    clock = FakeClock()
    with Progress("fetch", None, OutputOptions(), unit="requests", clock=clock) as p:
        clock.now += 90
        p.add(45, errors=1, retries=0, truncated=2)
        p.add(45, errors=2)
        p.set(in_flight=64)
        p.set(in_flight=8)  # a gauge is overwritten, not summed
        line = p.status_line()
    assert line.startswith("fetch 90 requests 1 requests/s ")
    assert "errors 3" in line and "truncated 2 (2.2%)" in line and "in_flight 8" in line
    assert "retries" not in line  # zero counters stay out of the way
    assert "tok/s" not in line and "mean" not in line and "ETA" not in line
    assert line.count("%") == 1  # the truncation rate; no total, so no percent done
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


def test_rows_accumulate_and_derive_their_own_figures(capsys: pytest.CaptureFixture[str]):
    clock = FakeClock()
    with Progress("gen", 1000, OutputOptions(), unit="requests", clock=clock, initial=100) as p:
        p.set_total("partition:math", 600, initial=100)  # resumed: 100 done by an earlier run
        p.set_total("partition:code", 400)
        clock.now += 10
        for i in range(40):
            part = "partition:math" if i % 4 else "partition:code"
            server = "server:http://a:30000" if i % 2 else "server:http://b:30000"
            p.add(rows=(part, server), tokens=800 + 10 * (i % 3), truncated=int(i % 10 == 0))
        p.add(rows=("partition:code", "server:http://b:30000"), skipped=1)  # over-long prompt
        p.add(0, retries=2, rows="server:http://a:30000")  # one key may be a plain str
        p.add(0, errors=1, rows=("server:http://a:30000",))
        p.set(in_flight=64)
        p.set(("server:http://a:30000",), in_flight=24)
        p.set(("server:http://b:30000",), in_flight=40)  # rows only: the run keeps 64

    # Grouped by the prefix before ':', each group in order of appearance.
    assert p.rows == ["partition:math", "partition:code", "server:http://b:30000",
                      "server:http://a:30000"]  # fmt: skip
    run = p.figures()
    assert (run.done, run.total, run.percent, run.rate) == pytest.approx((141, 1000, 14.1, 4.1))
    assert run.in_flight == 64 and run.errors == 1 and run.retries == 2
    # The skipped item has no output, so it stays out of the mean and the truncation rate.
    assert run.mean_tokens == pytest.approx(32_390 / 40) and run.truncation == 4 / 40
    assert run.tok_rate == pytest.approx(3239)
    assert run.eta == pytest.approx(859 / 4.1)

    math = p.figures("partition:math")
    assert (math.done, math.total, math.rate) == (130, 600, 3.0)  # 100 resumed + 30 now
    assert math.eta == pytest.approx(470 / 3)
    assert math.errors == 0 and math.retries is None and math.in_flight is None
    code = p.figures("partition:code")
    assert (code.done, code.total, code.percent) == (11, 400, 2.75)
    assert code.truncation == 2 / 10  # items 0 and 20 of the ten with output

    a = p.figures("server:http://a:30000")
    assert (a.done, a.total, a.percent, a.eta) == (20, None, None, None)
    assert (a.in_flight, a.errors, a.retries) == (24, 1, 2)
    assert a.truncation == 0 and a.tok_rate == pytest.approx(a.mean_tokens * 2)
    assert p.figures("server:http://b:30000").in_flight == 40


def test_summary_rows_fit_the_columns_and_print_as_a_table(capsys: pytest.CaptureFixture[str]):
    clock = FakeClock()
    with Progress("gen", 30, OutputOptions(), unit="requests", clock=clock) as p:
        p.set_total("partition:math", 20)
        p.set_total("partition:code", 10)
        clock.now += 2
        for i in range(30):
            part = "partition:math" if i < 20 else "partition:code"
            p.add(rows=(part, "server:http://a:30000"), tokens=100, truncated=int(i < 3))
    capsys.readouterr()
    assert p.columns == ["", "", "done", "total", "%", "requests/s", "tok/s", "mean tok",
                         "errors", "trunc %"]  # fmt: skip
    assert p.summary_rows() == [
        ["partition", "math", 20, 20, 100.0, 10.0, 1000, 100, 0, 15.0],
        ["partition", "code", 10, 10, 100.0, 5.0, 500, 100, 0, 0.0],
        ["server", "http://a:30000", 30, None, None, 15.0, 1500, 100, 0, 10.0],
        ["total", "", 30, 30, 100.0, 15.0, 1500, 100, 0, 10.0],
    ]
    _ui.table("gen", p.columns, p.summary_rows())
    err = capsys.readouterr().err
    assert "http://a:30000" in err and "trunc %" in err and "mean tok" in err


def test_summary_leaves_out_figures_nobody_counted(capsys: pytest.CaptureFixture[str]):
    with Progress("convert", None, OutputOptions(), unit="lines") as p:
        p.add(5)
    assert p.columns == ["", "", "done", "lines/s", "errors"]
    assert [row[:3] for row in p.summary_rows()] == [["total", "", 5]]


def test_plain_line_carries_mean_tokens_and_truncation_rate(
    capsys: pytest.CaptureFixture[str],
):
    clock = FakeClock()
    with Progress("gen", 10, OutputOptions(log_every=5), clock=clock) as p:
        for i in range(10):
            clock.now += 1
            p.add(rows=("partition:math", "server:http://a:30000"), tokens=800 + 5 * i,
                  truncated=int(i == 9))  # fmt: skip
    lines = capsys.readouterr().err.splitlines()
    # One line per interval and one at the end, whole-run figures only: rows are for the
    # live display and the summary table.
    assert len(lines) == 3 and all(line.startswith("gen ") for line in lines)
    assert "truncated 0 (0.0%)" in lines[0] and "mean 810 tok" in lines[0]  # after 5 items
    assert "truncated 1 (10.0%)" in lines[-1] and "mean 822 tok" in lines[-1]
    assert "ETA" in lines[0] and "ETA" not in lines[-1]


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
    assert lines[-1].startswith("convert 35/35 (100.0%) 1 samples/s 100 tok/s errors 0")
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


PLAIN_CHILD = """
import sys
from eagle3kit._ui import OutputOptions, Progress
with Progress("plain", 4, OutputOptions(log_every=0.001)) as p:
    p.set_total("partition:a", 4)
    for _ in range(4):
        p.add(rows=("partition:a", "server:x"), tokens=5, truncated=0)
        p.set(("server:x",), in_flight=1)
p.columns, p.summary_rows(), p.figures("server:x")
assert 'rich' not in sys.modules, 'rich imported'
"""


def test_plain_progress_with_rows_does_not_import_rich():
    subprocess.run([sys.executable, "-c", PLAIN_CHILD], env=_env(), check=True, timeout=60,
                   stderr=subprocess.DEVNULL)  # fmt: skip


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


def _run_in_pty(code: str) -> tuple[str, bytes]:
    """Run code with stderr on a pseudo-terminal 120 columns wide: (its stdout, all drawn)."""
    master, slave = os.openpty()
    env = {**_env(), "TERM": "xterm-256color", "COLUMNS": "120", "LINES": "30"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
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
    return stdout.decode(), drawn


needs_pty = pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")


@needs_pty
def test_live_display_in_a_real_terminal():
    stdout, drawn = _run_in_pty(PTY_CHILD)
    assert stdout.strip() == "live"
    assert b"ptylabel" in drawn
    assert b"\x1b[?25l" in drawn  # rich hid the cursor: a live display was running
    # A warning during the display lands on a line of its own, not drawn over the bar.
    warned = [seg for seg in drawn.splitlines() if b"warning:" in seg]
    assert warned and all(b"ptylabel" not in seg for seg in warned)
    # The live display cleans up after itself and the totals stay as the last line.
    assert b"ptylabel 20/20 (100.0%)" in drawn.rstrip().splitlines()[-1]


PTY_ROWS_CHILD = """
import time
from eagle3kit._ui import OutputOptions, Progress
servers = ["server:http://alpha:30000", "server:http://beta:30001"]
with Progress("rowlabel", 24, OutputOptions(), unit="requests") as p:
    print(p.mode, flush=True)
    p.set_total("partition:mathpart", 12)
    p.set_total("partition:codepart", 12)
    for i in range(24):
        rows = ("partition:mathpart" if i % 2 else "partition:codepart", servers[i % 2])
        p.add(rows=rows, tokens=700 + i, truncated=int(i % 6 == 0))
        p.set((servers[i % 2],), in_flight=3)
        time.sleep(0.05)
"""


@needs_pty
def test_live_display_has_a_row_per_partition_and_server():
    stdout, drawn = _run_in_pty(PTY_ROWS_CHILD)
    assert stdout.strip() == "live"
    frames = drawn.decode(errors="replace")
    for name in ("partition", "mathpart", "codepart", "server", "http://alpha:30000",
                 "http://beta:30001", "mean tok", "in flight", "trunc", "ETA"):  # fmt: skip
        assert name in frames, name
    # The table goes with the display; the whole run's line stays, as the last line.
    last = drawn.rstrip().splitlines()[-1].decode()
    assert "rowlabel 24/24 (100.0%)" in last and "mean 712 tok" in last  # 711.5
    assert "truncated 4 (16.7%)" in last

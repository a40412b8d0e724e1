"""Control characters from data never reach the terminal raw (issue 25, item 3).

A partition name or finish reason holding ESC sequences (clear the screen, move up a line and
erase it) would let a dataset hide a line of `info`'s or `validate`'s report. convert refuses
them at import, naming the file and line, as it refuses a bad id; a dataset written some other
way (here: through the format's own writer) is shown with each control character written out
as visible text, and its `--json` stays valid JSON holding the exact strings.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import orjson
import prewarmed
import pytest

from eagle3kit.format import Dataset, DatasetWriter, TokenSample

CLEAR = "\x1b[2J\x1b[H"
ERASE_ABOVE = "\x1b[1A\x1b[2K"
CSI = "\x9b2J"  # the one-byte C1 form of ESC [


def eagle3kit(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prewarmed.argv(), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def no_raw_controls(text: str) -> None:
    """No ESC, CSI, carriage return or backspace: nothing a terminal would act on."""
    for char in ("\x1b", "\x9b", "\r", "\x08", "\x07"):
        assert char not in text, repr(text)


def record(i: int, **changes: object) -> bytes:
    out = {"sample_id": f"id-{i}", "prompt_ids": [1, 2, 3], "completion_ids": [4, 5, 6 + i]}
    return orjson.dumps({**out, **changes})


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("finish_reason", f"stop{ERASE_ABOVE}"),
        ("partition", f"math{CLEAR}"),
        ("sample_id", f"id{CSI}"),
    ],
)
def test_convert_refuses_control_characters_naming_file_and_line(tmp_path, key, value):
    src = tmp_path / "src.jsonl"
    src.write_bytes(b"\n".join([record(0), record(1), record(2, **{key: value})]) + b"\n")
    proc = eagle3kit("convert", src, tmp_path / "ds")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    no_raw_controls(proc.stderr)
    escaped = "\\x1b" if "\x1b" in value else "\\x9b"
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: {src}:3: {key} holds a control character ({escaped}) (use --skip-bad-lines "
        "to skip such lines; samples before it are committed)"
    ], proc.stderr
    assert list(Dataset(tmp_path / "ds").sample_ids()) == ["id-0", "id-1"]  # the lines before it


@pytest.fixture
def crafted(tmp_path) -> Path:
    """A dataset whose partition names, finish reasons and manifest hold ESC sequences."""
    ds = tmp_path / "crafted"
    with DatasetWriter(
        ds, config={"note": f"x{CLEAR}"}, provenance={"source": f"shared{ERASE_ABOVE}\nerror: fake"}
    ) as writer:
        for i in range(4):
            writer.add(
                TokenSample(
                    f"id-{i}",
                    [1, 2, 3],
                    [4, 5, 6],
                    finish_reason=f"stop{ERASE_ABOVE}" if i % 2 else "stop",
                    partition=f"math{CLEAR}" if i < 2 else f"code{CSI}",
                )
            )
    return ds


def test_info_shows_control_characters_as_text(crafted):
    shown = eagle3kit("info", crafted)
    assert shown.returncode == 0, shown.stderr
    no_raw_controls(shown.stdout + shown.stderr)
    assert "math\\x1b[2J\\x1b[H" in shown.stderr
    assert "code\\x9b2J" in shown.stderr
    assert "stop\\x1b[1A\\x1b[2K" in shown.stderr
    # A newline inside a one-line field is written out too: no forged line of its own.
    assert "shared\\x1b[1A\\x1b[2K\\nerror: fake" in shown.stderr
    assert not [line for line in shown.stderr.splitlines() if line.startswith("error:")]


def test_info_json_is_valid_and_holds_the_exact_strings(crafted):
    shown = eagle3kit("info", crafted, "--json")
    assert shown.returncode == 0, shown.stderr
    no_raw_controls(shown.stdout + shown.stderr)
    report = json.loads(shown.stdout)
    assert set(report["partitions"]) == {f"math{CLEAR}", f"code{CSI}"}
    assert report["finish_reasons"] == {"stop": 2, f"stop{ERASE_ABOVE}": 2}


def test_validate_report_shows_control_characters_as_text(crafted):
    shown = eagle3kit("validate", crafted)
    assert "Traceback" not in shown.stderr
    no_raw_controls(shown.stdout + shown.stderr)
    assert "math\\x1b[2J\\x1b[H" in shown.stderr


BIDI = ["\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069"]


def test_bidi_controls_are_shown_as_text_too(tmp_path):
    """An id holding a right-to-left override would reorder the rest of eagle3kit's line
    (issue 38): each bidi embedding, override and isolate is written out like a C1 control,
    in the human report and in --json (where the parsed strings stay exact)."""
    ds = tmp_path / "bidi"
    with DatasetWriter(
        ds, config={"note": "x"}, provenance={"source": "left\u202eerror: fake"}
    ) as writer:
        for i, char in enumerate(BIDI):
            writer.add(TokenSample(f"id-{i}", [1, 2, 3], [4, 5, 6], partition=f"p{char}{i}"))
    shown = eagle3kit("info", ds)
    assert shown.returncode == 0, shown.stderr
    assert not [c for c in BIDI if c in shown.stderr], shown.stderr
    assert "left\\u202eerror: fake" in shown.stderr
    for i, char in enumerate(BIDI):
        assert f"p\\u{ord(char):04x}{i}" in shown.stderr
    as_json = eagle3kit("info", ds, "--json")
    assert not [c for c in BIDI if c in as_json.stdout]
    assert set(json.loads(as_json.stdout)["partitions"]) == {f"p{c}{i}" for i, c in enumerate(BIDI)}

"""Fuzzing `--config FILE`: whatever a settings file holds, reading it ends in one line or a
clean read, within TIME_LIMIT_S and MEMORY_LIMIT (issue 38).

Each case writes one file (crafted: YAML alias bombs, anchors, deep nesting, tags that would
run code, a list or a table where one value is taken, a FIFO, a device, an oversized or
non-UTF-8 file; random: settings of random keys and values in TOML, YAML and JSON, and
mutated copies of a valid file) and gives it to a real command's parser (`convert` and
`gen`, built from their configs as `eagle3kit` builds them) and then to its config, as
`eagle3kit CMD --config FILE` does. Only these endings are allowed: the command's one-line
`error:` (exit 2), a UserError from the config (one line), or a config built. Cases are
seeded by their number: a failure names it.
"""

from __future__ import annotations

import json
import math
import os
import random
import resource
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
import typer
import yaml
from typer.main import get_command

from eagle3kit._command import load
from eagle3kit._command_options import build
from eagle3kit.cli import STAGES, app
from eagle3kit.errors import UserError

REPO = Path(__file__).resolve().parent.parent
TIME_LIMIT_S = 5.0
MEMORY_LIMIT = 96 << 20
RANDOM_CASES = 300
COMMANDS = ("convert", "gen")

BOMB = (
    'lol: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n'
    + "".join(f"l{i}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8))
    + "src: [*i, *i, *i, *i, *i, *i, *i, *i, *i]\n"
)
"""The "billion laughs": nine lists of nine aliases, nested nine deep, 9**9 strings."""
NESTED_BOMB = "src:\n  - &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"  - &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8)
)
"""The same, all under one key."""

CRAFTED: dict[str, tuple[str, bytes, str]] = {
    # name: (file suffix, contents, what the one line must say)
    "alias bomb": (".yaml", BOMB.encode(), "'lol' (line 1) holds a YAML anchor or alias"),
    "alias bomb under one key": (
        ".yaml",
        NESTED_BOMB.encode(),
        "'src' (line 2) holds a YAML anchor or alias",
    ),
    "an anchor alone": (
        ".yaml",
        b"src: in.jsonl\ncommit-every: &n 5\n",
        "'commit-every' (line 2) holds a YAML anchor",
    ),
    "a merge key": (".yaml", b"base: &b {commit-every: 5}\nother:\n  <<: *b\n", "'base'"),
    "an alias at the top": (".yaml", b"&top {src: x}\n", "the file (line 1) holds a YAML"),
    "deep YAML": (".yaml", b"src: " + b"[" * 40 + b"]" * 40 + b"\n", "'src' (line 1) nests"),
    "very deep YAML": (".yaml", b"src: " + b"[" * 20000 + b"]" * 20000 + b"\n", "nests deeper"),
    "deep JSON": (
        ".json",
        b'{"src": ' + b"[" * 40 + b"]" * 40 + b"}",
        "'src' nests deeper than 32 levels",
    ),
    "very deep JSON": (".json", b'{"src": ' + b"[" * 20000 + b"]" * 20000 + b"}", "not valid JSON"),
    "deep TOML": (
        ".toml",
        b"src = " + b"[" * 40 + b"]" * 40 + b"\n",
        "'src' nests deeper than 32 levels",
    ),
    "very deep TOML": (".toml", b"src = " + b"[" * 20000 + b"]" * 20000 + b"\n", "not valid TOML"),
    "a YAML tag that runs code": (
        ".yaml",
        b"src: !!python/object/apply:os.system ['touch ran']\n",
        "not valid YAML",
    ),
    "a list where one value is taken": (
        ".yaml",
        b"commit-every: [1, 2]\n",
        "'commit-every' takes one plain value here (got a list)",
    ),
    "a table where one value is taken": (
        ".toml",
        b"[commit-every]\nn = 1\n",
        "'commit-every' takes one plain value here (got a table)",
    ),
    "a list inside a list": (
        ".json",
        b'{"src": [[1]], "dst": "x"}',
        "'src' takes one plain value here (got a list)",
    ),
    "a table in a comma list": (
        ".yaml",
        b"layers: [{a: 1}]\n",
        "'layers' takes one plain value here (got a table)",
    ),
    "a positional's list of lists (gen)": (
        ".yaml",
        b"prompts: [[a.jsonl]]\n",
        "'prompts' takes one",
    ),
    "a table in a recorded run": (
        ".json",
        b'{"config": {"commit_every": {"n": 1}}}',
        "'commit_every' takes one plain value here (got a table)",
    ),
    "a consent nested in a table": (
        ".yaml",
        b"extra:\n  deeper:\n    - {overwrite: true}\n",
        "'extra.deeper.0.overwrite' is taken from the command line",
    ),
    "not UTF-8": (".toml", b'src = "\xff\xfe"\n', "not UTF-8 text"),
    "NUL bytes": (".json", b"\x00" * 64, "not valid JSON"),
    "empty": (".yaml", b"", "not a table of settings"),
    "a list at the top": (".json", b"[1, 2]", "not a table of settings"),
    "a scalar at the top": (".yaml", b"just text\n", "not a table of settings"),
    "a recorded config that is a list": (".json", b'{"config": [1]}', "unknown key 'config'"),
    "an unhashable YAML key": (".yaml", b"? [a, b]\n: 1\n", "not valid YAML"),
    "a date for a number": (".toml", b"commit-every = 1979-05-27\n", "'commit-every': "),
    "an integer of 400 digits": (".toml", b"commit-every = " + b"9" * 400 + b"\n", ""),
    "a NaN cadence": (".toml", b'src = "x"\ndst = "y"\ncommit-interval = nan\n', ""),
    "too big for a settings file": (
        ".yaml",
        b"# " + b"x" * (300 << 10) + b"\n",
        "larger than 256 KiB",
    ),
    "too big for a record": (".json", b"[" + b"0," * (8 << 20) + b"0]", "larger than 16384 KiB"),
}


def _one_ending(command_name: str, path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """Parse `--config path` as the command does, then build its config: the one line it
    ended in ('' for a clean read). Anything else (a traceback) fails the test."""
    command = get_command(app).commands[command_name]  # type: ignore[attr-defined]
    capsys.readouterr()
    try:
        with command.make_context(command_name, ["--config", str(path)]) as ctx:
            build(load(_config_of(command_name)), dict(ctx.params))
    except typer.Exit as exc:
        err = capsys.readouterr().err
        assert exc.exit_code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
        return err.strip()
    except UserError as exc:  # the config's own refusal: run_stage prints it as one line
        assert "\n" not in str(exc), str(exc)
        return f"error: {exc}"
    except Exception as exc:  # click's usage errors (a missing positional) are one line too
        name = type(exc).__name__
        assert name in ("MissingParameter", "BadParameter", "UsageError"), repr(exc)
        return f"error: {exc}"
    assert capsys.readouterr().err.count("\n") <= 1
    return ""


def _config_of(command_name: str) -> str:
    return STAGES[command_name].config  # type: ignore[union-attr]


def _bounded(
    command_name: str, path: Path, capsys: pytest.CaptureFixture[str], traced: bool = True
) -> str:
    """The case's ending, checked for time and (traced) peak memory."""
    if traced:
        tracemalloc.start()
    started = time.monotonic()
    try:
        ending = _one_ending(command_name, path, capsys)
    finally:
        elapsed = time.monotonic() - started
        peak = tracemalloc.get_traced_memory()[1] if traced else 0
        if traced:
            tracemalloc.stop()
    assert elapsed < TIME_LIMIT_S, (path.name, elapsed)
    assert peak < MEMORY_LIMIT, (path.name, peak)
    return ending


@pytest.fixture(scope="module", autouse=True)
def _imported(tmp_path_factory):
    """Each command's modules imported and a file of each format read once, before any
    case is timed: the cases time reading, not importing."""
    root = tmp_path_factory.mktemp("warm")
    for suffix, text in ((".toml", "x = 1\n"), (".yaml", "x: 1\n"), (".json", '{"x": 1}')):
        (root / f"warm{suffix}").write_text(text)
        for name in COMMANDS:
            command = get_command(app).commands[name]  # type: ignore[attr-defined]
            with pytest.raises(typer.Exit):
                command.make_context(name, ["--config", str(root / f"warm{suffix}")])
            load(_config_of(name))


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("name", list(CRAFTED))
def test_a_crafted_settings_file_ends_in_one_line(tmp_path, capsys, name):
    suffix, data, expected = CRAFTED[name]
    path = tmp_path / f"case{suffix}"
    path.write_bytes(data)
    # The two largest are refused by size before they are read whole: no need to trace them.
    command = "gen" if name.endswith("(gen)") else "convert"
    ending = _bounded(command, path, capsys, traced=not name.startswith("too big"))
    assert expected in ending, ending
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("what", ["fifo", "device", "directory"])
def test_a_settings_file_that_is_no_regular_file_is_refused_at_once(tmp_path, capsys, what):
    path = tmp_path / "settings.yaml"
    if what == "fifo":
        os.mkfifo(path)  # opening it to read would wait for a writer forever
    elif what == "device":
        path.symlink_to("/dev/zero")  # reading it never ends
    else:
        path.mkdir()
    assert _bounded("convert", path, capsys).endswith("settings.yaml: not a regular file")


KEYS = [
    "src",
    "dst",
    "commit-every",
    "commit_every",
    "commit-interval",
    "layers",
    "to",
    "tokenizer",
    "json",
    "quiet",
    "overwrite",
    "overwrite_dir",
    "resume",
    "force",
    "trust-remote-code",
    "server",
    "servers",
    "api-key",
    "chat-template-kwargs",
    "max-tokens",
    "temperature",
    "write",
    "output",
    "config",
    "no-verify",
    "x" * 300,
    "comit-every",
    "",
    " ",
    "\x1b[2J",
]


def _value(rng: random.Random, depth: int = 0) -> object:
    kind = rng.randrange(12 if depth < 4 else 8)
    if kind == 0:
        return rng.choice([True, False, None])
    if kind == 1:
        return rng.choice([0, 1, -1, 7, 2**31, 2**63, 2**64 + 1, 10**50])
    if kind == 2:
        return rng.choice([0.5, -0.0, 1e308, math.inf, -math.inf, math.nan])
    if kind in (3, 4, 5):
        return rng.choice(
            [
                "in.jsonl",
                "ds",
                "2,18,33",
                "",
                "x" * 1000,
                "\x1b]0;t\x07",
                "http://127.0.0.1:1",
                "../../etc/passwd",
                "é\u202e",
                "tokens:0.5",
            ]
        )
    if kind in (6, 7):
        return rng.choice(["a", "b", 3])
    if kind in (8, 9):
        return [_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(KEYS): _value(rng, depth + 1) for _ in range(rng.randrange(4))}


def _settings(rng: random.Random) -> dict:
    return {rng.choice(KEYS): _value(rng) for _ in range(rng.randrange(1, 6))}


def _toml(settings: dict) -> str:
    """A TOML writer for what TOML can hold; what it cannot (None, a nested list of tables)
    is written out anyway, as a person might, and is then the parser's to refuse."""

    def value(v: object) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float) and not math.isfinite(v):
            return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items()) + "}"
        if v is None:
            return "null"
        return json.dumps(v)

    return "".join(f"{json.dumps(k)} = {value(v)}\n" for k, v in settings.items())


def _mutated(rng: random.Random, data: bytes) -> bytes:
    data = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        if not data:
            break
        at = rng.randrange(len(data))
        action = rng.randrange(3)
        if action == 0:
            data[at] = rng.randrange(256)
        elif action == 1:
            del data[at:]
        else:
            data[at:at] = rng.choice([b"&a ", b"*a", b"[", b"{", b"]", b"\n  ", b"\x00", b"<<: "])
    return bytes(data)


def _case(n: int, tmp_path: Path) -> tuple[str, Path]:
    """Random case `n`: its command and its file."""
    rng = random.Random(f"settings-{n}")
    settings = _settings(rng)
    form = rng.choice(["toml", "yaml", "json", "record"])
    if form == "toml":
        data = _toml(settings).encode()
    elif form == "yaml":
        data = yaml.safe_dump(
            json.loads(json.dumps(settings, default=str)), allow_unicode=True
        ).encode()
    else:
        record = {"config": settings} if form == "record" else settings
        data = json.dumps(record).encode()
    if rng.random() < 0.4:
        data = _mutated(rng, data)
    path = tmp_path / f"case{n}.{'json' if form == 'record' else form}"
    path.write_bytes(data)
    return rng.choice(COMMANDS), path


def test_random_settings_files_end_in_one_line(tmp_path, capsys):
    for n in range(RANDOM_CASES):
        command_name, path = _case(n, tmp_path)
        try:
            _bounded(command_name, path, capsys)
        except AssertionError as exc:
            raise AssertionError(f"case {n} ({command_name}, {path.name}): {exc}") from None


def test_the_alias_bomb_through_the_real_command_with_capped_memory(tmp_path):
    """The issue's reproduction: the bomb under a 1.5 GiB address-space cap ended in a
    MemoryError traceback after 11 s. Now: one line, exit 2."""
    (tmp_path / "bomb.yaml").write_text(NESTED_BOMB)
    cap = 1536 << 20

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE3KIT_")}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    result = subprocess.run(
        [sys.executable, "-m", "eagle3kit", "convert", "--config", "bomb.yaml"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=limit,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr == (
        "error: --config bomb.yaml: 'src' (line 2) holds a YAML anchor "
        "or alias (&, *): write each value out\n"
    )

"""Integer options are bounded by their flag before anything is written or measured (issue 38,
item 11).

A 23-digit `--sliding-window` used to pass the config, create the run directory and end in
torch's traceback (and the same command with a sane value then refused that directory);
`--seed` likewise; `--sliding-window 2**63` was accepted and exported; `bench accept
--depth-buckets 9...9` failed after the whole measurement. Every integer option of every
command (and every list of them: --layers, --tree, --depth-buckets, --context-tokens) is
walked here: a value past its bounds, given on the command line or in a --config file, ends
in one line naming the flag, exit 2, and nothing created.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import prewarmed
import pytest
from typer.testing import CliRunner

from eagle3kit._command import Group, load
from eagle3kit._command_options import Option, hints, options
from eagle3kit._options import INT_BOUNDS, SEED_BOUNDS, _holds_ints
from eagle3kit.cli import STAGES, app
from eagle3kit.format import DatasetWriter, TokenSample

HUGE = "9" * 23
"""The issue's value: past 64 bits."""
CLI_TIMEOUT_S = 60


def _commands(stages: dict = STAGES, prefix: tuple[str, ...] = ()) -> Iterator[tuple]:
    for name, stage in stages.items():
        if isinstance(stage, Group):
            yield from _commands(stage.stages, (*prefix, name))
        else:
            yield (*prefix, name), load(stage.config)


def _int_options() -> list[tuple[tuple[str, ...], type, Option]]:
    found = []
    for command, config in _commands():
        for o in options(config):
            if o.cli.ints or _holds_ints(hints(o.owner)[o.field.name]):
                found.append((command, config, o))
    return found


INT_OPTIONS = _int_options()


def _flag(o: Option) -> str:
    return next(
        (f for f in o.cli.flags if f.startswith("--")), f"--{o.field.name.replace('_', '-')}"
    )


def _positionals(config: type, where: Path) -> list[str]:
    """A path for each positional the command takes (none of them exists)."""
    args: list[str] = []
    for o in options(config):
        if o.cli.argument:
            args.append(str(where / f"{o.field.name}-in"))
            if o.cli.last:
                args.append(str(where / f"{o.cli.last}-out"))
    return args


def _too_large(o: Option) -> str:
    """A value of option `o` with one integer past its bounds, as the command line gives it."""
    hint = str(hints(o.owner)[o.field.name])
    if o.cli.ints or "str" in hint:  # text holding integers: --layers 2,18,33, --tree 4,5
        return f"4,{HUGE}"
    return HUGE


def test_the_walk_finds_the_integer_options_of_every_kind() -> None:
    # Not vacuous: the issue's options, the embedded ones and the text lists are all found.
    names = {(" ".join(c), o.field.name) for c, _, o in INT_OPTIONS}
    for expected in [
        ("train", "sliding_window"),
        ("train", "seed"),
        ("train", "layers"),
        ("extract", "commit_every"),
        ("bench accept", "depth_buckets"),
        ("bench accept", "tree"),
        ("bench server", "context_tokens"),
        ("gen", "sampling_seed"),
        ("quickstart", "train_steps"),
        ("export", "num_speculative_tokens"),
        ("convert", "layers"),
    ]:
        assert expected in names, expected
    assert len(INT_OPTIONS) > 60


@pytest.mark.parametrize(
    ("command", "config", "option"),
    INT_OPTIONS,
    ids=[f"{' '.join(c)} {_flag(o)}" for c, _, o in INT_OPTIONS],
)
def test_every_integer_option_past_its_bounds_is_one_line_naming_the_flag(
    tmp_path: Path, command: tuple[str, ...], config: type, option: Option
) -> None:
    flag = _flag(option)
    high = (option.cli.bounds or INT_BOUNDS)[1]
    values = [
        _too_large(option),
        f"-{HUGE}" if _too_large(option) == HUGE else f"4,-{HUGE}",
        str(high + 1),
    ]
    runner = CliRunner()
    for value in values:
        args = [*command, *_positionals(config, tmp_path), f"{flag}={value}"]
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert result.exception is None or isinstance(result.exception, SystemExit), args
        lines = result.stderr.splitlines()
        assert len(lines) == 1, (args, result.stderr)
        assert lines[0].startswith(f"error: {flag} "), lines
        assert "out of range" in lines[0], lines
        assert list(tmp_path.iterdir()) == [], args  # nothing created, not even OUT


def test_values_at_the_bounds_pass_the_bound() -> None:
    # The check refuses only what is past the bounds: the config's own checks still speak.
    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "train",
            "no-data",
            "no-run",
            f"--sliding-window={INT_BOUNDS[1]}",
            f"--seed={SEED_BOUNDS[1]}",
        ],
    )
    assert result.exit_code == 2
    assert "out of range" not in result.stderr
    assert "no-data" in result.stderr


def test_a_seed_is_not_negative() -> None:
    result = CliRunner().invoke(app, ["train", "no-data", "no-run", "--seed=-1"])
    assert result.exit_code == 2
    assert result.stderr == "error: --seed -1: out of range (the least it takes is 0)\n"


def _run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prewarmed.argv(), *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
    )


def _one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_the_issues_commands_end_in_one_line_and_create_nothing(tmp_path: Path) -> None:
    # The real command, on a real dataset: the run directory the traceback used to leave
    # behind (which the same command with a sane value then refused) is never created.
    tiny_dataset = tmp_path / "ds"
    with DatasetWriter(tiny_dataset) as writer:
        writer.add(TokenSample("s-0", [1, 2, 3], [4, 5, 6]))
    run = tmp_path / "run"
    for flag, value, line in [
        (
            "--sliding-window",
            HUGE,
            f"error: --sliding-window 999999... (23 digits): out of "
            f"range (the most it takes is {INT_BOUNDS[1]:,})",
        ),
        (
            "--sliding-window",
            str(2**63),
            "error: --sliding-window 9223372036854775808: "
            f"out of range (the most it takes is "
            f"{INT_BOUNDS[1]:,})",
        ),
        (
            "--seed",
            HUGE,
            f"error: --seed 999999... (23 digits): out of range (the most it "
            f"takes is {SEED_BOUNDS[1]:,})",
        ),
    ]:
        assert _one_line(_run("train", tiny_dataset, run, flag, value, cwd=tmp_path)) == line
        assert not run.exists()
    # bench accept refuses its buckets before loading anything, not after the measurement.
    line = _one_line(
        _run("bench", "accept", "--json", "--depth-buckets", f"1024,{HUGE}", cwd=tmp_path)
    )
    assert line.startswith("error: --depth-buckets 999999... (23 digits): out of range"), line


@pytest.mark.parametrize(
    ("setting", "flag"),
    [(f"sliding-window = {HUGE}", "--sliding-window"), (f"layers = [2, 18, {HUGE}]", "--layers")],
)
def test_a_settings_file_is_bounded_as_the_command_line(
    tmp_path: Path, setting: str, flag: str
) -> None:
    settings = tmp_path / "settings.toml"
    settings.write_text(setting + "\n")
    result = CliRunner().invoke(
        app, ["train", "--config", str(settings), "data", str(tmp_path / "run")]
    )
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {flag} 999999... (23 digits): out of range"), (
        result.stderr
    )
    assert not (tmp_path / "run").exists()


def test_a_servers_own_concurrency_is_bounded_as_concurrency_is() -> None:
    from eagle3kit.errors import UserError
    from eagle3kit.gen.config import parse_server

    assert parse_server(f"http://10.0.0.11:30000@{INT_BOUNDS[1]}").concurrency == INT_BOUNDS[1]
    with pytest.raises(
        UserError,
        match=r"^--server http://10.0.0.11:30000@9+: concurrency out "
        r"of range \(the most it takes is 2,147,483,647\)$",
    ):
        parse_server(f"http://10.0.0.11:30000@{HUGE}")

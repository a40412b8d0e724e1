"""`--help` tells the truth: each default shown is the stage config's own, required options are
marked, no Python type names, positionals as a user types them, every option described."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from eagle3kit._options import WRITE_KEYS, OutputOptions, WriteOptions, arg, not_option, opt
from eagle3kit.bench.accept import AcceptConfig
from eagle3kit.bench.parity import ParityConfig
from eagle3kit.bench.server import ServerBenchConfig
from eagle3kit.cli import app
from eagle3kit.convert import ConvertConfig
from eagle3kit.export import ExportConfig
from eagle3kit.extract import ExtractConfig
from eagle3kit.gen.config import GenConfig
from eagle3kit.info import InfoConfig
from eagle3kit.plan import PlanConfig
from eagle3kit.quickstart import QuickstartConfig
from eagle3kit.train.config import TrainConfig
from eagle3kit.validate import ValidateConfig

CONFIGS = {  # command -> the dataclasses its options fill, in order
    ("info",): [InfoConfig],
    ("convert",): [ConvertConfig],
    ("validate",): [ValidateConfig],
    ("gen",): [GenConfig],
    ("plan",): [PlanConfig, GenConfig],
    ("extract",): [ExtractConfig],
    ("train",): [TrainConfig],
    ("export",): [ExportConfig],
    ("bench", "accept"): [AcceptConfig],
    ("bench", "server"): [ServerBenchConfig],
    ("bench", "parity"): [ParityConfig],
    ("quickstart",): [QuickstartConfig],
}
RENAMED = {("export",): {"run_dir": "run"}}
"""Parameters whose config field has another name."""
TYPE_NAMES = re.compile(r"<(?:bool|int|float|str|text|path|file|directory|list\[[^\]]*\])>", re.I)
ROW = re.compile(r"^│\s*(\*)?\s*(--[a-z][a-z0-9-]*)")
DEFAULT = re.compile(r"\[default: ([^\]]*)\]")


def help_text(path: tuple[str, ...]) -> str:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    return result.output


def option_rows(text: str) -> dict[str, tuple[bool, str]]:
    """--flag -> (marked required, its help text with continuation lines)."""
    rows: dict[str, tuple[bool, str]] = {}
    current = None
    for line in text.splitlines():
        m = ROW.match(line)
        if m:
            current = m.group(2)
            rows[current] = (bool(m.group(1)), line)
        elif current and line.startswith("│") and line.strip("│ "):
            required, body = rows[current]
            rows[current] = (required, body + " " + line.strip("│ "))
        elif not line.startswith("│"):
            current = None
    return rows


def fields_of(path: tuple[str, ...]) -> dict[str, dataclasses.Field]:
    """The configs' fields, and those of the shared options each embeds (`output`, `write`),
    defaulted as the config's own default instance holds them."""
    found: dict[str, dataclasses.Field] = {}
    for cls in CONFIGS[path]:
        for f in dataclasses.fields(cls):
            found.setdefault(f.name, f)
            embedded = _expected(f)
            if dataclasses.is_dataclass(embedded):
                for sub in dataclasses.fields(embedded):
                    copy = dataclasses.field(default=getattr(embedded, sub.name))
                    copy.name = sub.name
                    found.setdefault(sub.name, copy)
    return found


def commands():
    root = get_command(app)
    for name, cmd in root.commands.items():
        for sub, leaf in (getattr(cmd, "commands", None) or {None: cmd}).items():
            yield (name,) if sub is None else (name, sub), leaf


def test_every_command_is_covered():
    assert {path for path, _ in commands()} == set(CONFIGS)


def _expected(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _same(shown: str, value) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return float(shown) == float(value)
    return shown == str(value)


@pytest.mark.parametrize("path", sorted(CONFIGS), ids=" ".join)
def test_help_shows_each_configs_own_default_and_marks_required(path):
    text = help_text(path)
    rows = option_rows(text)
    assert not TYPE_NAMES.search(text), TYPE_NAMES.findall(text)
    fields = fields_of(path)
    cmd = dict(commands())[path]
    for param in cmd.params:
        if param.param_type_name != "option" or getattr(param, "hidden", False):
            continue
        flag = max(param.opts, key=len)
        required, body = rows[flag]
        assert len(DEFAULT.sub("", body.split(flag, 1)[1]).split()) > 1, f"{flag}: no help"
        f = fields.get(RENAMED.get(path, {}).get(param.name, param.name))
        shown = DEFAULT.findall(body)
        if f is None or getattr(param, "is_flag", False):
            assert not shown, f"{' '.join(path)} {flag}: a default the config does not hold"
            continue
        value = _expected(f)
        if value is dataclasses.MISSING:
            assert required and "[required]" in body, f"{flag} is required by {f.name}"
            continue
        assert not required, flag
        if value is None or value == [] or value == {}:
            assert not shown, f"{flag}: shows {shown}, the config's default is {value!r}"
            continue
        assert shown and _same(shown[0], value), (
            f"{' '.join(path)} {flag}: help shows {shown}, {f.name} defaults to {value!r}"
        )
        # The default is the generated one only: no hand-written copy that could drift.
        assert "(default" not in body, f"{flag}: retypes its default: {body}"


def test_extract_commit_every_shows_256_not_the_old_1000():
    _, body = option_rows(help_text(("extract",)))["--commit-every"]
    write = {f.name: f for f in dataclasses.fields(ExtractConfig)}["write"]
    assert DEFAULT.findall(body) == ["256"] == [str(_expected(write).commit_every)]
    _, body = option_rows(help_text(("gen",)))["--commit-every"]
    assert DEFAULT.findall(body) == ["1000"]


def test_every_stage_embeds_the_shared_options_under_one_name():
    for configs in CONFIGS.values():  # plan's come with the gen config it embeds
        names = {f.name: f for f in dataclasses.fields(configs[-1])}
        assert _expected(names["output"]) == OutputOptions(), configs[-1]
        for f in names.values():  # no stage re-declares a shared option as its own field
            assert f.name not in {*WRITE_KEYS, "json", "quiet", "no_progress", "log_every"}
    for cls in (ConvertConfig, GenConfig, ExtractConfig, TrainConfig, QuickstartConfig):
        assert isinstance(
            _expected({f.name: f for f in dataclasses.fields(cls)}["write"]), WriteOptions
        ), cls


@pytest.mark.parametrize(
    ("path", "usage"),
    [
        (("gen",), "PROMPTS... OUTPUT"),
        (("plan",), "PROMPTS... OUTPUT"),
        (("export",), "RUN OUT"),
        (("train",), "DATA[:WEIGHT]... RUN"),
        (("extract",), "TOKENS OUTPUT"),
        (("bench", "accept"), "PROMPTS..."),
        (("bench", "server"), "PROMPTS..."),
        (("quickstart",), "[DIR]"),
        (("convert",), "SRC DST"),
        (("info",), "PATH"),
    ],
)
def test_usage_lines_show_positionals_as_typed(path, usage):
    line = next(x for x in help_text(path).splitlines() if "Usage:" in x)
    assert line.split("[OPTIONS]", 1)[1].strip() == usage


def test_gen_help_is_grouped():
    panels = re.findall(r"╭─ (.+?) ─", help_text(("gen",)))
    assert {
        "Prompts",
        "Servers",
        "Rendering the prompts",
        "Sampling and lengths",
        "The run",
    } <= set(panels)


def test_top_level_and_bench_help_have_no_type_names():
    for path in ((), ("bench",)):
        result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "250"})
        assert result.exit_code == 0 and not TYPE_NAMES.search(result.output), result.output


@dataclasses.dataclass
class Throwaway:
    """A stage config made up here: its fields are all its command line is told."""

    out: Path = dataclasses.field(metadata=arg())
    """Where the made-up stage writes."""
    shards: int = dataclasses.field(
        default=7, metadata=opt("--shards", metavar="N", panel="Made up")
    )
    """How many shards the made-up stage cuts its output into."""
    rounds: int = 2
    """How many rounds the made-up stage makes: an option with no metadata at all."""
    internal: int = dataclasses.field(default=0, metadata=not_option())
    """Set by the code, never on the command line."""


RAN: list[Throwaway] = []


def run_throwaway(config: Throwaway) -> None:
    RAN.append(config)


def test_an_option_added_to_a_config_alone_is_on_the_command_line(tmp_path):
    """Adding an option to a stage touches its config alone: the field above is shown in
    --help with its default, docstring, metavar and panel, and parsed into the config."""
    import typer

    from eagle3kit._command import Stage, stages_group

    made_up = typer.Typer(
        cls=stages_group(
            {
                "made-up": Stage(
                    f"{__name__}:Throwaway", f"{__name__}:run_throwaway", summary="A made-up stage."
                )
            }
        )
    )
    made_up.callback()(lambda: None)  # a group, as `eagle3kit` is
    text = CliRunner().invoke(made_up, ["made-up", "--help"], env={"COLUMNS": "250"}).output
    required, body = option_rows(text)["--shards"]
    assert not required and "N" in body and DEFAULT.findall(body) == ["7"]
    assert "How many shards the made-up stage cuts its output into." in body
    assert "╭─ Made up ─" in text and "Where the made-up stage writes." in text
    _, body = option_rows(text)["--rounds"]
    assert DEFAULT.findall(body) == ["2"] and "an option with no metadata at all" in body
    assert "--internal" not in text
    result = CliRunner().invoke(
        made_up, ["made-up", str(tmp_path), "--shards", "3", "--rounds", "5"]
    )
    assert result.exit_code == 0, result.output
    assert RAN[-1] == Throwaway(tmp_path, shards=3, rounds=5)
    refused = CliRunner().invoke(made_up, ["made-up", str(tmp_path), "--internal", "1"])
    assert refused.exit_code == 2 and "No such option" in refused.output
    CliRunner().invoke(made_up, ["made-up", str(tmp_path)])
    assert RAN[-1] == Throwaway(tmp_path)  # not given: the field's default

"""The command line built from the stage configs: one generic command per config dataclass.

Each command's options are made from its config (eagle3kit._command_options) when the command
is first used, so `eagle3kit --help` imports no config. Every command also takes
`--config FILE`, whose settings become the options' defaults (eagle3kit._settings_file): the
command line and the EAGLE3KIT_* variables still win. A command runs its stage through
`run_stage`: one line for a user error, the continue line for a stop signal.
"""

from __future__ import annotations

import importlib
import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
import typer.main

from eagle3kit._command_options import build, options, parameter
from eagle3kit._help import HelpGroup, StageCommand
from eagle3kit._settings_file import (
    CONFIG_HELP,
    NOT_REPLAYED,
    file_defaults,
    read_settings,
    setting_keys,
)
from eagle3kit.errors import UserError


@dataclass(frozen=True)
class Stage:
    """A command: its config class and run function ("module:name"), help panel, summary."""

    config: str
    run: str
    panel: str | None = None
    summary: str = ""


@dataclass(frozen=True)
class Group:
    """A command with subcommands (`bench`)."""

    panel: str | None
    summary: str
    stages: dict[str, Stage]


def load(where: str) -> Any:
    module, _, name = where.partition(":")
    return getattr(importlib.import_module(module), name)


def _fail(exc: UserError) -> NoReturn:
    from eagle3kit import _ui

    _ui.error(str(exc))
    raise typer.Exit(exc.exit_code)


def run_stage(run: Callable[[Any], Any], make_config: Callable[[], Any]) -> Any:
    """Build the config and run the stage; user errors and stop signals end in one line."""
    from eagle3kit._signals import StopAsInterrupt

    with StopAsInterrupt():  # still caught while the line is printed: a repeat is ignored
        try:
            return run(make_config())
        except UserError as exc:
            _fail(exc)
        except KeyboardInterrupt as exc:
            raise typer.Exit(interrupted(exc)) from None


def interrupted(exc: KeyboardInterrupt) -> int:
    """Say how to continue a run a signal stopped; its exit status (130, or 143)."""
    from eagle3kit import _ui
    from eagle3kit._signals import EXIT_CODES, stop_signal, stopped_line

    _ui.error(stopped_line(exc))
    return EXIT_CODES[stop_signal(exc)]


def _read_config(ctx: typer.Context, value: Path | None) -> None:
    """--config FILE: its settings become the defaults of the command's options, so the
    command line and the EAGLE3KIT_* variables still win."""
    if value is None:
        return
    command = ctx.command
    try:
        settings, recorded = read_settings(value)
        keys = setting_keys(command.params, getattr(command, "option_list", ()))
        defaults, skipped = file_defaults(ctx, settings, recorded, value, keys)
    except UserError as exc:
        _fail(exc)
    if skipped:
        ctx.meta[NOT_REPLAYED] = (
            f"--config {value}: recorded, not replayed (not options "
            "here, or the command line's alone): "
            f"{', '.join(skipped)}"
        )
    ctx.default_map = {**(ctx.default_map or {}), **defaults}


def _config_parameter() -> inspect.Parameter:
    info: Any = typer.Option(
        "--config",
        metavar="FILE",
        is_eager=True,
        expose_value=False,
        callback=_read_config,
        help=CONFIG_HELP,
        show_default=False,
    )
    return inspect.Parameter(
        "config_file",
        inspect.Parameter.KEYWORD_ONLY,
        annotation=Annotated[Path | None, info],
        default=None,
    )


def _callback(stage: Stage) -> Callable[..., None]:
    def command(ctx: typer.Context, **values: Any) -> None:
        config = load(stage.config)
        result = run_stage(load(stage.run), lambda: _built(ctx, config, values))
        code = getattr(result, "exit_code", 0)
        if code:  # a failed check, problems found, or stopped by a signal
            raise typer.Exit(code)

    return command


def _built(ctx: typer.Context, config: type, values: dict[str, Any]) -> Any:
    """The config from the command line's values; then the note of a recorded run's keys not
    replayed, kept until now so that --quiet (given anywhere) drops it."""
    built = build(config, values)
    note = ctx.meta.get(NOT_REPLAYED)
    if note:
        from eagle3kit import _ui

        _ui.info(note, getattr(built, "output", None))
    return built


class LazyCommand(StageCommand):
    """A stage's command whose options are made from its config when first needed: listing
    it in `eagle3kit --help` imports nothing."""

    def __init__(self, name: str, stage: Stage, **settings: Any) -> None:
        self.stage = stage
        self._params: list | None = None
        super().__init__(
            name=name,
            help=stage.summary,
            rich_help_panel=stage.panel,
            params=[],
            callback=None,
            **settings,
        )

    @property
    def params(self) -> list:
        if self._params is None:
            self._params = self._make()
        return self._params

    @params.setter
    def params(self, value: list) -> None:
        if value:
            self._params = value

    def _make(self) -> list:
        """The command's parameters, made from its config; the callback set to run it."""
        self.option_list = options(load(self.stage.config))
        command = _callback(self.stage)
        command.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [
                inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context),
                *(parameter(o) for o in self.option_list),
                _config_parameter(),
            ]
        )
        # Typer makes the parameters and the callback that fills them, as for any command
        # of its own: one app of this one command, turned into click's by its public API.
        alone = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
        alone.command()(command)
        made = typer.main.get_command(alone)
        self.callback = made.callback
        return made.params


class StagesGroup(HelpGroup):
    """`eagle3kit` (and `eagle3kit bench`): the stages of `stages`, as lazy commands."""

    stages: typing.ClassVar[Mapping[str, Stage | Group]] = {}

    def __init__(
        self, *args: Any, stages: Mapping[str, Stage | Group] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        for name, stage in (self.stages if stages is None else stages).items():
            if isinstance(stage, Group):
                self.add_command(
                    StagesGroup(
                        name=name,
                        help=stage.summary,
                        rich_help_panel=stage.panel,
                        no_args_is_help=True,
                        stages=stage.stages,
                    )
                )
            else:
                self.add_command(LazyCommand(name, stage))


def stages_group(stages: Mapping[str, Stage | Group]) -> type[StagesGroup]:
    return type("StagesGroup", (StagesGroup,), {"stages": stages})

"""The command line built from the stage configs: one generic command per config dataclass.

A config field is an option when its metadata says so (`opt(...)`, `arg(...)`, `embed(...)`
from eagle3kit._options); a field whose default is an options dataclass (`output`, `write`)
is embedded without being told. The option's name, metavar and panel come from that
metadata, its default from the field and its help from the field's docstring (eagle3kit._help,
read only when help is drawn). A command is built only when it is used: `eagle3kit --help`
imports no config.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import sys
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn

import typer
from typer.main import _get_params_name_from_function, get_callback

from eagle3kit._help import HelpGroup, StageCommand
from eagle3kit._options import CLI, Cli
from eagle3kit.errors import UserError

_CLASSVAR = dataclasses._FIELD_CLASSVAR  # type: ignore[attr-defined]


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


@dataclass(frozen=True)
class Option:
    """One option of a command: the field it fills, in the config it belongs to."""

    owner: type
    field: dataclasses.Field
    cli: Cli
    panel: str | None
    default: Any
    """The field's default as its command's config holds it (an embedded one's default
    instance decides), `_help.NOTHING` for a required field."""


def _fields(cls: type) -> Iterator[dataclasses.Field]:
    """The init fields of `cls`, InitVars included, in their declared order."""
    for f in cls.__dataclass_fields__.values():  # type: ignore[attr-defined]
        if f._field_type is not _CLASSVAR and f.init:  # type: ignore[attr-defined]
            yield f


def _spec(f: dataclasses.Field, default: Any) -> Cli | None:
    spec = f.metadata.get(CLI)
    if spec is None and dataclasses.is_dataclass(default) and not isinstance(default, type):
        return Cli(embed=True)  # output=OutputOptions(), write=WriteOptions(...)
    return spec


def _embedded_class(owner: type, f: dataclasses.Field, default: Any) -> type:
    if dataclasses.is_dataclass(default) and not isinstance(default, type):
        return type(default)
    hint = hints(owner)[f.name]
    assert isinstance(hint, type), f"{owner.__name__}.{f.name}: embed needs a dataclass type"
    return hint


def options(cls: type, panel: str | None = None, only: tuple[str, ...] = (),
            base: Any = None) -> list[Option]:
    """The options of config class `cls`, embedded ones in place; `base` is the embedding
    config's default instance of `cls` (its values are the defaults)."""
    from eagle3kit._help import NOTHING, field_default

    found: list[Option] = []
    for f in _fields(cls):
        default = field_default(f) if base is None else getattr(base, f.name)
        spec = _spec(f, default)
        if spec is None or (only and f.name not in only):
            continue
        if spec.embed:
            sub = None if default is NOTHING else default
            found += options(_embedded_class(cls, f, default), spec.panel or panel, spec.only,
                             sub)
        else:
            found.append(Option(cls, f, spec, spec.panel or panel, default))
    names = [o.field.name for o in found]
    dupes = {n for n in names if names.count(n) > 1}
    assert not dupes, f"{cls.__name__}: options named twice: {dupes}"
    return found


@cache
def hints(cls: type) -> dict[str, Any]:
    """The evaluated type of each field of `cls` (InitVars unwrapped)."""
    module = sys.modules[cls.__module__].__dict__
    out: dict[str, Any] = {}
    for f in _fields(cls):
        try:
            hint = eval(f.type, module) if isinstance(f.type, str) else f.type
        except Exception:  # a name only imported for type checkers: parsed as text
            hint = str
        out[f.name] = getattr(hint, "type", hint) if isinstance(hint, dataclasses.InitVar) \
            else hint
    return out


def _parsed_as(hint: Any) -> Any:
    """What the command line parses a field of type `hint` as."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        kinds = [a for a in typing.get_args(hint) if a is not type(None)]
        return _parsed_as(kinds[0]) if len(kinds) == 1 else str
    if origin is list:
        return list[_parsed_as(typing.get_args(hint)[0])]
    if origin is Literal or hint not in (bool, int, float, str, Path):
        return str
    return hint


def _parameter(o: Option) -> inspect.Parameter:
    """The Typer parameter for option `o` (help is filled in when help is drawn)."""
    spec = o.cli
    kind = spec.type or _parsed_as(hints(o.owner)[o.field.name])
    if spec.argument:
        from eagle3kit._help import NOTHING

        required = o.default is NOTHING and not spec.optional
        info: Any = typer.Argument(metavar=spec.metavar, show_default=False)
        if required:
            return inspect.Parameter(o.field.name, inspect.Parameter.KEYWORD_ONLY,
                                     annotation=Annotated[kind, info])
        # Typer takes an optional argument's default from the signature, not from Annotated.
        return inspect.Parameter(o.field.name, inspect.Parameter.KEYWORD_ONLY,
                                 annotation=Annotated[kind | None, info], default=None)
    flag = kind is bool
    flags = spec.flags or ((f"--{o.field.name.replace('_', '-')}",) if flag else ())
    info = typer.Option(*flags, metavar=spec.metavar, rich_help_panel=o.panel,
                        envvar=spec.envvar, hidden=spec.hidden,
                        show_default="/" not in "".join(flags))
    tri_state = flag and "/" in "".join(flags)
    annotation = bool if flag and not tri_state else kind | None
    return inspect.Parameter(o.field.name, inspect.Parameter.KEYWORD_ONLY,
                             annotation=Annotated[annotation, info],
                             default=False if annotation is bool else None)


def build(cls: type, values: dict[str, Any], base: Any = None) -> Any:
    """The config `cls` from the command line's `values` (by field name): only the options
    given are passed, so every other field keeps its default; a required one not given is
    passed as None for the config to refuse by its flag."""
    from eagle3kit._help import NOTHING, field_default

    given: dict[str, Any] = {}
    for f in _fields(cls):
        default = field_default(f) if base is None else getattr(base, f.name)
        spec = _spec(f, default)
        if spec is None:
            continue
        if spec.embed:
            sub = None if default is NOTHING else default
            given[f.name] = build(_embedded_class(cls, f, default), values, sub)
            continue
        value = values.get(f.name)
        if spec.last:
            value = list(value or [])
            given[spec.last] = value.pop() if value else None
        two_way = "/" in "".join(spec.flags)  # --x/--no-x: False is given too
        if value is not None and (value is not False or two_way):
            given[f.name] = (not value) if spec.negate else value
        elif default is NOTHING:
            given[f.name] = value
    return cls(**given) if base is None else dataclasses.replace(base, **given)


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


def _callback(stage: Stage) -> Callable[..., None]:
    def command(**values: Any) -> None:
        config = load(stage.config)
        result = run_stage(load(stage.run), lambda: build(config, values))
        code = getattr(result, "exit_code", 0)
        if code:  # a failed check, problems found, or stopped by a signal
            raise typer.Exit(code)

    return command


class LazyCommand(StageCommand):
    """A stage's command whose options are made from its config when first needed: listing
    it in `eagle3kit --help` imports nothing."""

    def __init__(self, name: str, stage: Stage, **settings: Any) -> None:
        self.stage, self._params = stage, None
        super().__init__(name=name, help=stage.summary, rich_help_panel=stage.panel,
                         params=[], callback=None, **settings)

    @property  # type: ignore[override]
    def params(self) -> list:  # type: ignore[override]
        if self._params is None:
            self._make()
        return self._params  # type: ignore[return-value]

    @params.setter
    def params(self, value: list) -> None:
        if value:
            self._params = value

    def _make(self) -> None:
        config = load(self.stage.config)
        self.configs = (config,)
        self.option_list = options(config)
        command = _callback(self.stage)
        command.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [_parameter(o) for o in self.option_list])
        params, context = _get_params_name_from_function(command)
        self._params = params
        self.callback = get_callback(callback=command, params=params,
                                     context_param_name=context, pretty_exceptions_short=True)


class StagesGroup(HelpGroup):
    """`eagle3kit` (and `eagle3kit bench`): the stages of `stages`, as lazy commands."""

    stages: typing.ClassVar[dict[str, Stage | Group]] = {}

    def __init__(self, *args: Any, stages: dict[str, Stage | Group] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name, stage in (self.stages if stages is None else stages).items():
            if isinstance(stage, Group):
                self.add_command(StagesGroup(
                    name=name, help=stage.summary, rich_help_panel=stage.panel,
                    no_args_is_help=True, stages=stage.stages))
            else:
                self.add_command(LazyCommand(name, stage))


def stages_group(stages: dict[str, Stage | Group]) -> type[StagesGroup]:
    return type("StagesGroup", (StagesGroup,), {"stages": stages})

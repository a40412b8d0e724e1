"""The options of a command, made from its config dataclass, and the config built back from
the values the command line gave them.

Every field of a config is an option (`--field-name`) unless its metadata says otherwise
(`not_option()`; `opt(...)`, `arg(...)`, `embed(...)` from eagle3kit._options for other
names, a positional, an embedded options dataclass); a field whose default is an options
dataclass (`output`, `write`) is embedded without being told. The option's name, metavar and
panel come from that metadata, its default from the field and its help from the field's
docstring (eagle3kit._help, read only when help is drawn).
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from eagle3kit._options import CLI, Cli, check_int_bounds


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
    """The fields `cls(...)` takes, InitVars included, in their declared order: its
    constructor's parameters (ClassVars and init=False fields are none of them)."""
    declared = cls.__dataclass_fields__  # type: ignore[attr-defined]
    for name in inspect.signature(cls).parameters:
        yield declared[name]


def _spec(f: dataclasses.Field, default: Any) -> Cli | None:
    """How field `f` is an option: its metadata's `Cli`; an embedded one when its default is
    an options dataclass (output=OutputOptions()); else a plain `--field-name`. None: not one."""
    if CLI in f.metadata:
        return f.metadata[CLI]
    if dataclasses.is_dataclass(default) and not isinstance(default, type):
        return Cli(embed=True)
    return Cli()


def _embedded_class(owner: type, f: dataclasses.Field, default: Any) -> type:
    if dataclasses.is_dataclass(default) and not isinstance(default, type):
        return type(default)
    hint = hints(owner)[f.name]
    assert isinstance(hint, type), f"{owner.__name__}.{f.name}: embed needs a dataclass type"
    return hint


def options(
    cls: type, panel: str | None = None, only: tuple[str, ...] = (), base: Any = None
) -> list[Option]:
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
            found += options(_embedded_class(cls, f, default), spec.panel or panel, spec.only, sub)
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
        out[f.name] = getattr(hint, "type", hint) if isinstance(hint, dataclasses.InitVar) else hint
    return out


def _parsed_as(hint: Any) -> Any:
    """What the command line parses a field of type `hint` as."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        kinds = [a for a in typing.get_args(hint) if a is not type(None)]
        return _parsed_as(kinds[0]) if len(kinds) == 1 else str
    if origin is list:
        return types.GenericAlias(list, (_parsed_as(typing.get_args(hint)[0]),))  # list[...]
    if origin is Literal or hint not in (bool, int, float, str, Path):
        return str
    return hint


def parameter(o: Option) -> inspect.Parameter:
    """The Typer parameter for option `o` (help is filled in when help is drawn)."""
    spec = o.cli
    kind = spec.type or _parsed_as(hints(o.owner)[o.field.name])
    if spec.argument:
        from eagle3kit._help import NOTHING

        required = o.default is NOTHING and not spec.optional
        info: Any = typer.Argument(metavar=spec.metavar, show_default=False)
        # An optional one's default goes on the parameter: Typer refuses it inside Annotated.
        return inspect.Parameter(
            o.field.name,
            inspect.Parameter.KEYWORD_ONLY,
            annotation=Annotated[kind if required else kind | None, info],
            default=inspect.Parameter.empty if required else None,
        )
    flag = kind is bool
    flags = spec.flags or ((f"--{o.field.name.replace('_', '-')}",) if flag else ())
    info = typer.Option(
        *flags,
        metavar=spec.metavar,
        rich_help_panel=o.panel,
        envvar=spec.envvar,
        hidden=spec.hidden,
        show_default="/" not in "".join(flags),
    )
    tri_state = flag and "/" in "".join(flags)
    annotation = bool if flag and not tri_state else kind | None
    return inspect.Parameter(
        o.field.name,
        inspect.Parameter.KEYWORD_ONLY,
        annotation=Annotated[annotation, info],
        default=False if annotation is bool else None,
    )


def build(cls: type, values: dict[str, Any], base: Any = None, embedded: bool = False) -> Any:
    """The config `cls` from the command line's `values` (by field name): only the options
    given are passed, so every other field keeps its default; a required one not given is
    passed as None for the config to refuse by its flag. Every integer given is bounded
    first, embedded options' too, before any config (which may look at files) is made."""
    from eagle3kit._help import NOTHING, field_default

    if not embedded:
        for o in options(cls):
            if values.get(o.field.name) is not None:
                check_int_bounds(
                    o.field.name, values[o.field.name], hints(o.owner)[o.field.name], o.cli
                )

    given: dict[str, Any] = {}
    for f in _fields(cls):
        default = field_default(f) if base is None else getattr(base, f.name)
        spec = _spec(f, default)
        if spec is None:
            continue
        if spec.embed:
            sub = None if default is NOTHING else default
            given[f.name] = build(_embedded_class(cls, f, default), values, sub, embedded=True)
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

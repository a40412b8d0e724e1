"""`--help` as a user reads it: every default is the stage config's own, never retyped.

cli.py declares options with a default of None (only the options given reach the config, so
the config's defaults apply), which leaves Typer nothing to show. A command made with
`stage_command("eagle3kit.train.config:TrainConfig")` fills that in when, and only when, its
help is drawn: it imports the config (a light module, no torch), reads `dataclasses.fields`,
and shows each option's field default; a field without a default marks its option required
(the stage still refuses a missing one with its own message, alongside any other problem).
The options every stage shares live in dataclasses a config embeds (eagle3kit._options:
`output`, `write`); their fields count as the config's own, with the values of the config's
default instance (extract's `write` commits every 256 samples, gen's every 1000).
It also keeps Python type names out of the help (`<list[Path]>`, `<bool>` on flags) and writes
positionals in the usage line as a user types them (`PROMPTS... OUTPUT`, `RUN OUT`).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import textwrap
from functools import cache
from itertools import pairwise
from pathlib import Path
from typing import Any, ClassVar

from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

_TYPE_WORDS = {int: "INTEGER", float: "NUMBER", str: "TEXT", Path: "PATH"}
NOTHING = object()
"""The default of a field that has none (a required option)."""
_NOTHING = NOTHING


@cache
def docstrings(cls: type) -> dict[str, str]:
    """Field name -> its docstring (the string right after it in the class body), on one
    line: an option's help. Read from the source once, and only when help is drawn."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    found = {}
    for node, after in pairwise(body):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            found[node.target.id] = " ".join(after.value.value.split())
    return found


def config_fields(*configs: str | type) -> dict[str, dataclasses.Field]:
    """Field name -> field over the dataclasses (a class or "module:Class"), the first one
    winning; an embedded options dataclass gives its fields, defaulted as the config's own
    default instance of it has them."""
    fields: dict[str, dataclasses.Field] = {}
    for config in configs:
        if isinstance(config, str):
            module, _, cls = config.partition(":")
            config = getattr(importlib.import_module(module), cls)
        for f in dataclasses.fields(config):
            fields.setdefault(f.name, f)
            value = field_default(f)
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                for sub in dataclasses.fields(value):
                    fields.setdefault(sub.name, _defaulted(sub, getattr(value, sub.name)))
    return fields


def _defaulted(f: dataclasses.Field, value: Any) -> dataclasses.Field:
    """A copy of `f` whose default is `value` (none when `value` is NOTHING)."""
    copy = dataclasses.field() if value is NOTHING else dataclasses.field(default=value)
    copy.name, copy.type = f.name, f.type
    return copy


def field_default(f: dataclasses.Field) -> Any:
    """The field's default (its factory called); `_NOTHING` for a required field."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return _NOTHING


def is_required(f: dataclasses.Field) -> bool:
    return field_default(f) is _NOTHING


def shown(value: Any) -> str | None:
    """A default as help shows it; None when there is nothing worth showing."""
    if value is None or value is _NOTHING or isinstance(value, bool):
        return None
    if isinstance(value, float):
        return format(value, "g")
    if isinstance(value, list | tuple | dict | set):
        return ",".join(map(str, value)) if value and not isinstance(value, dict) else None
    return str(value)


class StageCommand(TyperCommand):
    """A subcommand whose help takes defaults and required marks from its stage configs."""

    configs: tuple[str | type, ...] = ()  # a LazyCommand sets its own, once made
    fields_of: ClassVar[dict[str, str]] = {}
    """Option parameter name -> config field name, where the two differ."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self.describe(ctx)
        super().format_help(ctx, formatter)

    def describe(self, ctx: Any) -> None:
        """Put the configs' defaults, required marks and plain type words on the parameters."""
        made = {o.field.name: o for o in getattr(self, "option_list", ())}
        if made:  # built from its config (eagle3kit._command): help from the docstrings
            for param in self.get_params(ctx):
                o = made.get(param.name or "")
                f = None if o is None else _defaulted(o.field, o.default)
                if o is not None and isinstance(param, TyperOption | TyperArgument):
                    param.help = param.help or docstrings(o.owner).get(o.field.name)
                if isinstance(param, TyperOption):
                    _describe_option(param, f)
                elif isinstance(param, TyperArgument):
                    _describe_argument(param, f)
            return
        fields = config_fields(*self.configs)
        for param in self.get_params(ctx):
            f = fields.get(self.fields_of.get(param.name or "", param.name or ""))
            if isinstance(param, TyperOption):
                _describe_option(param, f)
            elif isinstance(param, TyperArgument):
                _describe_argument(param, f)

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if isinstance(param, TyperArgument):
                pieces.append(usage_name(param))
        return pieces


class HelpGroup(TyperGroup):
    """`eagle3kit` and `eagle3kit bench`: their own options (--version, --help) shown without
    type names too."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        for param in self.get_params(ctx):
            if isinstance(param, TyperOption):
                _describe_option(param, None)
        super().format_help(ctx, formatter)


def _describe_option(param: TyperOption, f: dataclasses.Field | None) -> None:
    if param.is_flag:
        param.metavar = ""  # a flag takes no value: no type column
        return
    if param.metavar is None:
        param.metavar = _type_word(param)
    if f is None:
        return
    if is_required(f):
        param.required = True  # for the help only: it exits before anything is parsed
        return
    value = shown(field_default(f))
    if value is not None:
        param.default, param.show_default = value, True


def _describe_argument(param: TyperArgument, f: dataclasses.Field | None) -> None:
    # Its name column says what it is (PROMPTS... OUTPUT); Typer's type column would add
    # `<list[Path]>`, a Python type name.
    param.display_type_rich = lambda ctx: None  # type: ignore[method-assign]
    if f is not None and is_required(f):
        param.required = True  # bench's PROMPTS...: optional to click, for the --prompts alias
    value = None if f is None else shown(field_default(f))
    if value is not None:
        param.default, param.show_default = value, True


def _type_word(param: TyperOption) -> str:
    descriptor = getattr(param, "type_descriptor", None)  # Typer >= 0.20; before, click's type
    if descriptor is None:
        word = str(getattr(getattr(param, "type", None), "name", "text")).upper()
    elif getattr(descriptor, "is_path", False):
        word = "PATH"
    else:
        word = _TYPE_WORDS.get(descriptor.annotation, "TEXT")
    return word + ("..." if param.multiple else "")


def usage_name(param: TyperArgument) -> str:
    """An argument in the usage line: its metavar as written, else its name in capitals."""
    if param.metavar:
        return param.metavar
    name = (param.name or "").upper() + ("..." if param.nargs != 1 else "")
    return name if param.required else f"[{name}]"


def stage_command(*configs: str, **fields_of: str) -> type[StageCommand]:
    """The command class for a stage whose options are the fields of `configs`."""
    return type("StageCommand", (StageCommand,), {"configs": configs, "fields_of": fields_of})

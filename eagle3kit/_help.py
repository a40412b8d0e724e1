"""`--help` as a user reads it: every default is the stage config's own, never retyped.

The commands eagle3kit._command builds declare their options with a default of None (only the
options given reach the config, so the config's defaults apply), which leaves Typer nothing to
show. A `StageCommand` fills that in when, and only when, its help is drawn: each option's
help is its field's docstring and its default the field's default; a field without a default
marks its option required (the stage still refuses a missing one with its own message,
alongside any other problem). The options every stage shares live in dataclasses a config
embeds (eagle3kit._options: `output`, `write`); their defaults are the config's default
instance's (extract's `write` commits every 256 samples, gen's every 1000).
It also keeps Python type names out of the help (`<list[Path]>`, `<bool>` on flags) and writes
positionals in the usage line as a user types them (`PROMPTS... OUTPUT`, `RUN OUT`).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
from collections.abc import Sequence
from functools import cache
from itertools import pairwise
from pathlib import Path
from typing import Any

from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

_TYPE_WORDS = {int: "INTEGER", float: "NUMBER", str: "TEXT", Path: "PATH"}
NOTHING = object()
"""The default of a field that has none (a required option)."""


@cache
def docstrings(cls: type) -> dict[str, str]:
    """Field name -> its docstring (the string right after it in the class body), on one
    line: an option's help. Read from the source once, and only when help is drawn."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    found = {}
    for node, after in pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            found[node.target.id] = " ".join(after.value.value.split())
    return found


def field_default(f: dataclasses.Field) -> Any:
    """The field's default (its factory called); `NOTHING` for a required field."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return NOTHING


def shown(value: Any) -> str | None:
    """A default as help shows it; None when there is nothing worth showing."""
    if value is None or value is NOTHING or isinstance(value, bool):
        return None
    if isinstance(value, float):
        return format(value, "g")
    if isinstance(value, list | tuple | dict | set):
        return ",".join(map(str, value)) if value and not isinstance(value, dict) else None
    return str(value)


class StageCommand(TyperCommand):
    """A subcommand whose help takes defaults, required marks and help texts from the config
    fields its options fill (`option_list`, eagle3kit._command_options's `Option`s)."""

    option_list: Sequence[Any] = ()  # a LazyCommand sets its own, once made

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self.describe(ctx)
        super().format_help(ctx, formatter)

    def describe(self, ctx: Any) -> None:
        """Put the configs' defaults, required marks and plain type words on the parameters."""
        params = self.get_params(ctx)  # made first: a LazyCommand makes its options with them
        made = {o.field.name: o for o in self.option_list}
        for param in params:
            o = made.get(param.name or "")
            if o is not None and isinstance(param, TyperOption | TyperArgument):
                param.help = param.help or docstrings(o.owner).get(o.field.name)
            default = None if o is None else o.default
            if isinstance(param, TyperOption):
                _describe_option(param, default, o is not None)
            elif isinstance(param, TyperArgument):
                _describe_argument(param, default)

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
                _describe_option(param, None, False)
        super().format_help(ctx, formatter)


def _describe_option(param: TyperOption, default: Any, has_field: bool) -> None:
    """A flag without a type column; a value option with a type word and, when it fills a
    config field, that field's `default` shown (`NOTHING`: marked required)."""
    if param.is_flag:
        param.metavar = ""  # a flag takes no value: no type column
        return
    if param.metavar is None:
        param.metavar = _type_word(param)
    if not has_field:
        return
    if default is NOTHING:
        param.required = True  # for the help only: it exits before anything is parsed
        return
    value = shown(default)
    if value is not None:
        param.default, param.show_default = value, True


def _describe_argument(param: TyperArgument, default: Any) -> None:
    # Its name column says what it is (PROMPTS... OUTPUT); Typer's type column would add
    # `<list[Path]>`, a Python type name.
    param.display_type_rich = lambda ctx: None  # type: ignore[method-assign]
    if default is NOTHING:
        param.required = True  # bench's PROMPTS...: optional to click, for the --prompts alias
    value = shown(default)
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

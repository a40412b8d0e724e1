"""--config FILE: a settings file (TOML, YAML or JSON) read, bounded, and turned into the
defaults of a command's options.

Its keys are the command's flag names, its values become the options' defaults (click's
default_map), so a flag on the command line (or its EAGLE3KIT_* variable) overrides the file.
A JSON file holding a `config` object (a train run's run.json, a dataset's manifest.json) is
a recorded run: that object's keys that are options are replayed, the others named in one
note. An option marked `cli_only` (eagle3kit._options.CLI_ONLY) comes from the command line
only: a settings file that sets it is refused by key and flag, a recorded run's value is
named in that note and dropped.
"""

from __future__ import annotations

import datetime
import difflib
import json
import stat
import sys
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from eagle3kit._command_options import Option, hints
from eagle3kit._options import CLI_ONLY
from eagle3kit.errors import UserError

CONFIG_HELP = (
    "Options from FILE (TOML or YAML, keys the flags' names), or a run.json / "
    "manifest.json to repeat a run; flags given here override it."
)
NOT_REPLAYED = "eagle3kit.not_replayed"
_FORMATS = {".toml": "TOML", ".yaml": "YAML", ".yml": "YAML", ".json": "JSON"}
_MAX_BYTES = {"TOML": 256 << 10, "YAML": 256 << 10, "JSON": 16 << 20}
"""The most a settings file may hold: a hand-written one is short; a recorded run's JSON is a
dataset's manifest.json, whose shard list grows with the dataset."""
_SCALARS = (str, int, float, datetime.date, datetime.time)  # bool is an int


def read_settings(path: Path) -> tuple[dict[str, Any], bool]:
    """FILE's settings, and whether they are a recorded run's: the `config` object of a JSON
    file (a train run's run.json, a dataset's manifest.json)."""
    kind = _FORMATS.get(path.suffix.lower())
    if kind is None:
        raise UserError(f"--config {path}: not a .toml, .yaml, .yml or .json file")
    text = _read_text(path, _MAX_BYTES[kind])
    try:
        found = _parse(kind, text)
    except UserError as exc:
        raise UserError(f"--config {path}: {exc}") from None
    except Exception as exc:  # each parser's own error, which says where (line, column)
        raise UserError(
            f"--config {path}: not valid {kind}: {' '.join(str(exc).split())}"
        ) from None
    recorded = kind == "JSON" and isinstance(found, dict) and isinstance(found.get("config"), dict)
    if recorded:
        found = found["config"]
    if not isinstance(found, dict):
        raise UserError(f"--config {path}: not a table of settings (key = value lines)")
    deep = _too_deep(found)
    if deep is not None:
        raise UserError(f"--config {path}: '{deep}' nests deeper than {_DEPTH} levels")
    return found, recorded


def _too_deep(settings: dict[str, Any]) -> str | None:
    """The key under which `settings` nest deeper than _DEPTH lists and tables, if any
    (walked without recursion: JSON and TOML parsers allow about a thousand levels)."""
    stack = [(str(k), v, 1) for k, v in settings.items() if isinstance(v, dict | list)]
    while stack:
        key, value, depth = stack.pop()
        if depth > _DEPTH:
            return key
        inner = value.values() if isinstance(value, dict) else value
        stack += [(key, v, depth + 1) for v in inner if isinstance(v, dict | list)]
    return None


def _read_text(path: Path, limit: int) -> str:
    """The file's text, refused past `limit` bytes and when it is no regular file (a FIFO
    would wait for a writer, a device never ends)."""
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            raise UserError(f"--config {path}: not a regular file")
        with open(path, "rb") as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise UserError(
                f"--config {path}: larger than {limit >> 10} KiB; a settings file "
                "is a page of options"
            )
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(
            f"--config {path}: not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None
    except OSError as exc:
        raise UserError(f"--config {path}: {exc.strerror or exc}") from None


def _parse(kind: str, text: str) -> Any:
    if kind == "JSON":
        return json.loads(text)
    if kind == "YAML":
        return _load_yaml(text)
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python 3.10: the same parser, as its own package
        import tomli as tomllib
    return tomllib.loads(text)


_DEPTH = 32
"""The deepest a settings file nests: its values are plain, lists or tables of plain values."""


def _load_yaml(text: str) -> Any:
    """YAML's safe load (libyaml's where installed), refusing anchors and aliases first: a
    settings file has no use for them, and 400 bytes of nested aliases expand to gigabytes
    (the "billion laughs"). The events are read as a stream, so the refusal costs what the
    text does."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    frames: list[list[Any]] = []  # per open list or table: [is table, items seen, its key]
    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise UserError(
                f"{_yaml_where(frames)} (line {event.start_mark.line + 1}) holds a "
                "YAML anchor or alias (&, *): write each value out"
            )
        if isinstance(event, yaml.CollectionStartEvent):
            if len(frames) == _DEPTH:
                raise UserError(
                    f"{_yaml_where(frames)} (line {event.start_mark.line + 1}) "
                    f"nests deeper than {_DEPTH} levels"
                )
            frames.append([isinstance(event, yaml.MappingStartEvent), 0, None])
        elif isinstance(event, yaml.CollectionEndEvent | yaml.ScalarEvent):
            if isinstance(event, yaml.CollectionEndEvent):
                frames.pop()
            if frames:  # one more item of the enclosing list or table; a table's keys named
                top = frames[-1]
                if top[0] and top[1] % 2 == 0:
                    top[2] = event.value if isinstance(event, yaml.ScalarEvent) else "?"
                top[1] += 1
    return yaml.load(text, Loader=loader)  # a safe loader; no anchors, no aliases


def _yaml_where(frames: list[list[Any]]) -> str:
    """The key whose value is being read, dotted from the top ('a.b'), or "the file"."""
    keys = [str(f[2]) for f in frames[:-1] if f[0] and f[2] is not None]
    if frames and frames[-1][0] and frames[-1][1] % 2 == 1:  # in a table, at a key's value
        keys.append(str(frames[-1][2]))
    return f"'{'.'.join(keys)}'" if keys else "the file"


@dataclass(frozen=True)
class _Key:
    """What a key of a settings file fills: a parameter of the command."""

    param: Any
    option: Option
    negated: bool = False
    """The field's name of a --no-x flag (`verify = false` is --no-verify), or --no-x itself."""
    last: bool = False
    """The field a `DATA... RUN` positional's last value fills (`out`)."""


def setting_keys(params: list[Any], option_list: Sequence[Option]) -> dict[str, _Key]:
    """Each key a settings file may use for the command's parameters: the long flag names and
    the field names, dashes and underscores alike (looked up with dashes)."""
    by_field = {o.field.name: o for o in option_list}
    keys: dict[str, _Key] = {}
    for param in params:
        o = by_field.get(param.name or "")
        if o is None:  # --config, --help
            continue
        keys[_dashed(param.name)] = _Key(param, o, negated=o.cli.negate)
        for flag in param.opts:
            if flag.startswith("--"):
                keys[flag[2:]] = _Key(param, o)
        for flag in getattr(param, "secondary_opts", ()):  # --no-fc-norm
            keys[flag[2:]] = _Key(param, o, negated=True)
        if o.cli.last:
            keys[_dashed(o.cli.last)] = _Key(param, o, last=True)
    return keys


def _dashed(key: str) -> str:
    return key.replace("_", "-")


def cli_only_refusal(path: Path, key: str, found: _Key) -> UserError:
    """The one line refusing a settings file's `key` that only the command line may give."""
    o, param = found.option, found.param
    flag = next((f for f in param.opts if f.startswith("--")), param.opts[0])
    typed = (
        flag
        if getattr(param, "is_flag", False)
        else f"{flag} {o.cli.metavar or o.field.name.upper()}"
    )
    if o.cli.envvar:
        typed += f" or set {o.cli.envvar}"
    why = CLI_ONLY[o.cli.cli_only or ""]
    return UserError(
        f"--config {path}: '{key}' is taken from the command line only ({why}): "
        f"type {typed} (docs/security.md)"
    )


def file_defaults(
    ctx: Any, settings: dict[str, Any], recorded: bool, path: Path, keys: dict[str, _Key]
) -> tuple[dict[str, Any], list[str]]:
    """The parameters' values from a settings file (by parameter name), and the keys of a
    recorded run that are not replayed: not options here, or options only the command line
    gives (`Cli.cli_only`), which a settings file may not set at all. An unknown key of a
    settings file is refused, naming the closest known one."""
    raw: dict[str, Any] = {}
    written: dict[str, str] = {}  # parameter name -> the key that set it
    tails: dict[str, Any] = {}
    skipped: list[str] = []
    for key, value in settings.items():
        lookup = _dashed(str(key))
        found = keys.get(lookup)
        if found is None:
            if recorded:  # run.json's `write` (how the output was opened), gen's `renderer`
                skipped.append(str(key))
                continue
            _refuse_nested_cli_only(path, str(key), value, keys)
            close = difflib.get_close_matches(lookup, list(keys), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise UserError(f"--config {path}: unknown key '{key}'{hint}")
        if value is None:  # recorded as not given: the option's default
            continue
        if found.option.cli.cli_only:
            if not recorded:
                raise cli_only_refusal(path, str(key), found)
            if value != found.option.default:  # what it set is not replayed (the default is)
                skipped.append(str(key))
            continue
        name = found.param.name
        slot = tails if found.last else raw
        if name in slot:
            raise UserError(f"--config {path}: '{key}' and '{written[name]}' set the same option")
        written[name] = key
        slot[name] = _plain(found, str(key), value, path)
    for name, tail in tails.items():  # `out` after `data`: the positional's last value
        raw[name] = [*raw.get(name, []), tail]
    return {
        name: _cast(ctx, keys, written[name], value, path) for name, value in raw.items()
    }, skipped


def _refuse_nested_cli_only(path: Path, key: str, value: Any, keys: dict[str, _Key]) -> None:
    """A table under a key that is no option (`[write]`, `output:`) holding, at any depth, a
    key only the command line may give: refused by that key, as at the top."""
    stack = [(key, value)] if isinstance(value, dict | list) else []
    while stack:
        where, value = stack.pop()
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for sub, inner in items:
            found = keys.get(_dashed(str(sub))) if isinstance(value, dict) else None
            if found is not None and found.option.cli.cli_only:
                raise cli_only_refusal(path, f"{where}.{sub}", found)
            if isinstance(inner, dict | list):
                stack.append((f"{where}.{sub}", inner))


def _plain(found: _Key, key: str, value: Any, path: Path) -> Any:
    """A file's value as the command line would give it: true/false for a flag, a list for an
    option given several times, a list joined by commas where the flag takes A,B, a table as
    JSON where the flag takes JSON; anything else takes one plain value."""
    param, o = found.param, found.option
    if getattr(param, "is_flag", False):
        if not isinstance(value, bool):
            raise UserError(f"--config {path}: '{key}' is a flag: true or false (got {value!r})")
        return not value if found.negated else value
    if found.last:
        return _one(key, value, path, dataset=True)
    if param.multiple or param.nargs == -1:
        return [
            _one(key, v, path, dataset=True)
            for v in (value if isinstance(value, list) else [value])
        ]
    if isinstance(value, list) and "," in (o.cli.metavar or ""):  # layers = [2, 18, 33]
        return ",".join(str(_one(key, v, path)) for v in value)
    if isinstance(value, dict) and _takes_json(o):  # chat-template-kwargs = {thinking = true}
        return json.dumps(value)
    return _one(key, value, path)


def _one(key: str, value: Any, path: Path, dataset: bool = False) -> Any:
    """One plain value; with `dataset`, a recorded dataset ({path, weight}) as DIR:WEIGHT."""
    if (
        dataset
        and isinstance(value, dict)
        and set(value) == {"path", "weight"}
        and all(isinstance(v, _SCALARS) for v in value.values())
    ):
        return f"{value['path']}:{value['weight']}"
    if not isinstance(value, _SCALARS):
        kind = (
            "a list"
            if isinstance(value, list)
            else "a table"
            if isinstance(value, dict)
            else type(value).__name__
        )
        raise UserError(f"--config {path}: '{key}' takes one plain value here (got {kind})")
    return value


def _takes_json(o: Option) -> bool:
    """Whether the option's field holds a JSON object (chat_template_kwargs)."""
    hint = hints(o.owner)[o.field.name]
    return any(a is dict or typing.get_origin(a) is dict for a in (hint, *typing.get_args(hint)))


def _cast(ctx: Any, keys: dict[str, _Key], key: str, value: Any, path: Path) -> Any:
    """`value` through the parameter's own type, as the command line's text would go."""
    param = keys[_dashed(key)].param
    try:
        return param.process_value(ctx, value)
    except typer.BadParameter as exc:
        raise UserError(f"--config {path}: '{key}': {exc.message}") from None

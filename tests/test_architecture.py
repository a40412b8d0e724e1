"""The import rules of ARCHITECTURE.md, held over every module of the package.

Every import statement counts, the ones inside functions too (a stage imports torch
lazily; a lazy import of the CLI is still an import of the CLI). ruff's banned-api rule
(pyproject.toml) holds a few of these rules where they are written; this test holds all of
them per room, and its first tests show the checker catches each kind of break.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "eagle3kit"

STAGES = ("gen", "validate", "extract", "extract_vllm", "train", "export", "bench", "convert",
          "hidden_convert", "info", "plan", "quickstart")
"""The stage rooms (`eagle3kit.<name>`, a module or a package)."""
SHARED = ("errors", "target", "tiny", "_argv", "_durable", "_hf", "_json", "_lazy", "_options",
          "_ranks", "_ui", "_urls")
"""Helpers every room may use; they use no stage, no CLI (and only _ui prints)."""
FORMAT_PUBLIC = "eagle3kit.format"

# (rule, which modules it binds, what they may not import, modules it does not bind, imports
# it allows)
RULES: list[tuple[str, str, tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = [
    ("only _ui.py imports rich", "*", ("rich",), ("eagle3kit._ui",), ()),
    ("only the command line imports typer", "*", ("typer",),
     ("eagle3kit.cli", "eagle3kit._help", "eagle3kit._command"), ()),
    ("no stage imports the CLI", "*", ("eagle3kit.cli", "eagle3kit._help", "eagle3kit._command"),
     ("eagle3kit.__main__", "eagle3kit.cli", "eagle3kit._command"), ()),
    ("format/ imports no stage and no UI", "eagle3kit.format",
     ("eagle3kit._ui", "eagle3kit.cli", "eagle3kit.model", "eagle3kit.checkpoints",
      *(f"eagle3kit.{s}" for s in STAGES)), (), ()),
    ("model/ imports no stage, no UI and no checkpoint reader", "eagle3kit.model",
     ("eagle3kit._ui", "eagle3kit.cli", "eagle3kit.format", "eagle3kit.checkpoints",
      *(f"eagle3kit.{s}" for s in STAGES)), (), ()),
    ("checkpoints/ imports no stage and no UI", "eagle3kit.checkpoints",
     ("eagle3kit._ui", "eagle3kit.cli", *(f"eagle3kit.{s}" for s in STAGES)), (), ()),
    ("target/ imports no stage, no CLI and no UI", "eagle3kit.target",
     ("eagle3kit._ui", "eagle3kit.cli", "eagle3kit._help", "eagle3kit.model",
      "eagle3kit.checkpoints", "eagle3kit.format", *(f"eagle3kit.{s}" for s in STAGES)), (), ()),
    ("chat/ imports no stage, no UI, no format, no model and no checkpoint reader",
     "eagle3kit.chat",
     ("eagle3kit._ui", "eagle3kit.cli", "eagle3kit.format", "eagle3kit.model",
      "eagle3kit.checkpoints", *(f"eagle3kit.{s}" for s in STAGES)), (), ()),
    ("a shared helper imports no stage", "shared",
     ("eagle3kit.cli", "eagle3kit.model", "eagle3kit.checkpoints",
      *(f"eagle3kit.{s}" for s in STAGES)), ("eagle3kit.target",), ()),
    ("outside format/, format is imported through its public view only", "*",
     ("eagle3kit.format.",), ("eagle3kit.format",), ()),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(source: str, module: str, is_package: bool, known: set[str]) -> list[tuple[str, int]]:
    """(imported module, line) for every import in source; `from a import b` gives a.b when
    that is a module."""
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = module.split(".") if is_package else module.split(".")[:-1]
                here = here[:len(here) - node.level + 1]
                base = ".".join([*here, *([base] if base else [])])
            found.append((base, node.lineno))
            found += [(f"{base}.{a.name}", node.lineno) for a in node.names
                      if f"{base}.{a.name}" in known]
    return found


def in_room(module: str, room: str) -> bool:
    return module == room or module.startswith(room + ".")


def applies(scope: str, module: str) -> bool:
    if scope == "*":
        return True
    if scope == "shared":
        return any(in_room(module, f"eagle3kit.{s}") for s in SHARED)  # target/ is a package
    return in_room(module, scope)


def banned(imported: str, bans: tuple[str, ...]) -> bool:
    return any(imported.startswith(b) if b.endswith(".") else in_room(imported, b) for b in bans)


def breaks(module: str, source: str, is_package: bool, known: set[str]) -> list[str]:
    """Every rule `module` breaks, as 'module:line imports X (rule)', once per line and rule."""
    out: dict[tuple[int, str], str] = {}
    found = imports(source, module, is_package, known)
    for rule, scope, bans, unbound, allowed in RULES:
        if not applies(scope, module) or any(in_room(module, u) for u in unbound):
            continue
        for imported, line in found:
            if imported not in allowed and banned(imported, bans):
                out.setdefault((line, rule), f"{module}:{line} imports {imported} ({rule})")
    return list(out.values())


# The checker catches each kind of break ---------------------------------------------------
KNOWN = set(all_modules())


@pytest.mark.parametrize(("module", "source", "rule"), [
    ("eagle3kit.format.reader", "from eagle3kit import _ui\n", "format/ imports no stage"),
    ("eagle3kit.format.shard", "def f():\n    from eagle3kit.gen import GenConfig\n",
     "format/ imports no stage"),
    ("eagle3kit.model.drafter", "from ..train import loop\n", "model/ imports no stage"),
    ("eagle3kit.model.config", "from eagle3kit.checkpoints.detect import inspect\n",
     "no checkpoint reader"),
    ("eagle3kit.chat.render", "import rich.console\n", "only _ui.py imports rich"),
    ("eagle3kit.export", "from eagle3kit.cli import main\n", "no stage imports the CLI"),
    ("eagle3kit.validate.checks", "import typer\n", "only the command line imports typer"),
    ("eagle3kit.info", "from eagle3kit.format.layout import MANIFEST\n", "public view only"),
    ("eagle3kit.checkpoints.detect", "from eagle3kit.train.loop import Trainer\n",
     "checkpoints/ imports no stage"),
    ("eagle3kit.checkpoints.load", "from eagle3kit.train.rundir import RunDir\n",
     "checkpoints/ imports no stage"),
    ("eagle3kit.checkpoints.tensors", "from eagle3kit.hidden_convert import BadFile\n",
     "checkpoints/ imports no stage"),
    ("eagle3kit.tiny", "from eagle3kit.extract import ExtractConfig\n",
     "a shared helper imports no stage"),
    ("eagle3kit.target.capture", "from eagle3kit import _ui\n", "target/ imports no stage"),
    ("eagle3kit.target.head", "from eagle3kit.train.target import TargetBatch\n",
     "target/ imports no stage"),
    ("eagle3kit.chat.render", "from eagle3kit.gen.types import Conversation\n",
     "chat/ imports no stage"),
    ("eagle3kit.chat.phases", "def f():\n    from eagle3kit.bench import accept\n",
     "chat/ imports no stage"),
    ("eagle3kit.chat.reasoning", "from eagle3kit import _ui\n", "chat/ imports no stage"),
])
def test_the_checker_catches(module: str, source: str, rule: str) -> None:
    found = breaks(module, source, False, KNOWN)
    assert len(found) == 1 and rule in found[0], found


@pytest.mark.parametrize(("module", "source"), [
    ("eagle3kit.format.reader", "from eagle3kit.format._io import read_json\n"
                                "from eagle3kit import __version__\n"),
    ("eagle3kit.checkpoints.detect", "from eagle3kit.checkpoints.rundir import RunDir\n"),
    ("eagle3kit.info", "from eagle3kit.format import Dataset\n"),
    ("eagle3kit.chat.render", "from eagle3kit.errors import UserError\n"
                              "from eagle3kit.chat.markers import think_pair\n"),
    ("eagle3kit.train.ttt", "from eagle3kit.chat.phases import PHASES\n"),
    ("eagle3kit._ui", "import rich\n"),
    ("eagle3kit.cli", "import typer\nfrom eagle3kit.gen import config\n"),
])
def test_the_checker_allows(module: str, source: str) -> None:
    assert breaks(module, source, False, KNOWN) == []


# The package keeps the rules ---------------------------------------------------------------
def test_every_module_keeps_the_import_rules() -> None:
    modules = all_modules()
    assert len(modules) > 60 and "eagle3kit.format.reader" in modules  # the walk found them
    found = [b for name, path in modules.items()
             for b in breaks(name, path.read_text(), path.name == "__init__.py", KNOWN)]
    assert found == []


def test_every_room_is_named() -> None:
    # A new top-level module or package is placed in a room here (and in ARCHITECTURE.md).
    rooms = {"__main__", "cli", "format", "model", "checkpoints", "chat", *STAGES, *SHARED,
             "_help", "_command"}
    tops = {name.split(".")[1] for name in all_modules() if name.count(".") >= 1}
    assert tops - rooms == set()


def test_architecture_notes_name_every_room() -> None:
    notes = (PACKAGE.parent / "ARCHITECTURE.md").read_text()
    for room in ("format/", "model/", "checkpoints/", "chat/", "validate/", "gen/servers/",
                 "train/",
                 "bench/", "cli.py", "_ui.py", "target/", "_options.py", "_durable.py",
                 "checkpoints/rundir.py", "_ranks.py"):
        assert f"`eagle3kit/{room}`" in notes, room

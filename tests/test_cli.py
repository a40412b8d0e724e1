"""The command's shared conventions: instant help, version, exit statuses, env twins, --json."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from eagle3kit import __version__


def eagle3kit(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None):
    return subprocess.run(
        [sys.executable, "-m", "eagle3kit", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        timeout=120,
    )


def write_jsonl(path: Path, n: int = 20) -> Path:
    with open(path, "wb") as f:
        for i in range(n):
            f.write(
                orjson.dumps(
                    {
                        "sample_id": f"s{i}",
                        "prompt_ids": [1, 2, i],
                        "completion_ids": list(range(i + 1)),
                        "finish_reason": "stop",
                        "partition": "even" if i % 2 == 0 else "odd",
                        "metadata": {},
                    }
                )
                + b"\n"
            )
    return path


def test_help_does_not_import_torch_or_transformers():
    """`eagle3kit --help` imports no stage; a stage's --help imports only its config (to show
    the config's defaults), never torch or transformers."""
    code = (
        "import sys\nfrom eagle3kit.cli import app\n"
        "def show(*argv):\n"
        "    try:\n        app([*argv, '--help'])\n    except SystemExit:\n        pass\n"
        "    print(argv, sorted(m for m in ('torch', 'transformers', 'numpy')\n"
        "                       if m in sys.modules))\n"
        "show()\n"
        "for sub in ('info', 'convert', 'validate', 'gen', 'plan', 'extract', 'train',\n"
        "            'export', 'quickstart'):\n"
        "    show(sub)\n"
        "show('bench', 'accept')\nshow('bench', 'server')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith("(")]
    assert lines[0] == "() []", lines[0]  # the top level: not even numpy
    assert len(lines) == 12 and all(line.endswith(("[]", "['numpy']")) for line in lines), lines


def test_validate_help_loads_no_numpy():
    """validate's config lists its check names itself, so its --help loads none of the
    checks (numpy): before, the names came from the checks' registry."""
    code = (
        "import sys\nfrom eagle3kit.cli import app\ntry:\n    app(['validate', '--help'])\n"
        "except SystemExit:\n    pass\nprint('numpy' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines()[-1] == "False"


def test_a_lazy_face_keeps_its_functions_over_their_submodules():
    """validate's face loads run.py on first use; reading `validate` first must not leave
    `eagle3kit.validate.run` the submodule that import bound on the package."""
    code = (
        "import eagle3kit.validate as face\nfrom eagle3kit.validate import validate\n"
        "print(callable(face.run), face.run.__module__, validate.__module__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "eagle3kit.validate.run", "eagle3kit.validate.run"]


def test_version():
    result = eagle3kit("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"eagle3kit {__version__}"


def test_no_arguments_shows_help_and_usage_errors_exit_2():
    assert "convert" in eagle3kit().stdout + eagle3kit().stderr
    result = eagle3kit("info")
    assert result.returncode == 2
    assert "Missing argument" in result.stderr


def test_missing_input_is_one_error_line_exit_2(tmp_path):
    result = eagle3kit("info", str(tmp_path / "nowhere"))
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {tmp_path / 'nowhere'}: no such directory"
    assert "Traceback" not in result.stderr


def test_json_goes_to_stdout_and_people_output_to_stderr(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl")
    result = eagle3kit("convert", str(src), str(tmp_path / "ds"), "--json")
    assert result.returncode == 0, result.stderr
    assert orjson.loads(result.stdout)["written"] == 20
    assert "20 samples added" in result.stderr
    info = eagle3kit("info", str(tmp_path / "ds"), "--json")
    report = orjson.loads(info.stdout)
    assert report["samples"] == 20 and set(report["partitions"]) == {"even", "odd"}
    assert info.stderr == ""


def test_env_twins(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl")
    quiet = eagle3kit("convert", str(src), str(tmp_path / "ds"), env={"EAGLE3KIT_QUIET": "1"})
    assert quiet.returncode == 0 and quiet.stderr == ""
    as_json = eagle3kit("info", str(tmp_path / "ds"), env={"EAGLE3KIT_JSON": "1"})
    assert orjson.loads(as_json.stdout)["samples"] == 20
    bad = eagle3kit("info", str(tmp_path / "ds"), env={"EAGLE3KIT_LOG_EVERY": "0"})
    assert bad.returncode == 2 and "--log-every" in bad.stderr


def test_plain_status_lines_when_not_a_terminal(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl")
    result = eagle3kit("convert", str(src), str(tmp_path / "ds"), "--log-every", "0.001")
    assert result.returncode == 0
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("convert ")]
    assert lines and lines[-1].startswith("convert 20/20 (100.0%)")
    assert "\x1b[" not in result.stderr


def test_resume_and_overwrite_exclude_each_other(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl")
    result = eagle3kit("convert", str(src), str(tmp_path / "ds"), "--resume", "--overwrite")
    assert result.returncode == 2
    assert "--resume and --overwrite" in result.stderr


def test_rerun_continues_and_overwrite_starts_afresh(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl")
    ds = str(tmp_path / "ds")
    assert eagle3kit("convert", str(src), ds).returncode == 0
    again = eagle3kit("convert", str(src), ds, "--json")
    assert orjson.loads(again.stdout)["written"] == 0
    assert orjson.loads(again.stdout)["skipped_existing"] == 20
    fresh = eagle3kit("convert", str(src), ds, "--overwrite", "--json")
    assert orjson.loads(fresh.stdout)["written"] == 20
    assert orjson.loads(eagle3kit("info", ds, "--json").stdout)["samples"] == 20


@pytest.mark.parametrize(
    "command", [["check", "."], ["format", "--check", "."]], ids=["check", "format"]
)
def test_ruff_is_clean(command: list[str]):
    """The lint rules and the formatter both hold over the repository (CI runs this test)."""
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run(
        [sys.executable, "-m", "ruff", *command], cwd=root, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


REFUSALS = [  # a mistyped path for each stage: refused by name before torch is imported
    (["train", "{x}/no-data", "{x}/run", "--target", "{x}/no-target"], "{x}/no-data"),
    (["export", "{x}/no-run", "{x}/out"], "{x}/no-run: no such run directory"),
    (
        ["bench", "accept", "{x}/no.jsonl", "--target", "{x}", "--drafter", "{x}"],
        "{x}/no.jsonl: no such prompt file",
    ),
    (
        ["bench", "server", "{x}/no.jsonl", "--server", "http://127.0.0.1:9", "--tokenizer", "{x}"],
        "{x}/no.jsonl: no such prompt file",
    ),
    (
        ["extract", "{x}/no-tokens", "{x}/out", "--target", "{x}/no-target"],
        "--target {x}/no-target: no such directory",
    ),
    (["info", "{x}/nothing"], "{x}/nothing: no such directory"),
    (["validate", "{x}/nothing"], "{x}/nothing"),
    (["convert", "{x}/no.jsonl", "{x}/out"], "{x}/no.jsonl"),
    (
        ["gen", "{x}/no.jsonl", "{x}/out", "--server", "http://127.0.0.1:9", "--tokenizer", "{x}"],
        "{x}/no.jsonl: no such prompt file",
    ),
]


def test_mistyped_paths_are_refused_before_torch_loads(tmp_path):
    """Each stage checks its paths in its config, so a typo costs a second, not the 7-22 s of
    importing torch and transformers first. One process runs them all in turn and reports,
    after each, whether torch or transformers had been imported."""
    code = (
        "import json, sys\nfrom eagle3kit.cli import main\n"
        "for argv in json.loads(sys.argv[1]):\n"
        "    sys.argv = ['eagle3kit', *argv]\n"
        "    try:\n        main()\n    except SystemExit as exc:\n"
        "        status = exc.code\n"
        "    heavy = sorted(m for m in ('torch', 'transformers') if m in sys.modules)\n"
        "    print(json.dumps([status, heavy]), flush=True)\n"
    )
    argvs = [[a.format(x=tmp_path) for a in argv] for argv, _ in REFUSALS]
    out = subprocess.run(
        [sys.executable, "-c", code, orjson.dumps(argvs).decode()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    results = [orjson.loads(line) for line in out.stdout.splitlines()]
    assert len(results) == len(REFUSALS), out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == len(REFUSALS) and "Traceback" not in out.stderr, out.stderr
    for (argv, message), (status, heavy), error in zip(REFUSALS, results, errors, strict=True):
        assert status == 2, (argv, status)
        assert message.format(x=tmp_path) in error, (argv, error)
        assert heavy == [], f"{argv[0]}: imported {heavy} before refusing a mistyped path"

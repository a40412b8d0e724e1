"""`--config FILE`: every command's options from a TOML, YAML or JSON file, the command line
overriding it, unknown keys refused by name, and a run repeated from its own run.json.

Real `eagle3kit` subprocesses on real files; train on a tiny random target (online, so no
extract is needed), a couple of steps on CPU.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import orjson
import prewarmed
import pytest
import typer
from fake_vllm_hidden import FakeVllmHidden
from typer.main import get_command
from typer.testing import CliRunner

from eagle3kit._command import Group, load
from eagle3kit._command_options import build, options
from eagle3kit._options import CLI_ONLY
from eagle3kit.cli import STAGES, app
from eagle3kit.train.config import TrainConfig, with_lr_for

REPO = Path(__file__).resolve().parent.parent
SCALE = REPO / "docs" / "running-at-scale.md"


def eagle3kit(*args: str, cwd: Path | None = None, **extra_env: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE3KIT_")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), **extra_env)
    return subprocess.run(
        [*prewarmed.argv(), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
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
                        "metadata": {},
                    }
                )
                + b"\n"
            )
    return path


def shards(dataset: Path) -> int:
    return len(json.loads((dataset / "manifest.json").read_bytes())["shards"])


def command_paths() -> list[tuple[str, ...]]:
    return [
        (name, *sub)
        for name, stage in STAGES.items()
        for sub in ([(s,) for s in stage.stages] if isinstance(stage, Group) else [()])
    ]


@pytest.mark.parametrize("path", command_paths(), ids=" ".join)
def test_every_command_takes_config(path):
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if "--config" in line)
    assert "FILE" in row and "TOML" in row, row


def test_toml_gives_options_and_positionals(tmp_path):
    write_jsonl(tmp_path / "in.jsonl")
    (tmp_path / "c.toml").write_text(
        'src = "in.jsonl"\ndst = "ds"\ncommit-every = 7\njson = true\n'
    )
    result = eagle3kit("convert", "--config", "c.toml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["written"] == 20  # json = true: the result on stdout
    assert shards(tmp_path / "ds") == 3  # 7 + 7 + 6: commit-every from the file


def test_yaml_with_underscores_and_a_list_for_a_comma_option(tmp_path):
    write_jsonl(tmp_path / "in.jsonl")
    assert eagle3kit("convert", "in.jsonl", "ds", cwd=tmp_path).returncode == 0
    (tmp_path / "v.yaml").write_text(
        "path: ds\nonly: [integrity, structure]\njson: true\nmax_truncation: 0.5\n"
    )
    result = eagle3kit("validate", "--config", "v.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert [c["name"] for c in json.loads(result.stdout)["checks"]] == ["integrity", "structure"]


def test_the_command_line_overrides_the_file(tmp_path):
    write_jsonl(tmp_path / "in.jsonl")
    (tmp_path / "c.toml").write_text('src = "in.jsonl"\ndst = "ds"\ncommit_every = 7\n')
    result = eagle3kit(
        "convert", "--config", "c.toml", "in.jsonl", "other", "--commit-every", "5", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert shards(tmp_path / "other") == 4 and not (tmp_path / "ds").exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            'src = "in.jsonl"\ndst = "ds"\ncomit-every = 7\n',
            "unknown key 'comit-every' (did you mean 'commit-every'?)",
        ),
        ('src = "in.jsonl"\ndst = "ds"\ncommit-every = "many"\n', "'commit-every': "),
        ('src = "in.jsonl"\ndst = "ds"\njson = "yes"\n', "'json' is a flag: true or false"),
        (
            'src = "in.jsonl"\ndst = "ds"\ncommit-every = 7\ncommit_every = 8\n',
            "'commit_every' and 'commit-every' set the same option",
        ),
        ('src = ["in.jsonl"\n', "not valid TOML"),
    ],
)
def test_a_bad_file_is_one_line_naming_it_and_writes_nothing(tmp_path, text, message):
    write_jsonl(tmp_path / "in.jsonl")
    (tmp_path / "c.toml").write_text(text)
    result = eagle3kit("convert", "--config", "c.toml", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("error: --config c.toml: ") and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "ds").exists()


def test_a_missing_file_or_an_unknown_kind_is_refused(tmp_path):
    result = eagle3kit("convert", "--config", "nope.toml", cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.startswith("error: --config nope.toml: ")
    (tmp_path / "c.ini").write_text("src = x\n")
    result = eagle3kit("convert", "--config", "c.ini", cwd=tmp_path)
    assert result.returncode == 2 and "not a .toml, .yaml, .yml or .json file" in result.stderr


def test_a_dataset_manifest_replays_its_config_and_names_what_it_cannot(tmp_path):
    write_jsonl(tmp_path / "in.jsonl")
    assert eagle3kit("convert", "in.jsonl", "ds", cwd=tmp_path).returncode == 0
    result = eagle3kit("convert", "--config", "ds/manifest.json", "in.jsonl", "again", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (
        "--config ds/manifest.json: recorded, not replayed (not options here, "
        "or the command line's alone): stage, source"
    ) in result.stderr


@pytest.mark.parametrize("suffix", [".toml", ".yaml"])
def test_a_settings_file_cannot_allow_a_models_code(tmp_path, suffix):
    # Consent to run code comes from the command line only (docs/security.md).
    write_jsonl(tmp_path / "in.jsonl")
    text = "trust-remote-code = true\n" if suffix == ".toml" else "trust-remote-code: true\n"
    (tmp_path / f"c{suffix}").write_text(text)
    result = eagle3kit("convert", "--config", f"c{suffix}", "in.jsonl", "ds", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        f"error: --config c{suffix}: 'trust-remote-code' is taken from the command line only "
        "(it lets a model's own code run): type --trust-remote-code (docs/security.md)"
    )
    assert not (tmp_path / "ds").exists()


def test_a_recorded_run_does_not_replay_its_consent(tmp_path):
    write_jsonl(tmp_path / "in.jsonl")
    record = {"config": {"src": "in.jsonl", "dst": "ds", "trust_remote_code": True}}
    (tmp_path / "run.json").write_text(json.dumps(record))
    result = eagle3kit("convert", "--config", "run.json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (
        "--config run.json: recorded, not replayed (not options here, or the command "
        "line's alone): trust_remote_code"
    ) in result.stderr


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A random tiny target and 16 short token samples."""
    from transformers import AutoTokenizer

    from eagle3kit.format import DatasetWriter, TokenSample
    from eagle3kit.tiny import make_target, make_tokenizer, stdlib_docstrings

    root = tmp_path_factory.mktemp("config")
    docs = stdlib_docstrings(20_000)
    make_tokenizer(root / "tok", vocab_size=300, corpus=docs)
    target = make_target(root / "target", root / "tok", hidden_size=32, seed=1)
    tok = AutoTokenizer.from_pretrained(str(target))
    with DatasetWriter(root / "tokens", config={"stage": "test"}) as w:
        for i, doc in enumerate(docs[:16]):
            ids = tok(doc)["input_ids"][:32]
            if len(ids) >= 12:
                w.add(TokenSample(f"s{i}", ids[:4], ids[4:]))
    return root


def test_train_repeats_a_run_from_its_own_run_json(tiny, tmp_path):
    first = eagle3kit(
        "train",
        str(tiny / "tokens"),
        str(tmp_path / "run"),
        "--online",
        "--target",
        str(tiny / "target"),
        "--layers",
        "1,2,3",
        "--max-steps",
        "2",
        "--device",
        "cpu",
        "--batch-tokens",
        "256",
        "--draft-vocab",
        "64",
        "--eval-split",
        "0",
        "--lr",
        "3e-4",
        "--schedule",
        "constant",
        "--no-fc-norm",
        "-q",
    )
    assert first.returncode == 0, first.stderr
    recorded = tmp_path / "recorded.json"
    shutil.copy(tmp_path / "run" / "run.json", recorded)
    shutil.rmtree(tmp_path / "run")
    again = eagle3kit("train", "--config", str(recorded))
    assert again.returncode == 0, again.stderr
    # How the output was opened is the command line's alone (a recorded --force is not).
    assert (
        f"--config {recorded}: recorded, not replayed (not options here, or the command "
        "line's alone): write\n"
    ) in again.stderr
    before, after = (json.loads(p.read_bytes()) for p in (recorded, tmp_path / "run/run.json"))
    assert after["settings"] == before["settings"] and after["config"] == before["config"]
    assert after["config"]["fc_norm"] is False and after["config"]["layers"] == [1, 2, 3]
    # The command line overrides the recorded run: another run directory, more steps.
    other = eagle3kit(
        "train",
        "--config",
        str(recorded),
        str(tiny / "tokens"),
        str(tmp_path / "other"),
        "--max-steps",
        "3",
        "-q",
    )
    assert other.returncode == 0, other.stderr
    changed = json.loads((tmp_path / "other/run.json").read_bytes())["config"]
    assert {k for k in changed if changed[k] != before["config"][k]} == {"out", "max_steps"}


# The Kimi-K2.5 recipe's settings file, in docs/running-at-scale.md ------------------------
def _recipe_toml() -> str:
    text = SCALE.read_text()
    found = re.findall(r"```toml\n(.*?)```", text, re.S)
    assert len(found) == 1, "one ```toml block: the recipe's train settings"
    return found[0]


def _recipe_online_train_line() -> list[str]:
    text = SCALE.read_text()
    line = next(
        ln for ln in text.splitlines() if "eagle3kit train tokens run" in ln and "--online" in ln
    )
    words = shlex.split(line)
    return words[words.index("eagle3kit") + 2 :]


def _recipe_settings_line() -> list[str]:
    """The recipe's `train --config kimi-train.toml ...` command."""
    line = next(iter(re.findall(r"`([^`]*--config kimi-train.toml[^`]*)`", SCALE.read_text())))
    words = shlex.split(line)
    return words[words.index("eagle3kit") + 1 :]


def _train_config(args: list[str]) -> TrainConfig:
    command = get_command(app).commands["train"]  # type: ignore[attr-defined]
    with command.make_context("train", args) as ctx:
        return build(TrainConfig, dict(ctx.params))


def test_the_recipes_settings_file_is_the_recipes_command_line(tmp_path, monkeypatch):
    """The documented TOML is read by the same loader and builds the same TrainConfig as the
    recipe's own train command (its model and state directories made here)."""
    (tmp_path / "kimi-train.toml").write_text(_recipe_toml())
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tokens").mkdir()
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text("{}")
    (tmp_path / "hs").mkdir()
    here = ["--target", str(tmp_path / "target"), "--hidden-states-dir", str(tmp_path / "hs")]
    typed = _recipe_settings_line()
    assert typed[:3] == ["train", "--config", "kimi-train.toml"]
    assert {"--server", "--hidden-states-dir", "--trust-remote-code"} <= set(typed)
    from_file = _train_config([*typed[1:], *here])
    from_line = _train_config([*_recipe_online_train_line(), *here])
    # --lr's default depends on the drafter's width (7,168 here, where it is the 1e-4 the
    # file writes out): the two configs are the same run once set-up has resolved it
    assert with_lr_for(from_file, 7168) == with_lr_for(from_line, 7168)
    assert from_line.lr is None and from_file.lr == 1e-4
    assert from_file.servers == ["http://127.0.0.1:8000@4"] and from_file.layers == [2, 30, 58]
    assert from_file.fsdp and from_file.online and from_file.trust_remote_code


@pytest.mark.parametrize(
    ("text", "verify"),
    [
        ("verify = false", False),
        ("no-verify = true", False),
        ("verify = true", True),
        ("", True),
    ],
)
def test_a_no_flag_by_its_field_name_or_its_own(tmp_path, monkeypatch, text, verify):
    """info's `--no-verify` fills the field `verify`: `verify = false` is the flag given."""
    from eagle3kit.info import InfoConfig

    monkeypatch.chdir(tmp_path)
    (tmp_path / "i.toml").write_text(f'path = "ds"\n{text}\n')
    command = get_command(app).commands["info"]  # type: ignore[attr-defined]
    with command.make_context("info", ["--config", "i.toml"]) as ctx:
        assert build(InfoConfig, dict(ctx.params)).verify is verify


# Options only the command line gives (docs/security.md, issue 38) ----------------------------
SECURITY = REPO / "docs" / "security.md"


def _command(path: tuple[str, ...]):
    command = get_command(app)
    for name in path:
        command = command.commands[name]  # type: ignore[attr-defined]
    return command


def marked() -> list[tuple[tuple[str, ...], str, str]]:
    """(command path, field, why) of every option marked cli_only, every command."""
    found = []
    for path in command_paths():
        stage = STAGES[path[0]]
        stage = stage.stages[path[1]] if isinstance(stage, Group) else stage
        found += [
            (path, o.field.name, o.cli.cli_only)
            for o in options(load(stage.config))
            if o.cli.cli_only
        ]
    return found


def spellings(command, field: str) -> list[str]:
    """Every key the loader takes for the option filling `field`."""
    param = next(p for p in command.params if p.name == field)
    names = {field, field.replace("_", "-")}
    names |= {
        f[2:] for f in [*param.opts, *getattr(param, "secondary_opts", ())] if f.startswith("--")
    }
    return sorted(names)


def test_the_marks_cover_what_the_issue_names():
    """The options issue 38 found replayed are among the marked, on every command with them."""
    fields = {(p[0], f) for p, f, _ in marked()}
    assert {
        ("train", "servers"),
        ("train", "hidden_states_dir"),
        ("train", "report_to"),
        ("train", "api_key"),
        ("convert", "overwrite"),
        ("export", "overwrite"),
        ("export", "overwrite_dir"),
        ("gen", "resume"),
        ("gen", "force"),
        ("extract", "server"),
        ("quickstart", "overwrite"),
    } <= fields


@pytest.mark.parametrize(
    ("path", "field", "why"), marked(), ids=lambda v: " ".join(v) if isinstance(v, tuple) else v
)
def test_every_command_line_only_option_is_refused_from_a_file(tmp_path, capsys, path, field, why):
    """Under every spelling, in each format and nested in a table: one line naming the key
    and the flag, before anything else is read; a recorded run drops it with a note."""
    from eagle3kit._settings_file import file_defaults, setting_keys

    command = _command(path)
    command.params  # noqa: B018 - made from the config on first use
    param = next(p for p in command.params if p.name == field)
    flag = next(f for f in param.opts if f.startswith("--"))
    value = ["x"] if param.multiple or param.nargs == -1 else True if param.is_flag else "x"
    for n, key in enumerate(spellings(command, field)):
        cases = [
            (f"c{n}.toml", f"{key} = {json.dumps(value)}\n", key),
            (f"c{n}.yaml", f"{key}: {json.dumps(value)}\n", key),
            (f"c{n}.json", json.dumps({key: value}), key),
            (f"n{n}.toml", f"[write]\n{key} = {json.dumps(value)}\n", f"write.{key}"),
        ]
        for name, text, shown in cases:
            (tmp_path / name).write_text(text)
            with pytest.raises(typer.Exit) as exited:
                command.make_context(path[-1], ["--config", str(tmp_path / name)])
            assert exited.value.exit_code == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1, err
            assert (
                f"--config {tmp_path / name}: '{shown}' is taken from the command line "
                f"only ({CLI_ONLY[why]}): type {flag}" in err
            ), err
        # A recorded run (run.json's or manifest.json's `config`): dropped, named in the note.
        keys = setting_keys(command.params, command.option_list)
        defaults, skipped = file_defaults(None, {key: value}, True, Path("run.json"), keys)
        assert defaults == {} and skipped == [key]


def test_the_security_table_lists_the_marked_options():
    """docs/security.md's table of options only the command line gives is the marks."""
    text = SECURITY.read_text()
    start = text.index("### Settings files (`--config`)")
    rows = re.findall(r"^\| `(--[a-z-]+)` \| ([a-z, ]+) \|", text[start:], re.M)
    documented = {flag: set(commands.split(", ")) for flag, commands in rows}
    expected: dict[str, set[str]] = {}
    for path, field, _ in marked():
        param = next(p for p in _command(path).params if p.name == field)
        flag = next(f for f in param.opts if f.startswith("--"))
        expected.setdefault(flag, set()).add(" ".join(path))
    assert documented == expected


def test_a_settings_toml_cannot_overwrite(tmp_path):
    """Issue 38: a settings TOML with `overwrite = true` replaced a dataset."""
    write_jsonl(tmp_path / "in.jsonl", 40)
    assert eagle3kit("convert", "in.jsonl", "mine", cwd=tmp_path).returncode == 0
    write_jsonl(tmp_path / "new.jsonl", 3)
    (tmp_path / "s.toml").write_text('src = "new.jsonl"\ndst = "mine"\noverwrite = true\n')
    result = eagle3kit("convert", "--config", "s.toml", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == (
        "error: --config s.toml: 'overwrite' is taken from the command line only (it gives "
        "leave to delete or replace what is there): type --overwrite (docs/security.md)\n"
    )
    assert _samples(tmp_path / "mine") == 40


def _samples(dataset: Path) -> int:
    return sum(s["samples"] for s in json.loads((dataset / "manifest.json").read_bytes())["shards"])


def test_a_replayed_manifest_does_not_overwrite_a_dataset(tmp_path):
    """Issue 38: `convert --config THEIRS/manifest.json new.jsonl MINE` with "overwrite": true
    in the manifest's config wiped MINE (40 samples to 3)."""
    write_jsonl(tmp_path / "in.jsonl", 40)
    assert eagle3kit("convert", "in.jsonl", "mine", cwd=tmp_path).returncode == 0
    write_jsonl(tmp_path / "new.jsonl", 3)
    assert eagle3kit("convert", "new.jsonl", "theirs", cwd=tmp_path).returncode == 0
    manifest = json.loads((tmp_path / "theirs/manifest.json").read_bytes())
    manifest["config"].update(overwrite=True, force=True)
    (tmp_path / "theirs/manifest.json").write_text(json.dumps(manifest))
    result = eagle3kit(
        "convert", "--config", "theirs/manifest.json", "new.jsonl", "mine", cwd=tmp_path
    )
    assert "recorded, not replayed" in result.stderr and "overwrite, force" in result.stderr
    assert _samples(tmp_path / "mine") == 40, result.stderr  # s0..s2 are already there


@pytest.fixture(scope="module")
def trained(tiny, tmp_path_factory):
    """A two-step run on the tiny target."""
    run = tmp_path_factory.mktemp("trained") / "run"
    result = eagle3kit(
        "train",
        str(tiny / "tokens"),
        str(run),
        "--online",
        "--target",
        str(tiny / "target"),
        "--layers",
        "1,2,3",
        "--max-steps",
        "2",
        "--device",
        "cpu",
        "--batch-tokens",
        "256",
        "--draft-vocab",
        "64",
        "--eval-split",
        "0",
        "-q",
    )
    assert result.returncode == 0, result.stderr
    return run


def test_a_replayed_record_does_not_empty_a_folder_through_export(trained, tmp_path):
    """Issue 38: `export --config recorded.json` with `out` and `overwrite-dir` set deleted a
    folder that was no export."""
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("mine")
    record = {
        "config": {
            "run": str(trained),
            "out": str(precious),
            "overwrite-dir": str(precious),
            "overwrite": True,
        }
    }
    (tmp_path / "recorded.json").write_text(json.dumps(record))
    result = eagle3kit("export", "--config", str(tmp_path / "recorded.json"))
    assert "not replayed" in result.stderr and "overwrite-dir, overwrite" in result.stderr
    assert result.returncode == 2, result.stderr  # OUT holds something that is no export
    assert (precious / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in precious.iterdir()) == ["notes.txt"]


def test_a_replayed_run_json_sends_nothing_to_its_servers(tiny, tmp_path):
    """Issue 38: `train DS RUN2 --config THEIRS/run.json` took `servers`, `hidden_states_dir`
    and `report_to` from the file: the user's EAGLE3KIT_API_KEY went as bearer to the file's
    server, which named a model shard in the file's folder that was then read and deleted,
    and a tracker was turned on. Now the run trains from the target in-process (the typed
    options only), the server hears nothing and the folder is untouched."""
    storage = tmp_path / "their-storage"
    served = FakeVllmHidden(tiny / "target", storage, layer_ids=[1, 2, 3]).start()
    try:
        shard = storage / "model-00001-of-00064.safetensors"
        shard.write_bytes(b"the user's model weights")
        served.names = lambda _path: str(shard)
        record = {
            "config": {
                "data": [{"path": str(tiny / "tokens"), "weight": 1.0}],
                "out": str(tmp_path / "their-run"),
                "target": str(tiny / "target"),
                "online": True,
                "layers": [1, 2, 3],
                "servers": [f"{served.url}@2"],
                "hidden_states_dir": str(storage),
                "report_to": "tensorboard",
                "max_steps": 1,
                "device": "cpu",
                "batch_tokens": 256,
                "draft_vocab": 64,
                "eval_split": 0,
                "trust_remote_code": True,
            }
        }
        (tmp_path / "run.json").write_text(json.dumps(record))
        result = eagle3kit(
            "train",
            "--config",
            str(tmp_path / "run.json"),
            str(tiny / "tokens"),
            str(tmp_path / "run2"),
            "--no-progress",
            EAGLE3KIT_API_KEY="the-users-secret",
        )
    finally:
        served.stop()
    assert result.returncode == 0, result.stderr
    assert (
        "recorded, not replayed (not options here, or the command line's alone): "
        "servers, hidden_states_dir, report_to, trust_remote_code"
    ) in result.stderr
    assert served.seen == []
    assert shard.read_bytes() == b"the user's model weights"
    assert not (tmp_path / "run2" / "tensorboard").exists()
    recorded = json.loads((tmp_path / "run2" / "run.json").read_bytes())["config"]
    assert recorded["servers"] == [] and recorded["hidden_states_dir"] is None
    assert recorded["report_to"] == "none"

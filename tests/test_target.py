"""The target's one owner (eagle3kit/target/): one identity record with one comparison that
still reads the records older releases wrote, layer ids parsed and checked by one rule and
converted between conventions in one place, one device rule, one dtype vocabulary, and one
hooked forward that extract and online training both take their states from."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import prewarmed
import pytest

from eagle3kit.errors import UserError
from eagle3kit.target import (
    TargetInfo,
    check_layer_ids,
    config_dict,
    from_layer_output,
    identity_mismatch,
    parse_dtype,
    parse_layer_ids,
    resolve_device,
    resolve_layer_ids,
    to_layer_output,
)
from eagle3kit.tiny import make_target, make_tokenizer, stdlib_docstrings

OLD_EXTRACT_KEYS = (
    "model_type",
    "num_layers",
    "hidden_size",
    "vocab_size",
    "config_xxh3",
    "weights_xxh3",
)
"""What extract recorded of its target before the one identity record."""
OLD_TRAIN_KEYS = (
    "path",
    "name_or_path",
    "architectures",
    "model_type",
    "num_layers",
    "hidden_size",
    "vocab_size",
    "fingerprint",
)
"""What train recorded in run.json before the one identity record."""


@pytest.fixture(scope="module")
def targets(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny target, and a copy of it with another depth."""
    root = tmp_path_factory.mktemp("target")
    make_tokenizer(root / "tok", vocab_size=300, corpus=stdlib_docstrings(20_000))
    target = make_target(root / "target", root / "tok", hidden_size=32, seed=1)
    deeper = make_target(root / "deeper", root / "tok", hidden_size=32, seed=1, num_layers=9)
    return target, deeper


def test_one_record_names_the_target(targets):
    target, deeper = targets
    record = TargetInfo.load(target).identity
    assert {*OLD_EXTRACT_KEYS, *OLD_TRAIN_KEYS} - {"path", "name_or_path"} <= set(record)
    assert "path" not in record  # where it was is not which it is
    assert identity_mismatch(record, TargetInfo.load(target).identity) is None
    key, recorded, actual = identity_mismatch(record, TargetInfo.load(deeper).identity)
    assert (key, actual) == ("num_layers", 9) and recorded != 9


@pytest.mark.parametrize(
    "old_keys", [OLD_EXTRACT_KEYS, OLD_TRAIN_KEYS], ids=["extract-record", "train-record"]
)
def test_older_records_are_compared_on_the_keys_they_carry(targets, old_keys):
    target, deeper = targets
    new = TargetInfo.load(target).identity
    old = {k: new.get(k) for k in old_keys}
    assert identity_mismatch(old, new) is None and identity_mismatch(new, old) is None
    assert identity_mismatch(old, TargetInfo.load(deeper).identity)[0] == "num_layers"
    tampered = {**old, "hidden_size": 48}
    assert identity_mismatch(tampered, new) == ("hidden_size", 48, 32)


def test_layer_ids_have_one_rule_and_one_message_per_problem():
    assert parse_layer_ids("2, 18,33") == [2, 18, 33]
    assert parse_layer_ids([2, 4]) == [2, 4] and parse_layer_ids(None) is None
    with pytest.raises(UserError, match=r"^--layers 2,x: expected comma-separated integers"):
        parse_layer_ids("2,x")
    for bad in ([4, 2, 5], [2, 2, 5], [-1, 2, 5]):
        with pytest.raises(UserError, match="ids must be distinct and increasing"):
            check_layer_ids(bad)
    with pytest.raises(UserError, match="give at least one layer id"):
        check_layer_ids([])
    with pytest.raises(UserError, match=r"--layers 2,4: give 3 ids"):
        check_layer_ids([2, 4], count=3)  # train's drafter reads exactly three
    assert check_layer_ids([2, 4, 8], num_layers=8) == [2, 4, 8]  # id N: the last state
    with pytest.raises(UserError, match=r"must lie in 0\.\.8 for this 8-layer target"):
        check_layer_ids([2, 4, 9], num_layers=8)
    assert resolve_layer_ids(None, 36) == [2, 18, 33]
    with pytest.raises(UserError, match="too few for distinct default layer ids"):
        resolve_layer_ids(None, 6)


def test_a_config_is_read_with_one_message_when_it_is_not_there(tmp_path):
    with pytest.raises(UserError, match=f"^{tmp_path}: no config.json there"):
        config_dict(tmp_path)
    (tmp_path / "config.json").write_text("[1]")
    with pytest.raises(UserError, match="expected a JSON object"):
        config_dict(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert config_dict(tmp_path) == {"model_type": "llama"}


# Layer ids: one conversion between the conventions ---------------------------------------------
def test_the_one_conversion_between_conventions_round_trips():
    assert to_layer_output([2, 18, 33]) == [1, 17, 32]  # SGLang's eagle_config ids
    assert from_layer_output([1, 17, 32]) == [2, 18, 33]
    for ids in ([2, 18, 33], [1, 4, 8], [0]):
        assert from_layer_output(to_layer_output(ids)) == ids
        assert to_layer_output(from_layer_output(ids)) == ids


def test_no_stage_shifts_layer_ids_by_hand():
    # export, the checkpoint layouts and bench's diagnosis convert through target/layers.py only.
    package = Path(__file__).resolve().parent.parent / "eagle3kit"
    files = [
        *(package / "export").glob("*.py"),
        package / "bench" / "diagnose.py",
        *(package / "checkpoints").glob("*.py"),
    ]
    for path in files:
        text, name = path.read_text(), path.name
        assert "for i in ids]" not in text and "i - 1 for i in" not in text, name
        assert "i + 1 for i in" not in text and "int(i) + 1 for" not in text, name


# The dtype vocabulary ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("given", "name"), [("bf16", "bfloat16"), ("fp16", "float16"), ("fp32", "float32")]
)
def test_old_dtype_spellings_are_accepted_with_a_note(given, name):
    assert parse_dtype(given) == (
        name,
        f"--dtype {given}: write --dtype {name} (the old spelling still works)",
    )
    assert parse_dtype(name) == (name, None)
    assert parse_dtype("auto") == ("auto", None)


def test_precision_is_dtypes_old_name():
    name, note = parse_dtype(
        "bf16", allowed=("auto", "bfloat16", "float32"), given_as="--precision"
    )
    assert name == "bfloat16" and note.startswith("--precision bf16: write --dtype bfloat16")
    assert parse_dtype("auto", given_as="--precision")[1].startswith(
        "--precision auto: write --dtype auto"
    )


def test_a_dtype_outside_an_options_vocabulary_is_refused_by_name():
    with pytest.raises(
        UserError,
        match=r"^--dtype int8: expected one of auto, bfloat16, "
        r"float16, float32$",
    ):
        parse_dtype("int8")
    with pytest.raises(UserError, match=r"^--dtype fp16: expected one of bfloat16, float32$"):
        parse_dtype("fp16", allowed=("bfloat16", "float32"))


def _eagle3kit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*prewarmed.argv(), *args], capture_output=True, text=True, timeout=120)


def test_the_command_line_notes_an_old_spelling_once_on_stderr(tmp_path):
    old = _eagle3kit("export", str(tmp_path / "no-run"), str(tmp_path / "out"), "--dtype", "fp32")
    new = _eagle3kit(
        "export", str(tmp_path / "no-run"), str(tmp_path / "out"), "--dtype", "float32"
    )
    for done in (old, new):  # the run is missing: the note comes before that one error
        assert done.returncode == 2 and f"{tmp_path / 'no-run'}: no such run directory" in (
            done.stderr
        )
        assert "Traceback" not in done.stderr and done.stdout == ""
    assert old.stderr.count("--dtype fp32: write --dtype float32") == 1
    assert "write --dtype" not in new.stderr
    train = _eagle3kit(
        "train", str(tmp_path / "no-data"), str(tmp_path / "run"), "--precision", "bf16"
    )
    assert train.returncode == 2
    assert "--precision bf16: write --dtype bfloat16 (the old spelling still works)" in (
        train.stderr
    )


# Devices ----------------------------------------------------------------------------------------
def test_a_device_torch_does_not_know_is_refused_by_name():
    with pytest.raises(UserError, match=r"^--device tpu9: not a device \(cpu, cuda, cuda:1"):
        resolve_device("tpu9")
    with pytest.raises(UserError, match=r"^--device tpu9: not a device"):
        resolve_device("tpu9", local_rank=1)  # torchrun's path checks it too


def test_auto_and_cuda_follow_the_rank():
    import torch

    assert str(resolve_device("cpu", local_rank=3)) == "cpu"
    if torch.cuda.is_available():
        assert str(resolve_device("auto")) == "cuda"
        assert str(resolve_device("auto", local_rank=0)) == "cuda:0"
        return
    assert str(resolve_device("auto")) == str(resolve_device("auto", local_rank=2)) == "cpu"
    for name in ("cuda", "cuda:1"):
        with pytest.raises(UserError, match=f"^--device {name}: no CUDA device here$"):
            resolve_device(name, local_rank=0)
        with pytest.raises(UserError, match=f"^--device {name}: no CUDA device here$"):
            resolve_device(name)


# Capture: one hooked forward ------------------------------------------------------------------
def test_extract_and_online_training_take_states_from_one_capture(targets):
    import torch

    from eagle3kit import _hf
    from eagle3kit.extract.hf import HfEngine
    from eagle3kit.target.capture import Capture
    from eagle3kit.train.target import OnlineTarget

    target, _ = targets
    layers = [0, 2, 5]
    model = _hf.load_causal_lm(target, False, dtype=torch.float32).eval()
    engine = HfEngine(model, layers)
    online = OnlineTarget(
        _hf.load_causal_lm(target, False, dtype=torch.float32).eval(), layers, torch.device("cpu")
    )
    assert type(engine.capture) is Capture and type(online.capture) is Capture

    ids = torch.tensor([[5, 17, 42, 7, 99, 3]])
    with torch.no_grad():
        aux, last = engine.capture(ids)
        reference = model(input_ids=ids, output_hidden_states=True, use_cache=False)
    states = reference.hidden_states  # [k]: the input of layer k; [N]: after the final norm
    n = model.config.num_hidden_layers
    torch.testing.assert_close(aux, torch.cat([states[k] for k in layers], dim=-1))
    torch.testing.assert_close(model.model.norm(last), states[n])
    assert not torch.equal(last, states[n])  # the last state is taken before the norm
    online_aux, online_last = online.capture(ids)
    torch.testing.assert_close(online_aux, aux)
    torch.testing.assert_close(online_last, last)
    rows = list(engine.states([ids[0].numpy()]))
    torch.testing.assert_close(torch.from_numpy(rows[0][0]), aux[0])


def test_a_model_without_a_decoder_layer_list_is_named():
    import torch

    from eagle3kit.target.capture import Capture

    with pytest.raises(
        UserError,
        match=r"^--target: Linear has no `layers` list of decoder "
        r"layers; extract knows Llama-",
    ):
        Capture(torch.nn.Linear(2, 2), [1], who="extract")

"""The target's one owner (eagle3kit/target.py): one identity record with one comparison that
still reads the records older releases wrote, and layer ids parsed and checked by one rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3kit.errors import UserError
from eagle3kit.target import (
    TargetInfo,
    check_layer_ids,
    config_dict,
    identity_mismatch,
    parse_layer_ids,
    resolve_layer_ids,
)
from eagle3kit.tiny import make_target, make_tokenizer, stdlib_docstrings

OLD_EXTRACT_KEYS = ("model_type", "num_layers", "hidden_size", "vocab_size", "config_xxh3",
                    "weights_xxh3")
"""What extract recorded of its target before the one identity record."""
OLD_TRAIN_KEYS = ("path", "name_or_path", "architectures", "model_type", "num_layers",
                  "hidden_size", "vocab_size", "fingerprint")
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


@pytest.mark.parametrize("old_keys", [OLD_EXTRACT_KEYS, OLD_TRAIN_KEYS],
                         ids=["extract-record", "train-record"])
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

"""The target's config and identity: which model a dataset, run or export was made with.

- `read_config` loads a model directory's config (transformers, the text config of a
  multimodal one); `config_dict` reads any model or checkpoint directory's config.json as a
  dict, with one readable message when it is missing or damaged.
- `identity` is the one record of which target a dataset, run or export was made with:
  extract writes it into a hidden-state dataset, train into run.json and the drafter's
  config, and train, export and convert compare a record against a target with
  `identity_mismatch`. Records written before there was one (extract's config/weights hashes,
  train's fingerprint) are still compared on the keys they carry.
- `tokenizer_identity` is a tokenizer's size and vocabulary hash, what extract records and
  compares (`tokenizer_mismatch`) so a token dataset is never run through another model.

No torch here, and transformers only inside `read_config`: configs import this module.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import xxhash

from eagle3kit._json import json_object
from eagle3kit.errors import UserError

COMPARED = ("model_type", "num_layers", "hidden_size", "vocab_size", "fingerprint", "config_xxh3")
"""The identity keys that must agree for two records to name the same target. The weights'
file names and sizes (`weights_xxh3`) are recorded, not compared: a bf16 copy of the same
model has other sizes and the same states."""


# The config -----------------------------------------------------------------------------------
def config_dict(directory: Path, missing: str | None = None) -> dict:
    """`directory`/config.json as a dict; `missing` is the message when there is none."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise UserError(missing or f"{directory}: no config.json there (a model directory?)")
    return json_object(path.read_text(), str(path))


def text_config(config: Any) -> Any:
    """The language model's part of a transformers config (a multimodal one holds it)."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def read_config(path: Path, trust_remote_code: bool = False, flag: str = "--target") -> Any:
    """The target's transformers config (its text config)."""
    from eagle3kit import _hf

    if not (Path(path) / "config.json").is_file():
        raise UserError(f"{flag} {path}: no config.json there (an HF model directory?)")
    return text_config(_hf.load_config(Path(path), trust_remote_code, flag))


# Identity -------------------------------------------------------------------------------------
def config_fingerprint(config: Any) -> str:
    """A short hash of the target config fields that decide what its hidden states mean."""
    fields = (
        "model_type",
        "hidden_size",
        "num_hidden_layers",
        "vocab_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
    )
    data = {k: getattr(config, k, None) for k in fields}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def config_hash(path: Path) -> str | None:
    """The config.json's content, keys sorted, so a reformatted copy hashes the same."""
    try:
        return xxhash.xxh3_128_hexdigest(
            orjson.dumps(orjson.loads(path.read_bytes()), option=orjson.OPT_SORT_KEYS)
        )
    except (OSError, orjson.JSONDecodeError):
        return None


def weights_fingerprint(path: Path) -> str | None:
    """Weight file names and sizes: cheap for a 1T model; None where the directory holds no
    weights (a config-only copy for extract --engine vllm)."""
    files = sorted(p for p in path.glob("*.safetensors") if p.is_file())
    files = files or sorted(p for p in path.glob("*.bin") if p.is_file())
    if not files:
        return None
    return xxhash.xxh3_128_hexdigest(orjson.dumps([[p.name, p.stat().st_size] for p in files]))


def identity(path: Path, config: Any) -> dict:
    """Which target this is: what a dataset, run or drafter records and is checked against.
    Where it was is not part of it (`location`)."""
    path = Path(path)
    try:
        architectures = list(config_dict(path).get("architectures") or [])
    except UserError:
        architectures = list(getattr(config, "architectures", None) or [])
    return {
        "model_type": config.model_type,
        "architectures": architectures,
        "num_layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "vocab_size": config.vocab_size,
        "fingerprint": config_fingerprint(config),
        "config_xxh3": config_hash(path / "config.json"),
        "weights_xxh3": weights_fingerprint(path),
    }


def location(path: Path) -> dict:
    """Where the target was: what export names as the verifier and looks for again."""
    where = str(Path(path).resolve())
    return {"path": where, "name_or_path": where}


def identity_mismatch(recorded: dict, actual: dict) -> tuple[str, Any, Any] | None:
    """(key, recorded value, actual value) of the first compared key two identity records
    both carry and disagree on; None when they name the same target."""
    for key in COMPARED:
        theirs, ours = recorded.get(key), actual.get(key)
        if theirs is not None and ours is not None and theirs != ours:
            return key, theirs, ours
    return None


@dataclass(frozen=True)
class TargetInfo:
    """A target directory's config and identity, read once."""

    path: Path
    config: Any
    """The transformers (text) config."""
    identity: dict

    @classmethod
    def load(
        cls, path: Path, trust_remote_code: bool = False, flag: str = "--target"
    ) -> TargetInfo:
        config = read_config(path, trust_remote_code, flag)
        try:
            record = identity(path, config)
        except AttributeError as exc:
            raise UserError(f"{flag} {path}: config lacks {exc.name}") from None
        return cls(Path(path), config, record)

    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)

    @property
    def max_positions(self) -> int | None:
        return getattr(self.config, "max_position_embeddings", None)


# The tokenizer ----------------------------------------------------------------------------------
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def has_tokenizer(path: Path) -> bool:
    """Whether `path` holds a tokenizer (a target directory may hold only weights)."""
    return any((Path(path) / n).is_file() for n in TOKENIZER_FILES)


def tokenizer_identity(path: Path, trust_remote_code: bool = False) -> dict:
    """Size and a hash of the vocabulary: two tokenizers with equal ones give equal ids."""
    from eagle3kit import _hf

    tok = _hf.load_tokenizer(path, trust_remote_code, flag="")
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    return {"size": len(tok), "vocab_xxh3": xxhash.xxh3_128_hexdigest(orjson.dumps(vocab))}


def tokenizer_mismatch(ours: dict, theirs: dict) -> bool:
    """Whether two tokenizer identities give the same ids other text."""
    return ours.get("vocab_xxh3") != theirs.get("vocab_xxh3")

"""A target's tokenizer as every stage loads it: the files that make it up (kept with a
dataset, so later stages and other machines load the very same one), the fast path for the
classes that add nothing to their tokenizer.json, and its end-of-sequence and special ids.

transformers is imported inside the functions that need it, so importing this module is free.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from eagle3kit.errors import UserError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


# The files that make up a tokenizer (any family), copied into the dataset so later stages
# and other machines load the very same one. config.json is included because AutoTokenizer
# falls back on it to pick the tokenizer class; tokenization_*.py for trust_remote_code ones.
TOKENIZER_FILE_NAMES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
    "tiktoken.model",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
    "config.json",
)
TOKENIZER_FILE_GLOBS = ("*.tiktoken", "tokenization_*.py", "additional_chat_templates/*.jinja")

# Tokenizer classes that add nothing to their tokenizer.json for what gen does (encode
# without special tokens, decode, apply the chat template); tests/test_gen_render.py checks
# each against AutoTokenizer.
PLAIN_FAST_CLASSES = {
    "PreTrainedTokenizerFast",
    "TokenizersBackend",
    "Qwen2Tokenizer",
    "Qwen2TokenizerFast",
    "GPT2Tokenizer",
    "GPT2TokenizerFast",
}


def _plain_fast_tokenizer(path: Path) -> bool:
    """Whether `path` can load as a bare PreTrainedTokenizerFast.

    AutoTokenizer imports torch, seconds at every start of gen and validate; the bare class
    does not.
    """
    config_file = path / "tokenizer_config.json"
    if not (path / "tokenizer.json").is_file() or not config_file.is_file():
        return False
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        isinstance(config, dict)
        and "auto_map" not in config
        and config.get("tokenizer_class") in PLAIN_FAST_CLASSES
    )


def load_tokenizer(
    path: Path, trust_remote_code: bool, flag: str = "--tokenizer"
) -> PreTrainedTokenizerBase:
    if not path.exists():
        raise UserError(f"--tokenizer {path}: no such directory")
    if not path.is_dir():
        raise UserError(
            f"--tokenizer {path}: not a directory (give the model or tokenizer directory)"
        )
    if not _plain_fast_tokenizer(path):
        from eagle3kit import _hf

        return _hf.load_tokenizer(path, trust_remote_code, flag)
    try:
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # transformers raises many kinds; all mean "not loadable"
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"--tokenizer {path}: cannot load a tokenizer: {reason}") from None


def eos_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The tokenizer's EOS, and generation_config.json's eos_token_id (int or list)."""
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    config = Path(tokenizer.name_or_path) / "generation_config.json"
    if config.is_file():
        try:
            eos = json.loads(config.read_text()).get("eos_token_id")
        except (ValueError, AttributeError):
            raise UserError(f"{config}: not a JSON object") from None
        ids += eos if isinstance(eos, list) else [eos] if isinstance(eos, int) else []
    return [int(i) for i in ids]


def special_ids(tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """Special tokens: the named ones and every added token marked special (<think> in
    Qwen3 is added but not special, so reasoning markers are never taken for turn ends)."""
    special = set(tokenizer.all_special_ids)
    special |= {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    return special

"""Real tokenizers for tests, rebuilt offline from tests/data/tokenizers/ (origins in SOURCES.md).

The HF tokenizer.json of Qwen3 and its relatives is over 4 MiB and not in the test data, but
their byte-level BPE ranks are (`qwen.tiktoken`). transformers' TikTokenConverter turns those
into a `tokenizers` BPE once per test session (a few seconds); each family then only appends
its own added tokens, in id order, to that base. Kimi-K2 and gpt-oss have no public tokenizer
file here at all: their stand-ins are the Qwen ranks plus their real special tokens, so chat
templates and stop tokens behave as with the real ones while ordinary text gets Qwen ids.

Every builder takes a session temp root, builds into `<root>/<name>/` at most once, and
returns that directory: call it from a session-scoped fixture, e.g.
`qwen3_tokenizer_dir(tmp_path_factory.getbasetemp())`.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
TOKENIZERS = DATA / "tokenizers"
TEMPLATES = DATA / "chat_templates"

# Qwen2's pre-tokenizer split (single digits, unlike tiktoken's cl100k \p{N}{1,3}).
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN_REGULAR_TOKENS = 151643
BYTE_LEVEL_POST_PROCESSOR = (
    '"post_processor":{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":false,'
    '"use_regex":true}'
)

# DeepSeek-R1-Distill-Qwen's added tokens, ids 151643.. in order: its tokenizer_config.json in
# the test data lost them (they live only in the missing tokenizer.json). (content, special)
R1_ADDED = [
    ("<｜end▁of▁sentence｜>", True),
    ("<｜User｜>", False),
    ("<｜Assistant｜>", False),
    ("<｜begin▁of▁sentence｜>", True),
    ("<|EOT|>", False),
    ("<think>", False),
    ("</think>", False),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
]

# Kimi-K2's special tokens at their real ids (163584 = [BOS] ...); the stand-in keeps their
# order and gaps, so stand-in id + KIMI_ID_OFFSET is the real Kimi id.
KIMI_SPECIAL = {
    163584: "[BOS]",
    163585: "[EOS]",
    163586: "<|im_end|>",
    163587: "<|im_user|>",
    163588: "<|im_assistant|>",
    163590: "<|start_header_id|>",
    163591: "<|end_header_id|>",
    163593: "[EOT]",
    163594: "<|im_system|>",
    163595: "<|tool_calls_section_begin|>",
    163596: "<|tool_calls_section_end|>",
    163597: "<|tool_call_begin|>",
    163598: "<|tool_call_argument_begin|>",
    163599: "<|tool_call_end|>",
    163601: "<|im_middle|>",
    163602: "<|media_begin|>",
    163603: "<|media_content|>",
    163604: "<|media_end|>",
    163605: "<|media_pad|>",
    163606: "<think>",
    163607: "</think>",
}
KIMI_ID_OFFSET = 163584 - QWEN_REGULAR_TOKENS


def qwen3_tokenizer_dir(tmp_root: Path) -> Path:
    """Qwen3 (Qwen/Qwen3-0.6B's tokenizer_config.json, with its 2025-07 chat template)."""
    config = _read_config("qwen3")
    added = [(v["content"], v["special"]) for _, v in _by_id(config["added_tokens_decoder"])]
    return _build(tmp_root, "qwen3", added, config)


def deepseek_r1_tokenizer_dir(tmp_root: Path) -> Path:
    """DeepSeek-R1-Distill-Qwen: the Qwen ranks, R1's added tokens, R1's real config, and (as
    in R1's tokenizer.json) a post-processor that prepends BOS unless add_special_tokens=False."""
    return _build(
        tmp_root,
        "deepseek-r1-distill-qwen",
        R1_ADDED,
        _read_config("deepseek-r1-distill-qwen"),
        bos_prefix="<｜begin▁of▁sentence｜>",
    )


def kimi_tokenizer_dir(tmp_root: Path) -> Path:
    """Stand-in for Kimi-K2-Thinking: Qwen ranks + Kimi's special tokens + its chat template."""
    added = [
        (KIMI_SPECIAL.get(i, f"<|reserved_token_{i}|>"), True)
        for i in range(163584, max(KIMI_SPECIAL) + 1)
    ]
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "pad_token": "[EOS]",
        "model_max_length": 262144,
        "chat_template": (TEMPLATES / "moonshotai-Kimi-K2-Thinking.jinja").read_text(),
    }
    return _build(tmp_root, "kimi-k2-thinking", added, config)


def gpt_oss_tokenizer_dir(tmp_root: Path) -> Path:
    """Stand-in for gpt-oss: Qwen ranks + o200k_harmony's 21 added tokens; the chat template
    sits in its own chat_template.jinja, as recent HF repos ship it."""
    config = _read_config("gpt-oss")
    added = [(v["content"], v["special"]) for _, v in _by_id(config.pop("added_tokens_decoder"))]
    template = (TEMPLATES / "openai-gpt-oss-120b.jinja").read_text()
    return _build(tmp_root, "gpt-oss", added, config, {"chat_template.jinja": template})


def phi3_tokenizer_dir() -> Path:
    """Phi-3-mini: a complete tokenizer.json (Llama-2 SentencePiece BPE) that loads as is."""
    return TOKENIZERS / "phi-3-mini"


def _read_config(name: str) -> dict[str, Any]:
    return json.loads((TOKENIZERS / name / "tokenizer_config.json").read_text())


def _by_id(decoder: dict[str, dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    return sorted(((int(k), v) for k, v in decoder.items()), key=lambda kv: kv[0])


def _build(
    tmp_root: Path,
    name: str,
    added: list[tuple[str, bool]],
    config: dict[str, Any],
    extra_files: dict[str, str] | None = None,
    bos_prefix: str | None = None,
) -> Path:
    out = tmp_root / "tokenizers" / name
    if (out / "tokenizer.json").exists():
        return out
    tokens = [
        _added_token(QWEN_REGULAR_TOKENS + i, content, special)
        for i, (content, special) in enumerate(added)
    ]
    # Splice into the base's text rather than parse and re-dump 18 MB of JSON.
    text = _splice(
        _qwen_bpe_json(tmp_root),
        '"added_tokens":[]',
        '"added_tokens":' + json.dumps(tokens, ensure_ascii=False),
    )
    if bos_prefix is not None:
        text = _splice(
            text,
            BYTE_LEVEL_POST_PROCESSOR,
            '"post_processor":' + json.dumps(_bos_processor(bos_prefix, tokens)),
        )
    files = {
        "tokenizer.json": text,
        "tokenizer_config.json": json.dumps(config, ensure_ascii=False, indent=2),
        **(extra_files or {}),
    }
    _write_dir(out, files)
    return out


def _splice(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"{old!r} not found once in the base tokenizer.json"
    return text.replace(old, new)


def _bos_processor(bos: str, tokens: list[dict[str, Any]]) -> dict[str, Any]:
    """What a tokenizer with add_bos_token writes: BOS before every encoded text."""
    bos_id = next(t["id"] for t in tokens if t["content"] == bos)
    return {
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": bos, "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
        ],
        "pair": [
            {"SpecialToken": {"id": bos, "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
            {"SpecialToken": {"id": bos, "type_id": 1}},
            {"Sequence": {"id": "B", "type_id": 1}},
        ],
        "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
    }


def _added_token(token_id: int, content: str, special: bool) -> dict[str, Any]:
    return {
        "id": token_id,
        "content": content,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": special,
    }


def _qwen_bpe_json(tmp_root: Path) -> str:
    """The Qwen byte-level BPE with no added tokens, as tokenizer.json text (built once)."""
    cached = tmp_root / "tokenizers" / "qwen-bpe"
    if not cached.exists():
        from tokenizers import normalizers
        from transformers.convert_slow_tokenizer import TikTokenConverter

        converter = TikTokenConverter(
            vocab_file=str(TOKENIZERS / "qwen3" / "qwen.tiktoken"), pattern=QWEN2_PATTERN
        )
        bpe = converter.converted()
        bpe.normalizer = normalizers.NFC()  # as in Qwen2's own tokenizer.json
        _write_dir(cached, {"tokenizer.json": bpe.to_str()})
    return (cached / "tokenizer.json").read_text()


def _write_dir(out: Path, files: dict[str, str]) -> None:
    """Write files into a temp directory and rename it, so a half-built tokenizer is never seen."""
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    for file_name, text in files.items():
        (tmp / file_name).write_text(text)
    if out.exists():  # built meanwhile by another process
        shutil.rmtree(tmp)
    else:
        os.replace(tmp, out)

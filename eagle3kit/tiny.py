"""Tiny reasoning-style targets built offline: a small tokenizer and a transformers model.

Used by `eagle3kit quickstart` and by the tests. Nothing is downloaded: the tokenizer is a
byte-level BPE trained on the docstrings of Python's own standard library, with the special
tokens of a Qwen3-style chat (`<|im_start|>`, `<|im_end|>`, `<think>`, `</think>`), and a chat
template that puts `<think>` into the generation prompt, as reasoning models do.
"""

from __future__ import annotations

import ast
import json
import sysconfig
from pathlib import Path

IM_START, IM_END, THINK, END_THINK, EOT = (
    "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|endoftext|>")
SPECIAL_TOKENS = [EOT, IM_START, IM_END]
# Added but not special, as in Qwen3: decoding keeps them, so reasoning stays visible.
THINK_TOKENS = [THINK, END_THINK]

CHAT_TEMPLATE = (
    "{% if system is defined and system %}" + IM_START + "system\n{{ system }}" + IM_END
    + "\n{% endif %}"
    "{% for message in messages %}"
    + IM_START + "{{ message['role'] }}\n"
    "{% if message['role'] == 'assistant' and message.get('reasoning_content') %}"
    + THINK + "\n{{ message['reasoning_content'] }}\n" + END_THINK + "\n\n"
    "{% endif %}"
    "{{ message['content'] }}" + IM_END + "\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}" + IM_START + "assistant\n" + THINK + "\n{% endif %}"
)


def stdlib_docstrings(max_chars: int = 400_000) -> list[str]:
    """Module and function docstrings of the standard library, in a fixed order.

    Every Python installation carries them, so the corpus is the same on every machine with
    the same Python version.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    texts: list[str] = []
    total = 0
    for path in sorted(root.glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Module | ast.FunctionDef | ast.ClassDef):
                continue
            doc = ast.get_docstring(node)
            if doc and 40 <= len(doc) <= 2000 and doc.isascii():
                texts.append(" ".join(doc.split()))
                total += len(texts[-1])
                if total >= max_chars:
                    return texts
    return texts


def make_tokenizer(out_dir: str | Path, vocab_size: int = 1024,
                   corpus: list[str] | None = None) -> Path:
    """Train a byte-level BPE on `corpus` (default: stdlib docstrings) and save it as an HF
    tokenizer directory with the chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus if corpus is not None else stdlib_docstrings(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=IM_END, pad_token=EOT, bos_token=None,
        additional_special_tokens=[IM_START])
    fast.add_tokens(THINK_TOKENS)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    (out / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [fast.convert_tokens_to_ids(IM_END), fast.convert_tokens_to_ids(EOT)]}))
    return out


def target_config(vocab_size: int, arch: str = "llama", num_layers: int = 8,
                  hidden_size: int = 64, heads: int = 4, kv_heads: int = 2,
                  intermediate_size: int | None = None, max_positions: int = 2048):
    """A transformers config for a tiny Llama- or Qwen3-style causal LM."""
    from transformers import LlamaConfig, Qwen3Config

    common = dict(
        vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads,
        intermediate_size=intermediate_size or 2 * hidden_size,
        max_position_embeddings=max_positions, rms_norm_eps=1e-6, tie_word_embeddings=False,
        head_dim=hidden_size // heads, rope_theta=10000.0)
    if arch == "llama":
        return LlamaConfig(**common)
    if arch == "qwen3":
        return Qwen3Config(**common)
    raise ValueError(f"unknown tiny architecture {arch!r} (llama or qwen3)")


def make_target(out_dir: str | Path, tokenizer_dir: str | Path | None = None, *,
                arch: str = "llama", num_layers: int = 8, hidden_size: int = 64,
                seed: int = 0, **config) -> Path:
    """A randomly initialised tiny target saved with its tokenizer in `out_dir`.

    Without `tokenizer_dir` a fresh stdlib tokenizer is trained into `out_dir` first.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if tokenizer_dir is None:
        make_tokenizer(out)
    else:
        tok = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
        tok.save_pretrained(out)
        gen = Path(tokenizer_dir) / "generation_config.json"
        if gen.is_file():
            (out / "generation_config.json").write_text(gen.read_text())
    tokenizer = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    cfg = target_config(len(tokenizer), arch, num_layers, hidden_size, **config)
    cfg.eos_token_id = tokenizer.convert_tokens_to_ids(IM_END)
    cfg.pad_token_id = tokenizer.pad_token_id
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.save_pretrained(out)
    eos = sorted({cfg.eos_token_id, tokenizer.convert_tokens_to_ids(EOT)})
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return out

"""Tiny Kimi-K2-shaped target built offline: the other shape the tool exists for.

Kimi-K2's (DeepSeek-V3's) architecture at toy size, with Multi-head Latent Attention, routed
and shared experts behind the bias-corrected sigmoid router, a dense first layer, Kimi-K2's
YaRN rope scaling, Kimi's chat markers, and a tokenizer that loads through its own code
(`auto_map`), as Kimi's does. `foreign_code` is how quickstart checks that such a directory
holds no code it did not write.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from eagle3kit import _durable
from eagle3kit.tiny import END_THINK, THINK, THINK_TOKENS, stdlib_docstrings

# config.json as moonshotai/Kimi-K2-Instruct writes it (a DeepseekV3ForCausalLM), shrunk.
# Kept at their real sizes: kv_lora_rank 512 and qk_rope_head_dim 64, because vLLM's CPU MLA
# decode kernel serves only a latent head of 576 (docs/vllm-cpu.md). The router fields are
# the real ones too: vLLM creates the router's e_score_correction_bias (which transformers
# saves) only for `topk_method: noaux_tc`.

KIMI_BOS, KIMI_EOS, KIMI_PAD = "[BOS]", "[EOS]", "[PAD]"
KIMI_SYSTEM, KIMI_USER, KIMI_ASSISTANT, KIMI_MIDDLE, KIMI_END = (
    "<|im_system|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_middle|>",
    "<|im_end|>",
)
KIMI_SPECIAL_TOKENS = [
    KIMI_BOS,
    KIMI_EOS,
    KIMI_END,
    KIMI_USER,
    KIMI_ASSISTANT,
    KIMI_SYSTEM,
    KIMI_MIDDLE,
    KIMI_PAD,
]
KIMI_CHAT_TEMPLATE = (
    "{%- if system is defined and system -%}"
    + KIMI_SYSTEM
    + "system"
    + KIMI_MIDDLE
    + "{{ system }}"
    + KIMI_END
    + "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}"
    + KIMI_SYSTEM
    + "system"
    + KIMI_MIDDLE
    + "{{ message['content'] }}"
    + KIMI_END
    + "{%- elif message['role'] == 'user' -%}"
    + KIMI_USER
    + "user"
    + KIMI_MIDDLE
    + "{{ message['content'] }}"
    + KIMI_END
    + "{%- else -%}"
    + KIMI_ASSISTANT
    + "assistant"
    + KIMI_MIDDLE
    + THINK
    + "{{ message.get('reasoning_content') or '' }}"
    + END_THINK
    + "{{ message['content'] }}"
    + KIMI_END
    + "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    + KIMI_ASSISTANT
    + "assistant"
    + KIMI_MIDDLE
    + THINK
    + "{%- endif -%}"
)
"""Kimi-K2-Thinking's turn markers (no newlines between turns), with the thought between
<think> and </think> and <think> in the generation prompt."""
KIMI_TOKENIZER_MODULE = "tokenization_tiny_kimi"
KIMI_TOKENIZER_CLASS = "TinyKimiTokenizer"
KIMI_TOKENIZER_CODE = f'''"""The tiny Kimi target's tokenizer: loaded through this file, as Kimi's
tokenization_kimi.py is, so every stage must be told --trust-remote-code to read it."""

from transformers import PreTrainedTokenizerFast


class {KIMI_TOKENIZER_CLASS}(PreTrainedTokenizerFast):
    """A byte-level BPE with Kimi's chat markers (eagle3kit.tiny.make_kimi_target)."""
'''
KIMI_AUTO_MAP = {"AutoTokenizer": [None, f"{KIMI_TOKENIZER_MODULE}.{KIMI_TOKENIZER_CLASS}"]}
"""tokenizer_config.json's `auto_map`, as make_kimi_tokenizer writes it."""
KIMI_CODE = {f"{KIMI_TOKENIZER_MODULE}.py": KIMI_TOKENIZER_CODE.encode()}
"""Every Python file make_kimi_target writes, and its bytes: the only code quickstart trusts."""
CONFIG_MAX_BYTES = 1 << 20
"""Larger than any config file quickstart writes (its tokenizer_config.json is a few KiB)."""
KIMI_ROPE_SCALING = {
    "beta_fast": 1.0,
    "beta_slow": 1.0,
    "factor": 32.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "original_max_position_embeddings": 4096,
    "type": "yarn",
}
"""Kimi-K2-Instruct's rope_scaling, as its config.json has it (rope_theta 50000, 131072
positions)."""
KIMI_ROPE_THETA = 50000.0
KIMI_TRAINING: dict[str, Any] = {"steps": 100, "batch_size": 4, "lr": 2e-3}
"""train_target's settings for the Kimi target: ~35 s on one quiet core (a step costs twice
the 8-layer target's), after which greedy answers have the reasoning shape (thought,
</think>, answer, <|im_end|>; loss ~7.0 -> ~3.6). 5e-3, the default, overshoots at hidden 256."""
KIMI_MAX_POSITIONS = 131072


def make_kimi_tokenizer(
    out_dir: str | Path, vocab_size: int = 1024, corpus: list[str] | None = None
) -> Path:
    """A byte-level BPE with Kimi's special tokens and chat template, saved so that it loads
    only through its own code: tokenizer_config.json's `auto_map` names
    tokenization_tiny_kimi.py, written beside it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=KIMI_SPECIAL_TOKENS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus if corpus is not None else stdlib_docstrings(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=KIMI_BOS,
        eos_token=KIMI_END,
        pad_token=KIMI_PAD,
        additional_special_tokens=[KIMI_EOS, KIMI_USER, KIMI_ASSISTANT, KIMI_SYSTEM, KIMI_MIDDLE],
    )
    fast.add_tokens(THINK_TOKENS)
    fast.chat_template = KIMI_CHAT_TEMPLATE
    fast.save_pretrained(out)
    for name, code in KIMI_CODE.items():
        (out / name).write_bytes(code)
    config_file = out / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config.update(tokenizer_class=KIMI_TOKENIZER_CLASS, auto_map=KIMI_AUTO_MAP)
    config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False))
    return out


def kimi_config(vocab_size: int, num_layers: int = 4, hidden_size: int = 256, heads: int = 4):
    """A transformers DeepseekV3Config in Kimi-K2's shape: MLA (q_lora_rank 128, kv_lora_rank
    512, nope/rope/v heads of 64), 8 routed experts of which 2 per token plus 1 shared, the
    noaux_tc sigmoid router, the first layer dense, Kimi-K2's YaRN."""
    from transformers import DeepseekV3Config

    rope = {k: v for k, v in KIMI_ROPE_SCALING.items() if k != "type"}
    return DeepseekV3Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        moe_intermediate_size=hidden_size // 2,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        n_shared_experts=1,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        routed_scaling_factor=2.827,
        norm_topk_prob=True,
        first_k_dense_replace=1,
        kv_lora_rank=512,
        q_lora_rank=128,
        qk_nope_head_dim=64,
        qk_rope_head_dim=64,
        v_head_dim=64,
        max_position_embeddings=KIMI_MAX_POSITIONS,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": KIMI_ROPE_THETA, **rope},
    )


def _as_kimi_writes_it(config_file: Path) -> None:
    """config.json with the fields Kimi-K2's has that transformers does not write (the router's
    kind) and its rope in the 4.x spelling Kimi ships (rope_theta, rope_scaling)."""
    config = json.loads(config_file.read_text())
    config.pop("rope_parameters", None)
    config.update(
        topk_method="noaux_tc",
        scoring_func="sigmoid",
        moe_layer_freq=1,
        rope_theta=KIMI_ROPE_THETA,
        rope_scaling=dict(KIMI_ROPE_SCALING),
    )
    config_file.write_text(json.dumps(config, indent=2))


def make_kimi_target(
    out_dir: str | Path,
    tokenizer_dir: str | Path | None = None,
    *,
    num_layers: int = 4,
    hidden_size: int = 256,
    seed: int = 0,
) -> Path:
    """A randomly initialised tiny Kimi-K2-shaped target (~6M parameters) saved with its
    custom-code tokenizer in `out_dir`; train it with train_target(..., trust_remote_code=True).

    Without `tokenizer_dir` a fresh tokenizer is trained into `out_dir` first (make_kimi_tokenizer).
    """
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eagle3kit import _hf

    _hf.quiet()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if tokenizer_dir is None:
        make_kimi_tokenizer(out)
    else:
        for file in Path(tokenizer_dir).iterdir():
            if file.is_file():
                shutil.copyfile(file, out / file.name)
    tokenizer = AutoTokenizer.from_pretrained(
        str(out), local_files_only=True, trust_remote_code=True
    )
    cfg = kimi_config(len(tokenizer), num_layers, hidden_size)
    cfg.bos_token_id = tokenizer.convert_tokens_to_ids(KIMI_BOS)
    cfg.eos_token_id = tokenizer.convert_tokens_to_ids(KIMI_END)
    cfg.pad_token_id = tokenizer.pad_token_id
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.save_pretrained(out)
    _as_kimi_writes_it(out / "config.json")
    eos = sorted({cfg.eos_token_id, tokenizer.convert_tokens_to_ids(KIMI_EOS)})
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": cfg.bos_token_id, "eos_token_id": eos})
    )
    return out


def foreign_code(root: Path, rebuilt: Path | None = None) -> str | None:
    """The first thing under `root` through which transformers, told to trust a directory's
    code, could run code that make_kimi_target did not write; None when there is none.

    Quickstart runs every stage of a Kimi target with trust on, because it wrote the
    tokenizer's code itself. A quickstart directory copied from elsewhere may hold other code:
    a Python file with other bytes or another name, an `auto_map` naming another module (or
    another directory's, `DIR--module.Class`), or a link to what lies outside. Anything but
    regular files and folders is refused too. `rebuilt` (a folder quickstart deletes and
    writes again before anything loads from it) is not looked into, only at.
    """
    for folder, dirs, files in os.walk(root):  # never descends into a link
        here = Path(folder)
        dirs.sort()  # the same first problem named on every run
        for name in sorted([*dirs, *files]):
            path = here / name
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                return f"{path}: a symbolic link (quickstart writes none)"
            if stat.S_ISDIR(mode):
                continue
            if not stat.S_ISREG(mode):
                return f"{path}: not a regular file"
            try:
                problem = _foreign_file(path)
            except (OSError, ValueError) as exc:  # vanished, unreadable, became a FIFO
                problem = f"unreadable ({getattr(exc, 'strerror', None) or exc})"
            if problem:
                return f"{path}: {problem}"
        if rebuilt is not None:
            dirs[:] = [d for d in dirs if here / d != rebuilt]
    return None


def _foreign_file(path: Path) -> str | None:
    """Why `path` (a regular file) could make transformers run code quickstart did not write."""
    if path.suffix == ".py":
        if KIMI_CODE.get(path.name) != _durable.read_small(path, CONFIG_MAX_BYTES):
            return "Python code quickstart did not write"
        return None
    if not path.name.endswith("config.json"):
        return None
    data = _durable.read_small(path, CONFIG_MAX_BYTES + 1)
    if len(data) > CONFIG_MAX_BYTES:
        return "larger than any config quickstart writes"
    try:
        config = json.loads(data)
    except ValueError:
        return None  # transformers refuses it before it could run anything
    auto_map = config.get("auto_map") if isinstance(config, dict) else None
    if auto_map is not None and auto_map != KIMI_AUTO_MAP:
        return f"its auto_map ({json.dumps(auto_map)[:200]}) names code quickstart did not write"
    return None

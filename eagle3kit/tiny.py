"""Tiny reasoning-style targets built offline: a small tokenizer and a transformers model.

Used by `eagle3kit quickstart` and by the tests. Nothing is downloaded: the tokenizer is a
byte-level BPE trained on the docstrings of Python's own standard library, with the special
tokens of a Qwen3-style chat (`<|im_start|>`, `<|im_end|>`, `<think>`, `</think>`), and a chat
template that puts `<think>` into the generation prompt, as reasoning models do.

The other shape the tool exists for, Kimi-K2's, is built by `eagle3kit/tiny_kimi.py`.
"""

from __future__ import annotations

import ast
import functools
import json
import math
import re
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

IM_START, IM_END, THINK, END_THINK, EOT = (
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<|endoftext|>",
)
SPECIAL_TOKENS = [EOT, IM_START, IM_END]
# Added but not special, as in Qwen3: decoding keeps them, so reasoning stays visible.
THINK_TOKENS = [THINK, END_THINK]

CHAT_TEMPLATE = (
    "{% if system is defined and system %}"
    + IM_START
    + "system\n{{ system }}"
    + IM_END
    + "\n{% endif %}"
    "{% for message in messages %}" + IM_START + "{{ message['role'] }}\n"
    "{% if message['role'] == 'assistant' and message.get('reasoning_content') %}"
    + THINK
    + "\n{{ message['reasoning_content'] }}\n"
    + END_THINK
    + "\n\n"
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
    return list(_docstrings(max_chars))


@functools.lru_cache(maxsize=4)
def _docstrings(max_chars: int) -> tuple[str, ...]:
    # Parsing the stdlib takes a second or more; quickstart and prompts() ask several times.
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
                    return tuple(texts)
    return tuple(texts)


def make_tokenizer(
    out_dir: str | Path,
    vocab_size: int = 1024,
    corpus: list[str] | None = None,
    *,
    split_digits: bool = False,
) -> Path:
    """Train a byte-level BPE on `corpus` (default: stdlib docstrings) and save it as an HF
    tokenizer directory with the chat template. `split_digits`: every digit is a token of
    its own (as in Llama's and Qwen's tokenizers), so numbers are read digit by digit."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if split_digits:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), tok.pre_tokenizer]
        )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus if corpus is not None else stdlib_docstrings(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=EOT,
        bos_token=None,
        additional_special_tokens=[IM_START],
    )
    fast.add_tokens(THINK_TOKENS)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    (out / "generation_config.json").write_text(
        json.dumps(
            {"eos_token_id": [fast.convert_tokens_to_ids(IM_END), fast.convert_tokens_to_ids(EOT)]}
        )
    )
    return out


def target_config(
    vocab_size: int,
    arch: str = "llama",
    num_layers: int = 8,
    hidden_size: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate_size: int | None = None,
    max_positions: int = 2048,
    head_dim: int = 32,
):
    """A transformers config for a tiny Llama- or Qwen3-style causal LM.

    Heads of 32 whatever the hidden size: vLLM's CPU attention serves head sizes of 32 and
    more only (it refuses 16 at the first request), so these targets, the quickstart's
    among them, are ones vLLM's CPU build can serve (docs/vllm-cpu.md).
    """
    from transformers import LlamaConfig, Qwen3Config

    common: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate_size or 2 * hidden_size,
        max_position_embeddings=max_positions,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        head_dim=head_dim,
        rope_theta=10000.0,
    )
    if arch == "llama":
        return LlamaConfig(**common)
    if arch == "qwen3":
        return Qwen3Config(**common)
    raise ValueError(f"unknown tiny architecture {arch!r} (llama or qwen3)")


def make_target(
    out_dir: str | Path,
    tokenizer_dir: str | Path | None = None,
    *,
    arch: str = "llama",
    num_layers: int = 8,
    hidden_size: int = 64,
    seed: int = 0,
    **config,
) -> Path:
    """A randomly initialised tiny target saved with its tokenizer in `out_dir`.

    Without `tokenizer_dir` a fresh stdlib tokenizer is trained into `out_dir` first.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eagle3kit import _hf

    _hf.quiet()
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


# --- a briefly trained target -------------------------------------------------------------
#
# A random target's greedy output is a loop of arbitrary tokens: nothing a drafter can learn
# and nothing that ever reaches </think>. A minute of training on reasoning-shaped chats built
# from the docstrings gives it the structure of a reasoning model (a fixed opening, a bounded
# thought, </think>, a short answer, <|im_end|>), which makes its own outputs predictable
# enough for a drafter to reach a real acceptance length.

HELD_OUT_EVERY = 8
"""Every 8th docstring (index % 8 == 7) is held out of train_target; prompts() draws from them."""

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def _clip(text: str, limit: int) -> str:
    """At most `limit` characters, cut at a word boundary."""
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0]


def docstring_chat(doc: str) -> tuple[str, str, str]:
    """(question, reasoning, answer) for one docstring.

    The question is its first sentence, the reasoning the sentences after it between a fixed
    opening and closing phrase, the answer a short restatement of the question. Lengths are
    bounded so that a trained target's thoughts end within ~100 tokens.
    """
    sentences = _SENTENCE_END.split(doc)
    question = _clip(sentences[0], 120)
    rest = _clip(" ".join(sentences[1:]), 160) or question
    reasoning = f"Let me think about this. {rest} So the answer is short."
    answer = f"In short: {_clip(sentences[0], 60).rstrip('.')}."
    return question, reasoning, answer


def _split(docs: list[str], held_out: bool) -> list[str]:
    return [d for i, d in enumerate(docs) if (i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1) == held_out]


def prompts(n: int, *, offset: int = 0) -> list[list[dict[str, str]]]:
    """`n` chat prompts (OpenAI messages, one user turn each) from held-out stdlib docstrings.

    They come from the docstrings train_target never saw (every 8th), in a fixed order, so a
    quickstart can generate training data from prompts[:k] and benchmark on the rest. About
    220 exist (Python 3.11); asking for more raises ValueError.
    """
    pool = _split(stdlib_docstrings(), held_out=True)
    if offset < 0 or offset + n > len(pool):
        raise ValueError(
            f"only {len(pool)} held-out prompts exist (asked for {offset}..{offset + n})"
        )
    return [[{"role": "user", "content": docstring_chat(d)[0]}] for d in pool[offset : offset + n]]


def chat_token_ids(tokenizer: Any, docs: list[str], seq_len: int) -> list[list[int]]:
    """Each docstring as a whole reasoning chat, rendered by the tokenizer's own template."""
    out = []
    for doc in docs:
        question, reasoning, answer = docstring_chat(doc)
        messages = [
            {"role": "user", "content": question},
            {"role": "assistant", "content": answer, "reasoning_content": reasoning},
        ]
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"][:seq_len])
    return out


def _batch(chats: list[list[int]], pad: int):
    """Right-padded ids and labels (-100 on padding); causal attention keeps padding unseen."""
    import torch

    width = max(map(len, chats))
    ids = torch.full((len(chats), width), pad, dtype=torch.long)
    labels = torch.full((len(chats), width), -100, dtype=torch.long)
    for row, chat in enumerate(chats):
        ids[row, : len(chat)] = labels[row, : len(chat)] = torch.tensor(chat)
    return ids, labels


def train_target(
    target_dir: str | Path,
    *,
    steps: int = 300,
    seq_len: int = 256,
    seed: int = 0,
    corpus: list[str] | None = None,
    batch_size: int = 8,
    lr: float = 5e-3,
    threads: int = 1,
    on_step: Callable[[float], None] | None = None,
    trust_remote_code: bool = False,
) -> Path:
    """Briefly train the tiny target in `target_dir` (made by make_target) and save it in place.

    `corpus` is a list of docstring-like texts, each turned into one reasoning chat
    (docstring_chat); the default is the stdlib docstrings minus the held-out ones prompts()
    uses. Deterministic for a given seed: fixed order, seeded shuffles, CPU, AdamW with a
    short warmup and a cosine decay, on `threads` torch threads (default one: matrices this
    small gain little from a second, and on a busy machine two threads spinning for each
    other are several times slower than one; the thread count is restored afterwards).

    The defaults take ~1.5-3 minutes for the 8-layer, hidden-64 target (loss ~6.9 to ~3.0),
    after which greedy outputs reach </think> and <|im_end|> within ~60 tokens, each once
    (300 steps: at 150 some answers still repeated their </think>). The loss curve is
    written to `target_dir/tiny_training.json`. `on_step(loss)` is called after each step
    (quickstart draws its progress from it). `trust_remote_code`: the target's tokenizer loads
    through its own code (make_kimi_target's). config.json is kept as it was written.
    """
    import torch

    for name, value in (
        ("steps", steps),
        ("seq_len", seq_len),
        ("batch_size", batch_size),
        ("threads", threads),
    ):
        if value < 1:
            raise ValueError(f"train_target: {name} must be >= 1 (got {value})")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _train(
            Path(target_dir),
            steps,
            seq_len,
            seed,
            corpus,
            batch_size,
            lr,
            on_step,
            trust_remote_code,
        )
    finally:
        torch.set_num_threads(before)


def _train(
    out: Path,
    steps: int,
    seq_len: int,
    seed: int,
    corpus: list[str] | None,
    batch_size: int,
    lr: float,
    on_step: Callable[[float], None] | None,
    trust_remote_code: bool,
) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eagle3kit import _hf

    _hf.quiet()
    tokenizer = AutoTokenizer.from_pretrained(
        str(out), local_files_only=True, trust_remote_code=trust_remote_code
    )
    docs = corpus if corpus is not None else _split(stdlib_docstrings(), held_out=False)
    chats = chat_token_ids(tokenizer, docs, seq_len)
    if not chats:
        raise ValueError("train_target: the corpus is empty")
    torch.manual_seed(seed)
    order = torch.Generator().manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    warmup = max(1, steps // 10)
    queue: list[int] = []
    losses = []
    for step in range(steps):
        if len(queue) < batch_size:
            queue += torch.randperm(len(chats), generator=order).tolist()
        picked, queue = queue[:batch_size], queue[batch_size:]
        ids, labels = _batch([chats[i] for i in picked], tokenizer.pad_token_id)
        scale = min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * step / steps))
        for group in opt.param_groups:
            group["lr"] = lr * scale
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(round(loss.item(), 4))
        if on_step is not None:
            on_step(losses[-1])
    model.eval()
    # save_pretrained rewrites config.json in transformers' spelling; the target keeps its own.
    config_text = (out / "config.json").read_text()
    model.save_pretrained(out)
    (out / "config.json").write_text(config_text)
    (out / "tiny_training.json").write_text(
        json.dumps(
            {
                "steps": steps,
                "batch_size": batch_size,
                "lr": lr,
                "seed": seed,
                "seq_len": seq_len,
                "chats": len(chats),
                "losses": losses,
            }
        )
    )
    return out

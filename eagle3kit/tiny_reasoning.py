"""A tiny reasoning target whose outputs are as predictable at T = 1 as a real reasoning model's.

eagle3kit.tiny's target learns stdlib docstrings, whose continuations are nearly flat at
temperature 1: no drafter can show a lead at the temperature a reasoning model is served.
Real reasoning traces are mostly formulaic (restating the problem, one step after another in
a fixed phrasing, copying what was just written) with a few hard tokens between. This world
has that shape: synthetic step-by-step tasks written out in full inside the think block

- addition and subtraction with every column's carry or borrow written out, and long
  multiplication by its partial products (a few hundred tokens);
- sorting by repeated selection, every remaining list written out (up to ~2K tokens, so
  that context-depth buckets carry rounds);
- unit conversion (time, length, mass, volume) step by step;
- rule chains: small proofs that apply "every X is a Y" rules one at a time;

mixed with natural text (the stdlib docstrings eagle3kit.tiny reads, as its reasoning chats).
The tokenizer is tiny's stdlib BPE with its chat template (think/answer markers), trained
with digits as single tokens, so numbers are read and written digit by digit.

Prompts are split into train / held-out / checkpoint-choice by a hash of the question text
(`split_of`): a question belongs to one split whatever seed drew it, so the splits are
disjoint by construction; the seed only picks which problems are drawn. The target trains
on the train split alone.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from eagle3kit import tiny

SPLITS = ("train", "heldout", "choice")
"""The prompt splits: the target's and the drafter's training data, the benchmark's held-out
prompts, and the prompts a drafter's checkpoint is chosen on."""
_SPLIT_BUCKETS = {"heldout": range(0, 2), "choice": range(2, 3)}
"""Of 10 hash buckets, 2 are held out and 1 is for checkpoint choice; the rest train."""

Chat = tuple[str, str, str]
"""(question, reasoning, answer)."""


def split_of(question: str) -> str:
    """Which split a question belongs to: a property of its text alone (sha256)."""
    bucket = hashlib.sha256(question.encode()).digest()[0] % 10
    for name, buckets in _SPLIT_BUCKETS.items():
        if bucket in buckets:
            return name
    return "train"


# -- the tasks -------------------------------------------------------------------------------


def _number(rng: random.Random, low_digits: int, high_digits: int) -> int:
    digits = rng.randint(low_digits, high_digits)
    return rng.randint(10 ** (digits - 1), 10**digits - 1)


def addition(rng: random.Random) -> Chat:
    a, b = _number(rng, 2, 7), _number(rng, 1, 7)
    question = f"What is {a} + {b}?"
    da, db = str(a)[::-1], str(b)[::-1]
    lines = [f"I add {a} and {b} digit by digit, starting from the right."]
    carry, out = 0, []
    for i in range(max(len(da), len(db))):
        x, y = int(da[i]) if i < len(da) else 0, int(db[i]) if i < len(db) else 0
        total = x + y + carry
        lines.append(
            f"{x} + {y} + {carry} = {total}. I write {total % 10} and carry {total // 10}."
        )
        carry = total // 10
        out.append(str(total % 10))
    if carry:
        lines.append(f"The last carry {carry} is the first digit.")
        out.append(str(carry))
    lines.append(f"Reading the digits from the left: {''.join(reversed(out))}.")
    lines.append(f"So {a} + {b} = {a + b}.")
    return question, "\n".join(lines), f"{a} + {b} = {a + b}."


def subtraction(rng: random.Random) -> Chat:
    a, b = sorted((_number(rng, 2, 7), _number(rng, 1, 6)), reverse=True)
    question = f"What is {a} - {b}?"
    da, db = str(a)[::-1], str(b)[::-1]
    lines = [f"I subtract {b} from {a} digit by digit, starting from the right."]
    borrow, out = 0, []
    for i in range(len(da)):
        x, y = int(da[i]), int(db[i]) if i < len(db) else 0
        top = x - borrow
        if top < y:
            lines.append(
                f"{x} - {borrow} = {top} is less than {y}, so I borrow: "
                f"{top + 10} - {y} = {top + 10 - y}. I write {top + 10 - y}."
            )
            out.append(str(top + 10 - y))
            borrow = 1
        else:
            lines.append(f"{x} - {borrow} = {top}, and {top} - {y} = {top - y}. I write {top - y}.")
            out.append(str(top - y))
            borrow = 0
    lines.append(f"Reading the digits from the left: {''.join(reversed(out)).lstrip('0') or '0'}.")
    lines.append(f"So {a} - {b} = {a - b}.")
    return question, "\n".join(lines), f"{a} - {b} = {a - b}."


def multiplication(rng: random.Random) -> Chat:
    a, b = _number(rng, 2, 4), _number(rng, 1, 3)
    question = f"What is {a} x {b}?"
    lines = [f"I multiply {a} by each digit of {b}, starting from the right."]
    partials = []
    for place, digit in enumerate(reversed(str(b))):
        shift = 10**place
        lines.append(f"{a} x {digit} = {a * int(digit)}.")
        if place:
            lines.append(
                f"Shifted by {place} place{'s' if place > 1 else ''}: {a * int(digit) * shift}."
            )
        partials.append(a * int(digit) * shift)
    if len(partials) > 1:
        running = partials[0]
        for part in partials[1:]:
            lines.append(f"{running} + {part} = {running + part}.")
            running += part
    lines.append(f"So {a} x {b} = {a * b}.")
    return question, "\n".join(lines), f"{a} x {b} = {a * b}."


def sorting(rng: random.Random) -> Chat:
    # Mostly short lists, a few long ones: the long ones give traces of 1-2K tokens.
    n = rng.choice((4, 5, 6, 7, 8, 10, 12, 16, 20, 28))
    values = [rng.randint(0, 99) for _ in range(n)]
    question = "Sort from smallest to largest: " + ", ".join(map(str, values)) + "."
    lines = ["I take the smallest number that is left, one at a time."]
    left, done = list(values), []
    while left:
        smallest = min(left)
        lines.append(f"Left: {', '.join(map(str, left))}. The smallest is {smallest}.")
        left.remove(smallest)
        done.append(smallest)
    order = ", ".join(map(str, done))
    lines.append(f"In order: {order}.")
    return question, "\n".join(lines), f"{order}."


_UNITS = [  # (big, small, factor)
    ("hours", "minutes", 60),
    ("minutes", "seconds", 60),
    ("days", "hours", 24),
    ("weeks", "days", 7),
    ("kilometers", "meters", 1000),
    ("meters", "centimeters", 100),
    ("kilograms", "grams", 1000),
    ("liters", "milliliters", 1000),
    ("feet", "inches", 12),
    ("yards", "feet", 3),
    ("dozens", "eggs", 12),
]


def conversion(rng: random.Random) -> Chat:
    # One or two steps down a chain of units (hours -> minutes -> seconds).
    start = rng.randrange(len(_UNITS))
    chain = [_UNITS[start]]
    following = [u for u in _UNITS if u[0] == chain[0][1]]
    if following and rng.random() < 0.5:
        chain.append(following[0])
    big, extra = rng.randint(2, 60), rng.randint(0, chain[0][2] - 1)
    question = f"How many {chain[-1][1]} are in {big} {chain[0][0]} and {extra} {chain[0][1]}?"
    lines = [f"One of the {big_} is {factor} {small}." for big_, small, factor in chain]
    value = big * chain[0][2]
    lines.append(f"{big} {chain[0][0]} = {big} x {chain[0][2]} = {value} {chain[0][1]}.")
    lines.append(f"{value} + {extra} = {value + extra} {chain[0][1]}.")
    value += extra
    for _, small, factor in chain[1:]:
        lines.append(f"{value} x {factor} = {value * factor} {small}.")
        value *= factor
    lines.append(f"So the answer is {value} {chain[-1][1]}.")
    return question, "\n".join(lines), f"{value} {chain[-1][1]}."


_SYLLABLES = [
    "ba",
    "ko",
    "ri",
    "mu",
    "te",
    "za",
    "lo",
    "ni",
    "pe",
    "du",
    "fi",
    "go",
    "sa",
    "vo",
    "ke",
    "ju",
]
_NAMES = ["Ann", "Bo", "Cy", "Dee", "Eli", "Fay", "Gus", "Hal", "Ivy", "Jo", "Kim", "Lu"]


def rule_chain(rng: random.Random) -> Chat:
    length = rng.randint(2, 9)
    kinds: list[str] = []
    while len(kinds) < length + 4:
        word = "".join(rng.choice(_SYLLABLES) for _ in range(2))
        if word not in kinds:
            kinds.append(word)
    path, distractors = kinds[: length + 1], kinds[length + 1 :]
    # Two rules lead off the path to dead ends; one leads from a word no one is onto it.
    rules = [(path[i], path[i + 1]) for i in range(length)]
    rules += [(rng.choice(path[:-1]), d) for d in distractors[:2]]
    rules.append((distractors[2], path[1]))
    rng.shuffle(rules)
    name = rng.choice(_NAMES)
    reachable = rng.random() < 0.7
    goal = path[-1] if reachable else distractors[2]
    question = (
        " ".join(f"Every {x} is a {y}." for x, y in rules)
        + f" {name} is a {path[0]}. Is {name} a {goal}?"
    )
    lines = [f"{name} is a {path[0]}."]
    for x, y in itertools.pairwise(path):
        lines.append(f"{name} is a {x}, and every {x} is a {y}, so {name} is a {y}.")
    if reachable:
        answer = f"Yes, {name} is a {goal}."
    else:
        lines.append(f"No rule leads from {path[-1]} on, and none makes {name} a {goal}.")
        answer = f"No, {name} need not be a {goal}."
    lines.append("So " + answer[0].lower() + answer[1:])
    return question, "\n".join(lines), answer


TASKS: dict[str, Callable[[random.Random], Chat]] = {
    "addition": addition,
    "subtraction": subtraction,
    "multiplication": multiplication,
    "sorting": sorting,
    "conversion": conversion,
    "rules": rule_chain,
}
MIX: dict[str, float] = {
    "addition": 0.15,
    "subtraction": 0.1,
    "multiplication": 0.1,
    "sorting": 0.2,
    "conversion": 0.15,
    "rules": 0.2,
    "text": 0.1,
}
"""The share of each task among drawn chats; "text" is a docstring chat (eagle3kit.tiny)."""


@functools.lru_cache(maxsize=1)
def _docstring_chats() -> dict[str, tuple[Chat, ...]]:
    """The docstring chats of each split (computed once: several draws ask for them)."""
    by_split: dict[str, list[Chat]] = {split: [] for split in SPLITS}
    for doc in tiny.stdlib_docstrings():
        chat = tiny.docstring_chat(doc)
        by_split[split_of(chat[0])].append(chat)
    return {split: tuple(found) for split, found in by_split.items()}


def chats(split: str, n: int, seed: int = 0, mix: dict[str, float] | None = None) -> list[Chat]:
    """`n` distinct chats of `split` (SPLITS), drawn by `seed` in the proportions of `mix`.

    Deterministic for a seed; a question belongs to one split whatever the seed (split_of),
    and no question repeats within the result.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} (one of {', '.join(SPLITS)})")
    weights = mix or MIX
    rng = random.Random(f"{seed}/{split}")
    docs = list(_docstring_chats()[split])
    rng.shuffle(docs)
    names = list(weights)
    seen: set[str] = set()
    out: list[Chat] = []
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > 50 * n + 1000:
            raise ValueError(f"only {len(out)} distinct {split} chats could be drawn (asked {n})")
        kind = rng.choices(names, [weights[k] for k in names])[0]
        if kind == "text":
            if not docs:
                continue
            chat = docs.pop()
        else:
            chat = TASKS[kind](rng)
        if chat[0] in seen or split_of(chat[0]) != split:
            continue
        seen.add(chat[0])
        out.append(chat)
    return out


def prompts(split: str, n: int, seed: int = 0) -> list[list[dict[str, str]]]:
    """`n` chat prompts (OpenAI messages, one user turn each) of `split`."""
    return [[{"role": "user", "content": q}] for q, _, _ in chats(split, n, seed)]


def write_prompts(path: str | Path, split: str, n: int, seed: int = 0) -> Path:
    """`n` prompts of `split` as a JSONL file gen and bench accept read ({"messages": ...})."""
    out = Path(path)
    out.write_text("".join(json.dumps({"messages": m}) + "\n" for m in prompts(split, n, seed)))
    return out


# -- the target ------------------------------------------------------------------------------


@dataclass
class TargetRecipe:
    """The reasoning target's shape and training (train_reasoning_target).

    The default is narrow and long-trained rather than wide: on one CPU thread what makes a
    target predictable is steps (a hidden-128 target after 150 steps still wrote word salad
    at T = 1, its mean top probability 0.27), and a hidden-64 step costs a third of a
    hidden-128 one. Seven layers are the fewest whose default aux layers (2, 3, 4) are
    distinct.
    """

    hidden_size: int = 64
    num_layers: int = 7
    heads: int = 2
    kv_heads: int = 1
    vocab_size: int = 512
    chats: int = 6000
    """Training chats drawn from the train split."""
    steps: int = 900
    row_tokens: int = 512
    """Chats are packed into rows of this many tokens, `rows` rows a step."""
    rows: int = 4
    lr: float = 8e-3
    seed: int = 0
    tokenizer_chars: int = 400_000
    """Characters of stdlib docstrings the tokenizer learns from (beside 600 task chats)."""


def _tokenizer_corpus(seed: int, docstring_chars: int) -> list[str]:
    """Docstrings (the first `docstring_chars` characters' worth) and a sample of task
    chats, so the BPE learns the tasks' words."""
    docs, total = [], 0
    for doc in tiny.stdlib_docstrings():
        if total >= docstring_chars:
            break
        docs.append(doc)
        total += len(doc)
    return docs + ["\n".join(c) for c in chats("train", 600, seed)]


def _packed_rows(ids: list[list[int]], width: int, rng: random.Random) -> Iterator[list[int]]:
    """Endless rows of `width` tokens: the chats in a fresh seeded order each pass, end to end
    (a chat may run over into the next row, as in pretraining)."""
    buffer: list[int] = []
    while True:
        order = list(range(len(ids)))
        rng.shuffle(order)
        for i in order:
            buffer += ids[i]
            while len(buffer) >= width:
                yield buffer[:width]
                buffer = buffer[width:]


def train_reasoning_target(
    out_dir: str | Path,
    recipe: TargetRecipe | None = None,
    *,
    on_step: Callable[[int, float], None] | None = None,
) -> Path:
    """Build and train the reasoning target in `out_dir` (tokenizer, config, weights).

    Deterministic for a recipe (seeded draws, orders and initialisation, CPU, one torch
    thread). Writes `reasoning_target.json`: the recipe, the loss curve and the training's
    wall time. `on_step(step, loss)` after each step.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eagle3kit import _hf

    r = recipe or TargetRecipe()
    _hf.quiet()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        began = time.perf_counter()
        tok_dir = tiny.make_tokenizer(
            out / "tokenizer",
            r.vocab_size,
            _tokenizer_corpus(r.seed, r.tokenizer_chars),
            split_digits=True,
        )
        tiny.make_target(
            out,
            tok_dir,
            num_layers=r.num_layers,
            hidden_size=r.hidden_size,
            seed=r.seed,
            heads=r.heads,
            kv_heads=r.kv_heads,
            max_positions=4096,
        )
        tokenizer = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
        ids = []
        for question, reasoning, answer in chats("train", r.chats, r.seed):
            messages = [
                {"role": "user", "content": question},
                {"role": "assistant", "content": answer, "reasoning_content": reasoning},
            ]
            text = tokenizer.apply_chat_template(messages, tokenize=False)
            ids.append(tokenizer(text, add_special_tokens=False)["input_ids"])
        torch.manual_seed(r.seed)
        model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=r.lr, betas=(0.9, 0.95), weight_decay=0.0)
        rows = _packed_rows(ids, r.row_tokens, random.Random(r.seed))
        warmup = max(1, r.steps // 10)
        losses = []
        train_began = time.perf_counter()
        for step in range(r.steps):
            batch = torch.tensor([next(rows) for _ in range(r.rows)])
            scale = min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * step / r.steps))
            for group in opt.param_groups:
                group["lr"] = r.lr * scale
            loss = model(input_ids=batch, labels=batch).loss
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(round(loss.item(), 4))
            if on_step is not None:
                on_step(step, losses[-1])
        model.eval()
        config_text = (out / "config.json").read_text()
        model.save_pretrained(out)
        (out / "config.json").write_text(config_text)
        (out / "reasoning_target.json").write_text(
            json.dumps(
                {
                    "recipe": asdict(r),
                    "chats": len(ids),
                    "chat_tokens": sum(map(len, ids)),
                    "train_seconds": round(time.perf_counter() - train_began, 1),
                    "total_seconds": round(time.perf_counter() - began, 1),
                    "losses": losses,
                }
            )
        )
        return out
    finally:
        torch.set_num_threads(before)


def load_record(target_dir: str | Path) -> dict[str, Any]:
    """What train_reasoning_target recorded (recipe, losses, seconds)."""
    return json.loads((Path(target_dir) / "reasoning_target.json").read_text())

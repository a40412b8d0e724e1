"""The model card `eagle3kit export` writes beside each exported drafter (README.md).

Hugging Face's model-card form: a YAML front matter (`base_model`, `library_name`, `tags`)
the Hub reads, then what a person deciding whether to serve the drafter needs: its shape, the
aux layer ids and draft vocabulary, the data it was trained on and where that came from
(prompts, servers, sampling: read from the datasets' manifests, else from what train recorded
in run.json), the held-out prediction, and the exact launch lines. Whatever is not known is
said to be unknown, never left out silently.

Every string a record holds (a path, a server, a prompt source, a model name, a sampling
value) comes from a file someone else may have written, so it goes in as inline code on one
line (`code`): no heading, link, image or HTML of its own. Figures come only from what
eagle3kit recorded and can check: the held-out prediction is the drafter's own, and only
when its rates give its length.

`launch_lines` is the one place the code writes vLLM and SGLang launch lines; `read_card`
gives `eagle3kit info` the card's key facts back, from eagle3kit's own lines only. Importing
this module loads no torch.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from eagle3kit.model.acceptance import predicted_acceptance_length
from eagle3kit.target import to_layer_output

CARD = "README.md"
TAGS = ("eagle3", "speculative-decoding", "eagle3kit")
LIBRARY = {"vllm": "speculators", "sglang": "sglang"}
"""The library whose layout each export is: speculators (served by vLLM), SGLang's."""
UNKNOWN = "unknown"
CARD_BYTES = 1 << 20
"""The largest card `info` reads: export's are a few KiB."""
SECTIONS = ("The drafter", "Training data", "Held-out prediction", "Serving")
"""The card's sections, in the order export writes them."""
CODE_CHARS = 300
"""The most characters of a recorded string the card shows (the rest is counted)."""
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069`]")
"""What a JSON string may hold raw that would end a code span or a line, or reorder one."""


@dataclass
class DataSource:
    """One dataset the drafter was trained on, as far as it can be traced."""

    path: str
    kind: str
    samples: int | None
    tokens: int | None
    counted_by: str
    """Where the counts come from: "manifest" (the dataset, read now) or "run.json"."""
    weight: float | None = None
    origin: Any = None
    """eagle3kit.format.Origin of the dataset, when its manifest was readable."""
    source: DataSource | None = None
    """For hidden states: the token dataset they were extracted from."""


@dataclass
class CardFacts:
    """What export knows about one exported drafter, the card's content."""

    fmt: str
    where: str
    """The export's directory, as the launch lines name it."""
    base_model: str
    drafter: Any
    """The DrafterConfig."""
    dtype: str
    speculative_tokens: int
    coverage: float | None
    prediction: dict | None
    data: list[DataSource] | None
    """None when the source was a checkpoint, not a run (nothing recorded)."""
    sibling: str | None = None
    """The SGLang export beside a speculators one (`--format both`)."""


# Gathering -----------------------------------------------------------------------------------
def _open(path: str) -> Any:
    """The dataset at `path`, or None where it is not reachable or not readable."""
    from eagle3kit.errors import UserError
    from eagle3kit.format import Dataset, DatasetError

    try:
        return Dataset(Path(path), kind=None, verify_shards=False, warn_stray=False)
    except (DatasetError, UserError, OSError, ValueError):
        return None


def trace(
    path: str,
    kind: str = UNKNOWN,
    samples: int | None = None,
    tokens: int | None = None,
    weight: float | None = None,
) -> DataSource:
    """The dataset at `path` and, for hidden states, the token dataset behind it; the counts
    given (what train recorded) stand where the dataset cannot be read now."""
    ds = _open(path)
    if ds is None:
        return DataSource(path, kind, samples, tokens, "run.json", weight)
    origin = ds.origin()
    source = trace(origin.tokens, "tokens") if origin.tokens else None
    return DataSource(path, ds.kind, len(ds), ds.num_tokens, "manifest", weight, origin, source)


def training_data(run: dict) -> list[DataSource]:
    """The datasets run.json says the drafter trained on; a count or weight that is not a
    number stands as unknown."""
    entries = run.get("data")
    out = []
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("path"), str):
            weight = entry.get("weight")
            out.append(
                trace(
                    entry["path"],
                    str(entry.get("kind") or UNKNOWN),
                    _count_or_none(entry.get("samples")),
                    _count_or_none(entry.get("tokens")),
                    float(weight) if _is_finite(weight) else None,
                )
            )
    return out


def _count_or_none(value: object) -> int | None:
    return value if type(value) is int and 0 <= value < 2**63 else None


def _is_finite(value: object) -> TypeGuard[int | float]:
    return type(value) in (int, float) and math.isfinite(value)  # type: ignore[arg-type]


def checked_prediction(prediction: object) -> dict | None:
    """The held-out evaluation eagle3kit recorded, when it holds together: per-position rates
    in [0, 1] whose chain gives the predicted acceptance length recorded (train writes both,
    rounded to 6 places); None otherwise, so no other figure reaches the card or `info`."""
    if not isinstance(prediction, dict):
        return None
    rates, length = prediction.get("per_position"), prediction.get("predicted_acceptance_length")
    if not (
        isinstance(rates, list)
        and 0 < len(rates) <= 64
        and _is_finite(length)
        and all(_is_finite(r) and 0 <= r <= 1 for r in rates)
    ):
        return None
    if abs(predicted_acceptance_length(rates) - length) > 1e-4:
        return None
    return {
        "predicted_acceptance_length": float(length),
        "k": len(rates),
        "per_position": [float(r) for r in rates],
    }


# Launch lines --------------------------------------------------------------------------------
def launch_lines(
    fmt: str,
    where: str,
    base_model: str,
    k: int,
    sglang_dir: str | None = None,
    window: int | None = None,
) -> list[tuple[str, str]]:
    """(what, command line) that serve the export at `where` for `base_model`, drafting `k`
    tokens per step: vLLM's short form (the speculators layout), vLLM's long form (either
    layout), and SGLang's for its layout (`sglang_dir`: the SGLang export of a
    `--format both`). `method`/`--speculative-algorithm` are always given: served as plain
    EAGLE, an EAGLE-3 drafter is accepted at exactly 1. A drafter with a sliding `window`
    of W keys gets SGLang's `--speculative-draft-window-size W-1` (SGLang reads the window
    from that flag only, and counts the keys before the query's own); vLLM reads it from
    the config."""
    spec = json.dumps({"method": "eagle3", "model": where, "num_speculative_tokens": k})
    lines = []
    if fmt == "vllm":
        lines.append(
            (
                "vLLM, the draft directory alone (it names the target)",
                f"vllm serve {shlex.quote(where)}",
            )
        )
    lines.append(
        (
            "vLLM, the target with the draft named",
            f"vllm serve {shlex.quote(base_model)} --speculative-config {shlex.quote(spec)}",
        )
    )
    sglang_dir = where if fmt == "sglang" else sglang_dir
    if sglang_dir is not None:
        lines.append(
            (
                "SGLang",
                f"python -m sglang.launch_server --model-path "
                f"{shlex.quote(base_model)} --speculative-algorithm EAGLE3 "
                f"--speculative-draft-model-path {shlex.quote(sglang_dir)} "
                f"--speculative-num-steps {k} --speculative-eagle-topk 1 "
                f"--speculative-num-draft-tokens {k + 1}"
                + (f" --speculative-draft-window-size {window - 1}" if window else ""),
            )
        )
    return lines


# Writing ------------------------------------------------------------------------------------
def _yaml_str(text: str) -> str:
    """A YAML scalar: JSON's double-quoted string is valid YAML."""
    return json.dumps(text)


def code(text: object) -> str:
    """A recorded string as inline code on one line: escaped as a JSON string is (a
    backslash, a quote, each control character and line break), the bidi controls and
    backticks too (`\\u0060`), so nothing in it ends the code span; cut at CODE_CHARS."""
    escaped = json.dumps(str(text), ensure_ascii=False)[1:-1]
    escaped = _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", escaped)
    if len(escaped) > CODE_CHARS:
        escaped = f"{escaped[:CODE_CHARS]}... ({len(escaped) - CODE_CHARS:,} more)"
    return f"`{escaped}`" if escaped.strip() else "`(empty)`"


def _codes(texts: object) -> str:
    return ", ".join(code(t) for t in texts)  # type: ignore[attr-defined]


def front_matter(facts: CardFacts) -> str:
    tags = "".join(f"- {t}\n" for t in TAGS)
    return (
        f"---\nbase_model: {_yaml_str(facts.base_model)}\n"
        f"library_name: {LIBRARY[facts.fmt]}\ntags:\n{tags}---\n"
    )


def _count(n: int | None) -> str:
    return UNKNOWN if n is None else f"{n:,}"


def _data_lines(facts: CardFacts) -> list[str]:
    if facts.data is None:
        return [
            "Unknown: exported from a checkpoint, not a training run, so no record of "
            "the training data was at hand."
        ]
    if not facts.data:
        return ["Unknown: the run records no datasets (run.json has no `data`)."]
    out = []
    for ds in facts.data:
        out += _dataset_lines(ds, "- ")
    return out


def _dataset_lines(ds: DataSource, bullet: str) -> list[str]:
    pad = " " * len(bullet)
    weight = f", weight {ds.weight:g}" if ds.weight not in (None, 1, 1.0) else ""
    kind = ds.kind if ds.kind in ("tokens", "hidden") else f"{code(ds.kind)}"
    head = (
        f"{bullet}{code(ds.path)}: {kind} dataset, {_count(ds.samples)} samples, "
        f"{_count(ds.tokens)} tokens{weight}"
    )
    if ds.counted_by != "manifest":
        return [
            head + f" ({ds.counted_by} counts; the dataset is not reachable here, so "
            f"its prompts, server and sampling are unknown)"
        ]
    lines = [head]
    origin = ds.origin
    if ds.kind == "hidden":
        lines.append(
            f"{pad}hidden states by {code(origin.engine) if origin.engine else UNKNOWN}"
            + (f" from {_codes(origin.servers)}" if origin.servers else "")
        )
        if ds.source is not None:
            lines += _dataset_lines(ds.source, pad + "- extracted from ")
        else:
            lines.append(f"{pad}- extracted from: {UNKNOWN} (not recorded)")
        return lines
    prompts = [code(p) for p in origin.prompts] + (
        [f"dataset {code(origin.prompt_dataset)}"] if origin.prompt_dataset else []
    )
    sampling = ", ".join(code(f"{k}={v}") for k, v in origin.sampling.items())
    lines += [
        f"{pad}prompts: {', '.join(prompts) or UNKNOWN}",
        f"{pad}generated by: {_codes(origin.servers) or UNKNOWN}"
        + (f" ({code(origin.engine)})" if origin.engine else "")
        + (f", serving {code(origin.served_model)}" if origin.served_model else ""),
        f"{pad}sampling: {sampling or UNKNOWN}",
    ]
    return lines


NO_PREDICTION = "Unknown: the drafter records no held-out evaluation."


def prediction_line(prediction: object) -> str:
    """The held-out prediction as the card and `info` give it, from the drafter's own
    record (checked_prediction), else NO_PREDICTION."""
    checked = checked_prediction(prediction)
    if checked is None:
        return NO_PREDICTION
    return f"{checked['predicted_acceptance_length']:.3f} (chain, k={checked['k']})"


def _prediction_lines(prediction: dict | None) -> list[str]:
    checked = checked_prediction(prediction)
    if checked is None:
        return [NO_PREDICTION]
    rates = checked["per_position"]
    return [
        f"- predicted acceptance length: {prediction_line(checked)}",
        f"- per-position acceptance: {', '.join(f'{r:.3f}' for r in rates)}",
    ]


def _fence(block: str) -> str:
    """A code fence longer than any run of backticks in `block` (a recorded target name is
    quoted for the shell, not for Markdown): nothing in it closes the block."""
    longest = max((len(run) for run in re.findall("`+", block)), default=0)
    return "`" * max(3, longest + 1)


def card_text(facts: CardFacts) -> str:
    d = facts.drafter
    ids = list(d.aux_layer_ids)
    coverage = (
        "" if facts.coverage is None else f", covering {facts.coverage:.1%} of the training tokens"
    )
    launches = "\n".join(
        f"{what}:\n\n{_fence(line)}bash\n{line}\n{_fence(line)}\n"
        for what, line in launch_lines(
            facts.fmt,
            facts.where,
            facts.base_model,
            facts.speculative_tokens,
            facts.sibling,
            d.sliding_window,
        )
    )
    other = (
        ""
        if facts.fmt == "sglang" or facts.sibling
        else "\nSGLang reads its own layout: `eagle3kit export` with `--format sglang` writes it.\n"
    )
    lines = [
        front_matter(facts),
        f"# EAGLE-3 drafter for {code(facts.base_model)}",
        "",
        f"An EAGLE-3 draft model for speculative decoding with {code(facts.base_model)}, in the "
        f"{'speculators (vLLM)' if facts.fmt == 'vllm' else 'SGLang / SpecForge'} layout, "
        f"exported with eagle3kit.",
        "",
        "## The drafter",
        "",
        f"- decoder layers: {d.num_hidden_layers}, hidden size {d.hidden_size}, intermediate "
        f"size {d.intermediate_size}, {d.num_attention_heads} attention heads "
        f"({d.num_key_value_heads} key/value), weights in {facts.dtype}",
        f"- aux layer ids: {ids} (boundary, vLLM's) / {to_layer_output(ids)} (layer-output, "
        f"SGLang's)",
        f"- draft vocabulary: {d.draft_vocab_size:,} of {d.vocab_size:,} target ids{coverage}",
        "- attention: "
        + (
            f"a sliding window of {d.sliding_window:,} positions"
            if d.sliding_window
            else "every earlier position"
        ),
        f"- drafts per step: {facts.speculative_tokens}",
        "",
        "## Training data",
        "",
        *_data_lines(facts),
        "",
        "## Held-out prediction",
        "",
        *_prediction_lines(facts.prediction),
        "",
        "## Serving",
        "",
        f"{code(facts.where)} is where `eagle3kit export` wrote the drafter; once uploaded, "
        "give its Hub id there instead.",
        "",
        launches + other,
    ]
    return "\n".join(lines)


def write_card(directory: Path, facts: CardFacts) -> None:
    (directory / CARD).write_text(card_text(facts))


# Reading back --------------------------------------------------------------------------------
def read_card(directory: Path) -> dict | None:
    """The card's front matter (base_model, library_name, tags) and its key lines (draft
    vocabulary, training data), for `info`; None when there is no card eagle3kit wrote.
    Only eagle3kit's own lines are read: each section by the first heading of its name, in
    the order export writes them, and within it the first line of each kind export writes;
    nothing after `## Serving`. The held-out prediction is not read from the card but from
    the drafter's own record (`prediction_line`)."""
    try:
        with open(Path(directory) / CARD, "rb") as f:
            text = f.read(CARD_BYTES + 1).decode()
    except (OSError, UnicodeDecodeError):
        return None
    head, sep, body = text.removeprefix("---\n").partition("\n---\n")
    if not text.startswith("---\n") or not sep or len(text) > CARD_BYTES:
        return None
    facts: dict[str, Any] = {"tags": []}
    for line in head.splitlines():
        if line.startswith("- "):
            facts["tags"].append(line[2:])
        elif line.startswith("base_model: "):
            try:
                facts["base_model"] = json.loads(line.removeprefix("base_model: "))
            except ValueError:
                return None
        elif line.startswith("library_name: ") and line[14:] in LIBRARY.values():
            facts["library_name"] = line[14:]
    if "eagle3kit" not in facts["tags"] or not isinstance(facts.get("base_model"), str):
        return None
    sections = iter(SECTIONS)
    section, expected = "", next(sections)
    for line in body.splitlines():
        if line == f"## {expected}":
            section, expected = expected, next(sections, "")
            if section == "Serving":
                break
        elif section == "The drafter" and line.startswith("- draft vocabulary: "):
            facts.setdefault("draft vocab", line.removeprefix("- draft vocabulary: "))
        elif section == "Training data" and line.startswith(("- `", "Unknown: ")):
            facts.setdefault("training data", []).append(line.removeprefix("- "))
    return facts

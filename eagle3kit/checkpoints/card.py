"""The model card `eagle3kit export` writes beside each exported drafter (README.md).

Hugging Face's model-card form: a YAML front matter (`base_model`, `library_name`, `tags`)
the Hub reads, then what a person deciding whether to serve the drafter needs: its shape, the
aux layer ids and draft vocabulary, the data it was trained on and where that came from
(prompts, servers, sampling: read from the datasets' manifests, else from what train recorded
in run.json), the held-out prediction, any `bench` reports saved in the run, and the exact
launch lines. Whatever is not known is said to be unknown, never left out silently.

`launch_lines` is the one place the code writes vLLM and SGLang launch lines; `read_card`
gives `eagle3kit info` the card's key facts back. Importing this module loads no torch.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle3kit.target import to_layer_output

CARD = "README.md"
TAGS = ("eagle3", "speculative-decoding", "eagle3kit")
LIBRARY = {"vllm": "speculators", "sglang": "sglang"}
"""The library whose layout each export is: speculators (served by vLLM), SGLang's."""
BENCH_GLOB = "bench*.json"
"""`bench accept|server --json` reports saved in the run directory are shown on the card."""
UNKNOWN = "unknown"


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
    bench: list[tuple[str, dict]] = field(default_factory=list)
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


def trace(path: str, kind: str = UNKNOWN, samples: int | None = None,
          tokens: int | None = None, weight: float | None = None) -> DataSource:
    """The dataset at `path` and, for hidden states, the token dataset behind it; the counts
    given (what train recorded) stand where the dataset cannot be read now."""
    ds = _open(path)
    if ds is None:
        return DataSource(path, kind, samples, tokens, "run.json", weight)
    origin = ds.origin()
    source = trace(origin.tokens, "tokens") if origin.tokens else None
    return DataSource(path, ds.kind, len(ds), ds.num_tokens, "manifest", weight, origin, source)


def training_data(run: dict) -> list[DataSource]:
    """The datasets run.json says the drafter trained on."""
    entries = run.get("data")
    out = []
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("path"), str):
            out.append(trace(entry["path"], str(entry.get("kind") or UNKNOWN),
                             entry.get("samples"), entry.get("tokens"), entry.get("weight")))
    return out


def bench_reports(run_dir: Path) -> list[tuple[str, dict]]:
    """(file name, report) for each bench report (`--json` output) saved in the run."""
    found = []
    for path in sorted(run_dir.glob(BENCH_GLOB)):
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(report, dict) and "acceptance_length" in report:
            found.append((path.name, report))
    return found


# Launch lines --------------------------------------------------------------------------------
def launch_lines(fmt: str, where: str, base_model: str, k: int,
                 sglang_dir: str | None = None,
                 window: int | None = None) -> list[tuple[str, str]]:
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
        lines.append(("vLLM, the draft directory alone (it names the target)",
                      f"vllm serve {shlex.quote(where)}"))
    lines.append(("vLLM, the target with the draft named",
                  f"vllm serve {shlex.quote(base_model)} --speculative-config "
                  f"{shlex.quote(spec)}"))
    sglang_dir = where if fmt == "sglang" else sglang_dir
    if sglang_dir is not None:
        lines.append(("SGLang", f"python -m sglang.launch_server --model-path "
                                f"{shlex.quote(base_model)} --speculative-algorithm EAGLE3 "
                                f"--speculative-draft-model-path {shlex.quote(sglang_dir)} "
                                f"--speculative-num-steps {k} --speculative-eagle-topk 1 "
                                f"--speculative-num-draft-tokens {k + 1}"
                                + (f" --speculative-draft-window-size {window - 1}"
                                   if window else "")))
    return lines


# Writing ------------------------------------------------------------------------------------
def _yaml_str(text: str) -> str:
    """A YAML scalar: JSON's double-quoted string is valid YAML."""
    return json.dumps(text)


def front_matter(facts: CardFacts) -> str:
    tags = "".join(f"- {t}\n" for t in TAGS)
    return (f"---\nbase_model: {_yaml_str(facts.base_model)}\n"
            f"library_name: {LIBRARY[facts.fmt]}\ntags:\n{tags}---\n")


def _count(n: int | None) -> str:
    return UNKNOWN if n is None else f"{n:,}"


def _data_lines(facts: CardFacts) -> list[str]:
    if facts.data is None:
        return ["Unknown: exported from a checkpoint, not a training run, so no record of "
                "the training data was at hand."]
    if not facts.data:
        return ["Unknown: the run records no datasets (run.json has no `data`)."]
    out = []
    for ds in facts.data:
        out += _dataset_lines(ds, "- ")
    return out


def _dataset_lines(ds: DataSource, bullet: str) -> list[str]:
    pad = " " * len(bullet)
    weight = f", weight {ds.weight:g}" if ds.weight not in (None, 1, 1.0) else ""
    head = (f"{bullet}`{ds.path}`: {ds.kind} dataset, {_count(ds.samples)} samples, "
            f"{_count(ds.tokens)} tokens{weight}")
    if ds.counted_by != "manifest":
        return [head + f" ({ds.counted_by} counts; the dataset is not reachable here, so "
                       f"its prompts, server and sampling are unknown)"]
    lines = [head]
    origin = ds.origin
    if ds.kind == "hidden":
        lines.append(f"{pad}hidden states by {origin.engine or UNKNOWN}"
                     + (f" from {', '.join(origin.servers)}" if origin.servers else ""))
        if ds.source is not None:
            lines += _dataset_lines(ds.source, pad + "- extracted from ")
        else:
            lines.append(f"{pad}- extracted from: {UNKNOWN} (not recorded)")
        return lines
    prompts = list(origin.prompts) + ([f"dataset {origin.prompt_dataset}"]
                                      if origin.prompt_dataset else [])
    sampling = ", ".join(f"{k}={v}" for k, v in origin.sampling.items())
    lines += [f"{pad}prompts: {', '.join(prompts) or UNKNOWN}",
              f"{pad}generated by: {', '.join(origin.servers) or UNKNOWN}"
              + (f" ({origin.engine})" if origin.engine else "")
              + (f", serving {origin.served_model}" if origin.served_model else ""),
              f"{pad}sampling: {sampling or UNKNOWN}"]
    return lines


def _prediction_lines(prediction: dict | None) -> list[str]:
    if not prediction or prediction.get("predicted_acceptance_length") is None:
        return ["Unknown: the drafter records no held-out evaluation."]
    rates = prediction.get("per_position") or []
    return [f"- predicted acceptance length: {prediction['predicted_acceptance_length']:.3f}"
            f" (chain, k={prediction.get('k', len(rates))})",
            f"- per-position acceptance: {', '.join(f'{r:.3f}' for r in rates) or UNKNOWN}"]


def _bench_lines(bench: list[tuple[str, dict]]) -> list[str]:
    if not bench:
        return [f"None found (save `eagle3kit bench accept|server --json` reports in the run "
                f"directory as `{BENCH_GLOB}` to have them here)."]
    out = []
    for name, report in bench:
        length = report.get("acceptance_length")
        speedup = report.get("speedup")
        out.append(f"- `{name}`: acceptance length "
                   f"{UNKNOWN if length is None else f'{length:.3f}'}, "
                   f"{report.get('shape') or UNKNOWN}"
                   + (f", speedup {speedup:.2f}x" if isinstance(speedup, (int, float)) else ""))
    return out


def card_text(facts: CardFacts) -> str:
    d = facts.drafter
    ids = list(d.aux_layer_ids)
    coverage = ("" if facts.coverage is None
                else f", covering {facts.coverage:.1%} of the training tokens")
    launches = "\n".join(f"{what}:\n\n```bash\n{line}\n```\n"
                         for what, line in launch_lines(facts.fmt, facts.where,
                                                        facts.base_model,
                                                        facts.speculative_tokens,
                                                        facts.sibling, d.sliding_window))
    other = ("" if facts.fmt == "sglang" or facts.sibling else
             "\nSGLang reads its own layout: `eagle3kit export` with `--format sglang` "
             "writes it.\n")
    lines = [
        front_matter(facts),
        f"# EAGLE-3 drafter for {facts.base_model}",
        "",
        f"An EAGLE-3 draft model for speculative decoding with `{facts.base_model}`, in the "
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
        "- attention: " + (f"a sliding window of {d.sliding_window:,} positions"
                            if d.sliding_window else "every earlier position"),
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
        "## Benchmarks",
        "",
        *_bench_lines(facts.bench),
        "",
        "## Serving",
        "",
        f"`{facts.where}` is where `eagle3kit export` wrote the drafter; once uploaded, give "
        "its Hub id there instead.",
        "",
        launches + other,
    ]
    return "\n".join(lines)


def write_card(directory: Path, facts: CardFacts) -> None:
    (directory / CARD).write_text(card_text(facts))


# Reading back --------------------------------------------------------------------------------
def read_card(directory: Path) -> dict | None:
    """The card's front matter (base_model, library_name, tags) and its key lines (aux layer
    ids, draft vocabulary, predicted acceptance length, training data), for `info`; None when
    there is no card eagle3kit wrote."""
    try:
        text = (Path(directory) / CARD).read_text()
    except (OSError, UnicodeDecodeError):
        return None
    head, sep, body = text.removeprefix("---\n").partition("\n---\n")
    if not text.startswith("---\n") or not sep or "eagle3kit" not in body:
        return None
    facts: dict[str, Any] = {"tags": []}
    for line in head.splitlines():
        if line.startswith("- "):
            facts["tags"].append(line[2:])
        elif ": " in line:
            key, value = line.split(": ", 1)
            facts[key] = json.loads(value) if value.startswith('"') else value
    section = ""
    for line in body.splitlines():
        if line.startswith("## "):
            section = line[3:]
        elif section == "The drafter" and line.startswith("- draft vocabulary: "):
            facts["draft vocab"] = line.removeprefix("- draft vocabulary: ")
        elif section == "Training data" and line.startswith("- "):
            facts.setdefault("training data", []).append(line[2:])
        elif section == "Training data" and line.startswith("Unknown"):
            facts["training data"] = [line]
        elif section == "Held-out prediction" and line.startswith(("- predicted", "Unknown")):
            facts["held-out prediction"] = line.removeprefix("- predicted acceptance length: ")
    return facts

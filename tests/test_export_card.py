"""The model card `eagle3kit export` writes beside each export (README.md), what `eagle3kit
info` shows of it, and info's warning on a speculators checkpoint without `embed_tokens`.

A real run: token samples written with the manifest gen writes (prompts, server, sampling),
real `extract` to hidden states, real `train` with a held-out split; then the `eagle3kit`
command exports and inspects it in subprocesses."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
from pathlib import Path

import prewarmed
import pytest
import yaml
from launch_blocks import parse

from eagle3kit._options import WRITE_KEYS, WriteOptions
from eagle3kit._ui import OutputOptions
from eagle3kit.format import Dataset, DatasetWriter, TokenSample

pytestmark = pytest.mark.usefixtures("one_torch_thread")

REPO = Path(__file__).resolve().parent.parent
QUIET = OutputOptions(quiet=True)
PROMPTS = "prompts/chat.jsonl"
SERVER = "http://127.0.0.1:30000"
SAMPLING = {"temperature": 0.6, "top_p": 0.95, "max_tokens": 64}
_spec = importlib.util.spec_from_file_location(
    "make_tiny_run", REPO / "examples" / "make_tiny_run.py"
)
make_tiny_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_tiny_run)


def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE3KIT_")}
    out.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    return out


def eagle3kit(*args: object, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*prewarmed.argv(), *map(str, args)],
        cwd=cwd,
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Path]:
    from transformers import AutoTokenizer

    from eagle3kit import extract as stage
    from eagle3kit.tiny import make_target, make_tokenizer, stdlib_docstrings
    from eagle3kit.train import TrainConfig
    from eagle3kit.train import run as train

    root = tmp_path_factory.mktemp("card")
    docs = stdlib_docstrings(40_000)
    make_tokenizer(root / "tok", vocab_size=400, corpus=docs)
    target = make_target(root / "target", root / "tok", hidden_size=32, seed=1)
    tok = AutoTokenizer.from_pretrained(str(target))
    seqs = [s for s in (tok(d)["input_ids"][:48] for d in docs[:40]) if len(s) >= 12]
    tokens = root / "tokens"
    with DatasetWriter(
        tokens,
        config={"stage": "gen", "model": "tiny", **SAMPLING},
        provenance={"prompts": [PROMPTS], "servers": [SERVER], "engine": "sglang"},
    ) as w:
        for i, ids in enumerate(seqs):
            w.add(TokenSample(f"s{i}", ids[:4], ids[4:]))
    hidden = root / "hidden"
    stage.run(stage.ExtractConfig(tokens, hidden, target=target, device="cpu", output=QUIET))
    options = dict(
        max_steps=4,
        batch_tokens=256,
        draft_vocab=200,
        eval_split=4,
        eval_every=2,
        checkpoint_every=2,
        lr=3e-3,
        warmup=1,
        device="cpu",
        output=QUIET,
    )
    options["write"] = WriteOptions(**{k: options.pop(k) for k in WRITE_KEYS if k in options})
    train(TrainConfig([hidden], root / "run", target, **options))
    (root / "run" / "bench-accept.json").write_text(
        json.dumps({"acceptance_length": 2.345, "shape": "chain k=3", "speedup": 1.5})
    )
    return {"root": root, "target": target, "tokens": tokens, "hidden": hidden, "run": root / "run"}


def front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    head = card[4 : card.index("\n---\n", 4)]
    return yaml.safe_load(head)


def launch_lines(card: str) -> list:
    body = card.split("## Serving", 1)[1]
    return [
        parse(i, block.split("\n", 1)[1].split("\n```", 1)[0])
        for i, block in enumerate(body.split("```bash")[1:])
    ]


def test_each_export_carries_a_card_of_what_it_is_and_where_it_came_from(trained):
    root, run = trained["root"], trained["run"]
    proc = eagle3kit("export", run, "out", "--format", "both", "--quiet", cwd=root)
    assert proc.returncode == 0, proc.stderr
    recorded = json.loads((run / "run.json").read_text())["target"]
    base_model = recorded.get("name_or_path") or recorded["path"]
    prediction = json.loads((run / "drafter" / "config.json").read_text())["eagle3kit"]["eval"]
    hidden, tokens = (Dataset(trained[k], kind=None) for k in ("hidden", "tokens"))
    for fmt, library in (("vllm", "speculators"), ("sglang", "sglang")):
        card = (root / "out" / fmt / "README.md").read_text()
        config = json.loads((root / "out" / fmt / "config.json").read_text())
        meta = front_matter(card)
        assert meta["base_model"] == base_model and meta["library_name"] == library
        assert {"eagle3", "speculative-decoding"} <= set(meta["tags"])
        ids = (
            config["eagle_aux_hidden_state_layer_ids"]
            if fmt == "vllm"
            else [i + 1 for i in config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]
        )
        assert f"- aux layer ids: {ids} (boundary" in card
        assert f"- draft vocabulary: {config['draft_vocab_size']:,} of " in card
        # The data's provenance, counted by the datasets' own manifests.
        assert (
            f"`{trained['hidden']}`: hidden dataset, {len(hidden):,} samples, "
            f"{hidden.num_tokens:,} tokens"
        ) in card
        assert (
            f"extracted from `{trained['tokens']}`: tokens dataset, {len(tokens):,} "
            f"samples, {tokens.num_tokens:,} tokens"
        ) in card
        assert f"prompts: `{PROMPTS}`" in card
        assert f"generated by: `{SERVER}` (`sglang`), serving `tiny`" in card
        assert "sampling: `temperature=0.6`, `top_p=0.95`, `max_tokens=64`" in card
        assert (
            f"predicted acceptance length: {prediction['predicted_acceptance_length']:.3f}" in card
        )
        assert "2.345" not in card  # a bench report saved in the run is not eagle3kit's record
    vllm_lines = launch_lines((root / "out" / "vllm" / "README.md").read_text())
    assert vllm_lines[0].model == "out/vllm" and not vllm_lines[0].flags  # the short form
    spec = json.loads(vllm_lines[1].get("--speculative-config"))
    assert vllm_lines[1].model == base_model
    assert spec == {"method": "eagle3", "model": "out/vllm", "num_speculative_tokens": 3}
    sglang = [x for x in vllm_lines if x.server == "sglang"]
    assert [x.get("--speculative-draft-model-path") for x in sglang] == ["out/sglang"]
    sglang_lines = launch_lines((root / "out" / "sglang" / "README.md").read_text())
    assert [x.server for x in sglang_lines] == ["vllm", "sglang"]
    assert sglang_lines[1].model == base_model
    assert sglang_lines[1].get("--speculative-algorithm") == "EAGLE3"
    assert sglang_lines[1].get("--speculative-draft-model-path") == "out/sglang"
    assert sglang_lines[1].get("--speculative-num-draft-tokens") == "4"

    proc = eagle3kit("info", "out", cwd=root)
    assert proc.returncode == 0, proc.stderr
    for fmt in ("vllm", "sglang"):
        shown = proc.stderr.split(f"out/{fmt}/README.md\n", 1)[1]
        assert f"base_model           {base_model}" in shown
        assert "tags                 eagle3, speculative-decoding, eagle3kit" in shown
        assert f"held-out prediction  {prediction['predicted_acceptance_length']:.3f}" in shown
        assert f"training data        `{trained['hidden']}`: hidden dataset" in shown
    proc = eagle3kit("info", "out", "--json", cwd=root)
    cards = [c["card"] for c in json.loads(proc.stdout)["checkpoints"]]
    assert [c["base_model"] for c in cards] == [base_model] * 2


def test_a_card_says_what_it_does_not_know(trained, tmp_path):
    """Datasets moved away: the counts train recorded, and their origin unknown; a run that
    records no data and no evaluation says so."""
    run = tmp_path / "run"
    shutil.copytree(trained["run"], run)
    record = json.loads((run / "run.json").read_text())
    gone = str(tmp_path / "moved-away")
    data = record["data"][0]
    record["data"][0]["path"] = gone
    (run / "run.json").write_text(json.dumps(record))
    (run / "bench-accept.json").unlink()
    assert eagle3kit("export", run, "out", "--quiet", cwd=tmp_path).returncode == 0
    card = (tmp_path / "out" / "README.md").read_text()
    assert (
        f"`{gone}`: hidden dataset, {data['samples']:,} samples, {data['tokens']:,} tokens "
        f"(run.json counts; the dataset is not reachable here, so its prompts, server and "
        f"sampling are unknown)"
    ) in card

    make_tiny_run.make_target(tmp_path / "target")
    make_tiny_run.make_run(tmp_path / "bare", tmp_path / "target", [2, 4, 5])
    assert eagle3kit("export", "bare", "bare-out", "--quiet", cwd=tmp_path).returncode == 0
    card = (tmp_path / "bare-out" / "README.md").read_text()
    assert front_matter(card)["base_model"] == str(tmp_path / "target")
    assert "## Training data\n\nUnknown: the run records no datasets" in card
    assert "## Held-out prediction\n\nUnknown: the drafter records no held-out evaluation" in card
    # Not a run: a checkpoint has no record of its data.
    assert (
        eagle3kit(
            "export", "bare-out", "again", "--format", "sglang", "--quiet", cwd=tmp_path
        ).returncode
        == 0
    )
    card = (tmp_path / "again" / "README.md").read_text()
    assert "Unknown: exported from a checkpoint, not a training run" in card


def test_info_warns_on_a_speculators_checkpoint_without_its_embedding(tmp_path):
    make_tiny_run.make_target(tmp_path / "target")
    make_tiny_run.make_run(tmp_path / "run", tmp_path / "target", [2, 4, 5])
    for args in (("plain", "--format", "both"), ("emb", "--with-embedding")):
        assert eagle3kit("export", "run", *args, "--quiet", cwd=tmp_path).returncode == 0
    plain = eagle3kit("info", "plain", "--quiet", cwd=tmp_path)
    assert plain.returncode == 0  # a warning: vLLM serves it correctly
    warnings = [line for line in plain.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: plain/vllm: no embed_tokens: vLLM takes the target's embedding, but "
        "speculators' own Eagle3DraftModel.from_pretrained then starts from a random one, so "
        "the drafter evaluated or trained further with speculators is not this one; "
        "`eagle3kit export --with-embedding` adds the target's embedding"
    ]  # none for sglang
    with_embedding = eagle3kit("info", "emb", "--quiet", cwd=tmp_path)
    assert with_embedding.returncode == 0 and with_embedding.stderr == ""


# Recorded strings and planted files (issue 38, item 6) ----------------------------------------
FORGED = "\n\n## Held-out prediction\n\n- predicted acceptance length: 9.999 (chain, k=3)\n\n"
PIXEL = '<img src="https://tracker.example/pixel.png">'
LINK = "[weights here](https://weights.example/drafter)"
SHAPE = "chain k=3" + FORGED + PIXEL + "\n" + LINK


def rendered(card: str) -> tuple[list[str], list[str], list[str]]:
    """The card as CommonMark renders it: its headings, the kinds of inline token other than
    text and code, and the text that is neither code nor a fenced block."""
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("commonmark").parse(card)
    headings = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open"]
    kinds, plain = [], []
    for token in tokens:
        if token.type == "html_block":
            kinds.append("html_block")
        for child in token.children or []:
            if child.type not in ("text", "code_inline", "softbreak"):
                kinds.append(child.type)
            if child.type == "text":
                plain.append(child.content)
    return headings, kinds, plain


def assert_only_its_own_markdown(card: str) -> None:
    headings, kinds, plain = rendered(card)
    assert headings[1:] == ["The drafter", "Training data", "Held-out prediction", "Serving"]
    assert kinds == []  # no image, link, HTML or hard break of a record's making
    assert not [t for t in plain if "9.999" in t or "example" in t], plain
    assert "\n## Held-out prediction\n\n- predicted acceptance length: 9.999" not in card


def test_recorded_strings_go_in_as_code_and_planted_figures_not_at_all(trained, tmp_path):
    """A manifest whose prompt source, servers, served model and sampling hold a second
    held-out heading (9.999), a remote image and a link; a run.json whose dataset path and
    counts do; a planted bench*.json saying 9.999: exported for real, the card shows the
    strings as inline code and none of them as Markdown, and `info` reports the drafter's
    own evaluation (and none for a drafter never evaluated)."""
    crafted = tmp_path / "crafted-tokens"
    with DatasetWriter(
        crafted,
        config={"stage": "gen", "model": LINK, "temperature": FORGED, "top_p": PIXEL},
        provenance={
            "prompts": ["p.jsonl" + FORGED],
            "dataset": LINK,
            "servers": [PIXEL, "http://a`b"],
            "engine": FORGED,
        },
    ) as w:
        for i in range(4):
            w.add(TokenSample(f"s{i}", [1, 2, 3, 4], [5, 6, 7 + i]))
    run = tmp_path / "run"
    shutil.copytree(trained["run"], run)
    record = json.loads((run / "run.json").read_text())
    record["data"] = [
        {"path": str(crafted), "kind": "tokens"},
        {
            "path": str(tmp_path / ("gone" + FORGED + PIXEL)),
            "kind": LINK,
            "samples": "9.999",
            "tokens": FORGED,
            "weight": "x",
        },
    ]
    (run / "run.json").write_text(json.dumps(record))
    (run / "bench-accept.json").write_text(
        json.dumps({"acceptance_length": 9.999, "shape": SHAPE, "speedup": 9.999})
    )
    proc = eagle3kit("export", run, "out", "--quiet", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    card = (tmp_path / "out" / "README.md").read_text()
    assert_only_its_own_markdown(card)
    assert "bench-accept.json" not in card and "speedup" not in card  # not the card's figures
    prediction = json.loads((run / "drafter" / "config.json").read_text())["eagle3kit"]["eval"]
    assert f"- predicted acceptance length: {prediction['predicted_acceptance_length']:.3f}" in card
    assert "prompts: `p.jsonl\\n\\n## Held-out prediction\\n\\n- predicted" in card
    assert 'generated by: `\\u003cimg src=\\"https:' not in card  # < is not escaped: code
    assert (
        'generated by: `<img src=\\"https://tracker.example/pixel.png\\">`, '
        "`http://a\\u0060b`" in card
    )
    assert f"serving `{LINK}`" in card
    assert front_matter(card)["base_model"]  # the YAML still parses

    shown = eagle3kit("info", "out", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert [
        line.strip()
        for line in shown.stderr.splitlines()
        if line.strip().startswith("held-out prediction")
    ] == [f"held-out prediction  {prediction['predicted_acceptance_length']:.3f} (chain, k=3)"]

    # A drafter never evaluated, with the planted report beside it.
    make_tiny_run.make_target(tmp_path / "target")
    make_tiny_run.make_run(tmp_path / "bare", tmp_path / "target", [2, 4, 5])
    shutil.copy(run / "bench-accept.json", tmp_path / "bare")
    assert eagle3kit("export", "bare", "bare-out", "--quiet", cwd=tmp_path).returncode == 0
    assert "9.999" not in (tmp_path / "bare-out" / "README.md").read_text()
    shown = eagle3kit("info", "bare-out", "--json", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    (checkpoint,) = json.loads(shown.stdout)["checkpoints"]
    assert checkpoint["card"]["held-out prediction"] == (
        "Unknown: the drafter records no held-out evaluation."
    )


def test_info_reads_only_the_cards_own_lines_and_the_drafters_own_figure(tmp_path):
    """A card edited after export (a second held-out heading saying 9.999 first in the
    file's order after ours, a remote image) and a drafter record whose rates do not give its
    length: info shows neither figure."""
    make_tiny_run.make_target(tmp_path / "target")
    make_tiny_run.make_run(tmp_path / "run", tmp_path / "target", [2, 4, 5])
    assert eagle3kit("export", "run", "out", "--quiet", cwd=tmp_path).returncode == 0
    card = tmp_path / "out" / "README.md"
    text = card.read_text().replace("## Training data", f"{FORGED}{PIXEL}\n\n## Training data")
    card.write_text(text + FORGED)
    shown = eagle3kit("info", "out", "--json", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    (checkpoint,) = json.loads(shown.stdout)["checkpoints"]
    assert checkpoint["card"]["held-out prediction"].startswith("Unknown")
    assert checkpoint["card"]["training data"] == [
        "Unknown: the run records no datasets (run.json has no `data`)."
    ]

    provenance = tmp_path / "out" / "eagle3kit-export.json"
    record = json.loads(provenance.read_text())
    record["eval"] = {"predicted_acceptance_length": 9.999, "per_position": [0.5, 0.5, 0.5]}
    provenance.write_text(json.dumps(record))
    shown = eagle3kit("info", "out", cwd=tmp_path)
    assert "9.999" not in shown.stderr
    assert "held-out prediction  Unknown" in shown.stderr
    record["eval"] = {"predicted_acceptance_length": 1.875, "per_position": [0.5, 0.5, 0.5]}
    provenance.write_text(json.dumps(record))
    shown = eagle3kit("info", "out", cwd=tmp_path)
    assert "held-out prediction  1.875 (chain, k=3)" in shown.stderr

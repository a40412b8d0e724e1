"""`eagle3kit convert` between hidden-state datasets and speculators' / SpecForge's files.

A tiny Llama target and a token dataset are extracted once per module; the dataset is exported
to both tools' layouts, checked against what their source reads (speculators:
src/speculators/train/data.py ArrowDataset._get_raw_data; SpecForge:
specforge/data/preprocessing.py OfflineEagle3Dataset.process_data), and imported back. The
last state's form is checked numerically: SpecForge's `hidden_state` equals the target's final
RMSNorm (computed here from its config and weights) of the pre-norm state, and a dataset
imported from SpecForge gives train the same lm_head input as the original.
"""

from __future__ import annotations

import gzip
import io
import json
import pickle
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import prewarmed
import pytest
import torch

from eagle3kit import convert, extract
from eagle3kit._ui import OutputOptions
from eagle3kit.checkpoints.tensors import BadFile, load_tensor_file
from eagle3kit.convert.hidden import SF_KEYS, SIDECAR
from eagle3kit.errors import UserError
from eagle3kit.format import DatasetWriter, HiddenDataset, TokenSample
from eagle3kit.tiny import make_target, make_tokenizer

QUIET = OutputOptions(quiet=True)
N_SAMPLES = 6
LAYERS = [2, 4, 5]  # EAGLE-3's defaults for 8 layers


@dataclass
class World:
    root: Path
    target: Path
    tokens: Path
    hidden: Path
    speculators: Path
    specforge: Path


def conv(src: Path, dst: Path, **options) -> convert.ConvertResult:
    options.setdefault("output", QUIET)
    return convert.run(convert.ConvertConfig(src, dst, **options))


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # shared 2-core machines: threads only spin against each other
    root = tmp_path_factory.mktemp("hidden-convert")
    target = make_target(root / "target", make_tokenizer(root / "tokenizer"))
    rng = np.random.default_rng(0)
    with DatasetWriter(root / "tokens", config={"stage": "test"}) as writer:
        for i in range(N_SAMPLES):
            n = int(rng.integers(4, 20))
            ids = rng.integers(0, 1000, n).tolist()
            writer.add(TokenSample(f"s{i}", ids[:2], ids[2:], partition=("a", "b")[i % 2]))
    hidden = root / "hidden"
    extract.run(extract.ExtractConfig(root / "tokens", hidden, target=target, output=QUIET))
    w = World(root, target, root / "tokens", hidden, root / "sp", root / "sf")
    conv(hidden, w.speculators, to="speculators")
    conv(hidden, w.specforge, to="specforge", target=target)
    yield w
    torch.set_num_threads(threads)


def final_norm(target: Path, x: torch.Tensor) -> torch.Tensor:
    """Llama's RMSNorm written out from the config and the weights, independent of eagle3kit."""
    from safetensors.torch import load_file

    eps = json.loads((target / "config.json").read_text())["rms_norm_eps"]
    weight = load_file(str(target / "model.safetensors"))["model.norm.weight"].float()
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def bf16(x: np.ndarray | torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x, np.float32)).to(torch.bfloat16)


# The tools' layouts -----------------------------------------------------------------------
def test_speculators_layout_is_what_its_loader_reads(world: World) -> None:
    import datasets
    from safetensors.torch import load_file

    ds = HiddenDataset(world.hidden)
    assert ds.layer_ids == LAYERS and ds.last_state == "pre_norm"
    files = sorted(p.name for p in (world.speculators / "hidden_states").iterdir())
    assert files == sorted(f"hs_{i}.safetensors" for i in range(N_SAMPLES))
    data = datasets.load_from_disk(str(world.speculators))
    assert set(data.column_names) == {"input_ids", "loss_mask", "seq_len"}
    assert data.format["type"] == "torch" and len(data) == N_SAMPLES
    for i in range(N_SAMPLES):
        s, row = ds[i], data[i]
        hs = load_file(str(world.speculators / "hidden_states" / f"hs_{i}.safetensors"))
        assert set(hs) == {"hidden_states", "token_ids"}
        n, h = s.num_tokens, ds.hidden_size
        assert hs["hidden_states"].dtype == torch.bfloat16
        assert hs["hidden_states"].shape == (n, len(LAYERS) + 1, h)
        assert hs["token_ids"].dtype == torch.int64
        # What speculators' ArrowDataset._get_raw_data makes of them.
        assert torch.equal(hs["token_ids"], row["input_ids"])
        assert torch.equal(hs["hidden_states"][:, :-1].flatten(1), bf16(s.aux))
        assert torch.equal(hs["hidden_states"][:, -1], bf16(s.last))  # pre-norm: verifier_norm's
        assert row["loss_mask"].dtype == torch.int64
        assert row["loss_mask"].tolist() == s.loss_mask.tolist()
        assert int(row["seq_len"]) == n


def test_specforge_layout_holds_the_post_norm_state(world: World) -> None:
    ds = HiddenDataset(world.hidden)
    for i in range(N_SAMPLES):
        s = ds[i]
        path = world.specforge / "rows_0-2000" / f"data_{i}.ckpt"
        record = torch.load(path, weights_only=True)
        assert list(record) == list(SF_KEYS)
        n, h = s.num_tokens, ds.hidden_size
        assert record["input_ids"].dtype == record["loss_mask"].dtype == torch.int64
        assert record["input_ids"].shape == record["loss_mask"].shape == (n,)
        assert record["aux_hidden_state"].shape == (1, n, len(LAYERS) * h)
        assert record["hidden_state"].shape == (1, n, h)
        assert record["hidden_state"].dtype == torch.bfloat16
        assert torch.equal(record["aux_hidden_state"][0], bf16(s.aux))
        # post = final_norm(pre), to bf16 rounding; and not the pre-norm state itself.
        post = final_norm(world.target, torch.from_numpy(np.array(s.last)))
        got = record["hidden_state"][0].float()
        assert torch.allclose(got, post, rtol=1 / 128, atol=1e-3)
        assert not torch.allclose(got, torch.from_numpy(np.array(s.last)), atol=1e-2)
        # SpecForge's OfflineEagle3Dataset.process_data reads exactly these.
        assert record["aux_hidden_state"].squeeze(0)[None].shape == (1, n, len(LAYERS) * h)
        assert record["loss_mask"].tolist() == s.loss_mask.tolist()
    sidecar = json.loads((world.specforge / SIDECAR).read_text())
    assert sidecar["complete"] and sidecar["last_state"] == "post_norm"


def test_specforge_state_gives_the_target_logits(world: World) -> None:
    """lm_head(hidden_state) is the target's own next-token distribution."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(world.target), dtype=torch.float32)
    record = torch.load(world.specforge / "rows_0-2000" / "data_0.ckpt", weights_only=True)
    with torch.no_grad():
        logits = model(record["input_ids"][None]).logits[0]
        ours = model.lm_head(record["hidden_state"][0].float())
    assert torch.allclose(ours, logits, atol=0.05 * float(logits.abs().max()))
    assert (ours.argmax(-1) == logits.argmax(-1)).float().mean() >= 0.8


# Back again ---------------------------------------------------------------------------------
def test_round_trip(world: World, tmp_path: Path) -> None:
    conv(world.speculators, tmp_path / "from-sp")
    conv(world.specforge, tmp_path / "from-sf")
    a = HiddenDataset(world.hidden)
    b, c = HiddenDataset(tmp_path / "from-sp"), HiddenDataset(tmp_path / "from-sf")
    assert b.last_state == "pre_norm" and c.last_state == "post_norm"
    assert b.layer_ids == c.layer_ids == LAYERS
    for key in ("model_type", "num_layers", "config_xxh3"):
        assert b.target[key] == c.target[key] == a.target[key]
    for i in range(N_SAMPLES):
        x, y, z = a[i], b[i], c[i]
        for other in (y, z):
            assert (other.sample_id, other.partition, other.prompt_len) == (
                x.sample_id,
                x.partition,
                x.prompt_len,
            )
            assert np.array_equal(other.input_ids, x.input_ids)
            assert np.array_equal(other.loss_mask, x.loss_mask)
            assert np.array_equal(other.aux, x.aux)
        assert np.array_equal(y.last, x.last)
        record = torch.load(world.specforge / "rows_0-2000" / f"data_{i}.ckpt", weights_only=True)
        assert np.array_equal(z.last, record["hidden_state"][0].float().numpy())
    # A post-norm dataset goes back to SpecForge as it is (no --target), not to speculators.
    conv(tmp_path / "from-sf", tmp_path / "sf-again", to="specforge")
    again = torch.load(tmp_path / "sf-again" / "rows_0-2000" / "data_3.ckpt", weights_only=True)
    first = torch.load(world.specforge / "rows_0-2000" / "data_3.ckpt", weights_only=True)
    assert all(torch.equal(again[k], first[k]) for k in SF_KEYS)
    with pytest.raises(UserError, match=r"after the final norm.*cannot be recovered"):
        conv(tmp_path / "from-sf", tmp_path / "nope", to="speculators")
    assert not (tmp_path / "nope").exists()


def test_train_gets_the_same_lm_head_input_from_either_form(world: World, tmp_path: Path) -> None:
    """train's OfflineTarget applies the final norm to a pre-norm dataset and nothing to a
    post-norm one: both give the same lm_head input and the same greedy targets."""
    from eagle3kit.target import read_config
    from eagle3kit.train.target import OfflineTarget, TargetHead

    conv(world.specforge, tmp_path / "from-sf")
    head = TargetHead.load(world.target, read_config(world.target))
    pre, post = HiddenDataset(world.hidden), HiddenDataset(tmp_path / "from-sf")
    rows = [(s.input_ids, s.loss_mask, s.aux, s.last) for s in (pre[i] for i in range(3))]
    rows_post = [(s.input_ids, s.loss_mask, s.aux, s.last) for s in (post[i] for i in range(3))]
    a = OfflineTarget(head, pre.last_state, torch.device("cpu")).batch(rows)
    b = OfflineTarget(head, post.last_state, torch.device("cpu")).batch(rows_post)
    assert torch.equal(a.normed.to(torch.bfloat16), b.normed.to(torch.bfloat16))
    assert torch.equal(head.argmax(a.normed.to(torch.bfloat16).float()), b.argmax)


def test_import_without_the_export_record(world: World, tmp_path: Path) -> None:
    """The tools' own directories carry no layer ids: --layers or --target says them."""
    sp, sf = tmp_path / "sp", tmp_path / "sf"
    shutil.copytree(world.speculators, sp)
    shutil.copytree(world.specforge, sf)
    (sp / SIDECAR).unlink()
    (sf / SIDECAR).unlink()
    with pytest.raises(UserError, match=r"do not record which layers.*--layers"):
        conv(sp, tmp_path / "x")
    with pytest.raises(UserError, match=r"add 1 to each"):
        conv(sf, tmp_path / "x")
    with pytest.raises(UserError, match=r"--layers 2,4: 2 ids, but the files hold 3"):
        conv(sp, tmp_path / "x", layers="2,4")
    conv(sp, tmp_path / "by-layers", layers="2,4,5")
    conv(sf, tmp_path / "by-target", target=world.target)
    a, b = HiddenDataset(tmp_path / "by-layers"), HiddenDataset(tmp_path / "by-target")
    assert a.layer_ids == b.layer_ids == LAYERS and a.target == {"path": None}
    assert b.target["num_layers"] == 8 and b.last_state == "post_norm"
    assert [a[i].sample_id for i in range(2)] == ["hs_0", "hs_1"]
    assert [b[i].sample_id for i in range(2)] == ["data_0", "data_1"]
    assert np.array_equal(a[4].aux, HiddenDataset(world.hidden)[4].aux)


def test_specforge_padded_and_gzipped_files(tmp_path: Path) -> None:
    """What prepare_hidden_states.py writes with --compress and batch padding (right-padded
    with id 0 and loss 0, states [1, T, ...]) imports as it is."""
    src = tmp_path / "sf" / "rows_0-2000"
    src.mkdir(parents=True)
    h, n = 8, 5
    for i in range(2):
        record = {
            "input_ids": torch.tensor([3, 4, 5, 0, 0]),
            "loss_mask": torch.tensor([0, 1, 1, 0, 0]),
            "aux_hidden_state": torch.randn(1, n, 3 * h).to(torch.bfloat16),
            "hidden_state": torch.randn(1, n, h).to(torch.bfloat16),
        }
        buf = io.BytesIO()
        torch.save(record, buf)
        (src / f"data_{i}.ckpt.gz").write_bytes(gzip.compress(buf.getvalue()))
    conv(tmp_path / "sf", tmp_path / "out", layers="1,2,3")
    ds = HiddenDataset(tmp_path / "out")
    assert len(ds) == 2 and ds.hidden_size == h and ds.last_state == "post_norm"
    assert ds[1].input_ids.tolist() == [3, 4, 5, 0, 0] and ds[1].loss_mask.tolist() == [
        0,
        1,
        1,
        0,
        0,
    ]


# Bad files ------------------------------------------------------------------------------------
class Payload:
    """Unpickling this runs open(marker, "w"): what weights_only must never allow."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def run_cli(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prewarmed.argv(), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def one_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


def test_a_pickle_payload_is_refused_not_run(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    src = tmp_path / "sf" / "rows_0-2000"
    src.mkdir(parents=True)
    torch.save(
        {
            "input_ids": torch.tensor([1, 2]),
            "loss_mask": torch.tensor([1, 1]),
            "aux_hidden_state": torch.zeros(1, 2, 6),
            "hidden_state": Payload(marker),
        },
        src / "data_0.ckpt",
    )
    # The legacy (non-zip) pickle form too.
    (src / "data_1.ckpt").write_bytes(pickle.dumps({"input_ids": Payload(marker)}, protocol=2))
    error = one_error(run_cli("convert", tmp_path / "sf", tmp_path / "out", "--layers", "1,2,3"))
    assert "data_0.ckpt: refused: it asks to run io.open" in error and "weights_only" in error
    with pytest.raises(BadFile, match=r"data_1.ckpt: refused"):
        load_tensor_file(src / "data_1.ckpt")
    assert not marker.exists()
    assert not (tmp_path / "out").exists()


def test_bad_and_missing_files_are_named(world: World, tmp_path: Path) -> None:
    sp = tmp_path / "sp"
    shutil.copytree(world.speculators, sp)
    hs = sp / "hidden_states"
    (hs / "hs_2.safetensors").write_bytes(b"not safetensors")
    (hs / "hs_4.safetensors").unlink()
    with pytest.raises(UserError, match=r"hs_2\.safetensors: not a readable safetensors file"):
        conv(sp, tmp_path / "a")
    assert len(HiddenDataset(tmp_path / "a")) == 2  # the samples before it are committed
    result = conv(sp, tmp_path / "b", skip_bad_lines=True)
    assert (result.written, result.bad_lines) == (N_SAMPLES - 2, 1)  # hs_4 missing: skipped
    # A file whose token ids are not its row's.
    from safetensors.torch import load_file, save_file

    shutil.copy(world.speculators / "hidden_states" / "hs_2.safetensors", hs / "hs_2.safetensors")
    swapped = load_file(str(hs / "hs_3.safetensors"))
    swapped["token_ids"] = swapped["token_ids"] + 1
    save_file(swapped, str(hs / "hs_3.safetensors"))
    with pytest.raises(UserError, match=r"hs_3\.safetensors: token_ids differ from row 3"):
        conv(sp, tmp_path / "c")
    # SpecForge: a key missing, and a file that is not a torch file at all.
    sf = tmp_path / "sf"
    shutil.copytree(world.specforge, sf)
    record = torch.load(sf / "rows_0-2000" / "data_1.ckpt", weights_only=True)
    del record["aux_hidden_state"]
    torch.save(record, sf / "rows_0-2000" / "data_1.ckpt")
    with pytest.raises(UserError, match=r"data_1\.ckpt: no tensor aux_hidden_state"):
        conv(sf, tmp_path / "d")
    (sf / "rows_0-2000" / "data_1.ckpt").write_bytes(b"\x00garbage")
    with pytest.raises(UserError, match=r"data_1\.ckpt: not a readable torch file"):
        conv(sf, tmp_path / "e")
    (hs.parent / "state.json").unlink()
    with pytest.raises(UserError, match="not an eagle3kit dataset"):
        conv(sp, tmp_path / "f")
    with pytest.raises(UserError, match="give its parent"):
        conv(hs, tmp_path / "f")


def test_misuse_is_refused_before_anything_is_written(world: World, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="--to must be one of speculators, specforge"):
        conv(world.hidden, tmp_path / "x", to="eagle")
    with pytest.raises(UserError, match="is a token dataset; --to converts a hidden-state"):
        conv(world.tokens, tmp_path / "x", to="speculators")
    with pytest.raises(UserError, match="give --to speculators or --to specforge"):
        conv(world.hidden, tmp_path / "x.jsonl")
    with pytest.raises(UserError, match="--target is needed only with --to specforge"):
        conv(world.hidden, tmp_path / "x", to="speculators", target=world.target)
    with pytest.raises(UserError, match="leave out --to"):
        conv(world.specforge, tmp_path / "x", to="specforge")
    with pytest.raises(UserError, match="--layers applies to import"):
        conv(world.hidden, tmp_path / "x", to="speculators", layers="1,2,3")
    with pytest.raises(UserError, match="--to, --target and --layers apply to hidden-state"):
        conv(world.tokens, tmp_path / "x.jsonl", layers="1,2,3")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "other.txt").write_text("mine")
    with pytest.raises(UserError, match="exists and is not an export of"):
        conv(world.hidden, tmp_path / "full", to="speculators")
    assert not (tmp_path / "x").exists() and not (tmp_path / "x.jsonl").exists()
    # Another model as --target: its norm would be the wrong one.
    other = make_target(tmp_path / "other", world.root / "tokenizer", num_layers=9)
    with pytest.raises(UserError, match=r"not the model .* was extracted from"):
        conv(world.hidden, tmp_path / "x", to="specforge", target=other)
    error = one_error(run_cli("convert", world.hidden, tmp_path / "y", "--to", "specforge"))
    assert "--to specforge needs --target" in error and not (tmp_path / "y").exists()


def test_a_rerun_export_continues(world: World, tmp_path: Path) -> None:
    out = tmp_path / "sf"
    conv(world.hidden, out, to="specforge", target=world.target)
    (out / "rows_0-2000" / "data_2.ckpt").unlink()  # as if stopped before it
    result = conv(world.hidden, out, to="specforge", target=world.target)
    assert (result.written, result.skipped_existing) == (1, N_SAMPLES - 1)
    assert (out / "rows_0-2000" / "data_2.ckpt").is_file()

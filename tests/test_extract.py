"""`eagle3kit extract` on real tiny transformers targets (8 layers, Llama and Qwen3 style).

The states must be exactly the target's: the auxiliary ones equal HF's
`output_hidden_states[k]` at the boundary ids, and the last one is the pre-norm state, so
`lm_head(norm(last))` gives the model's logits. A SIGKILL mid-run followed by the same
command must end complete, each sample once, every shard verifying; torchrun with two gloo
ranks must write what one process writes. Every bad input ends in one message, no traceback.
"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import orjson
import pytest
import torch
from extract_world import N_SAMPLES, QUIET, Tiny, build_tiny, cli_env, refused, write_tokens

from eagle3kit import extract
from eagle3kit._options import WRITE_KEYS, WriteOptions
from eagle3kit._ranks import Ranks
from eagle3kit._ui import OutputOptions
from eagle3kit.errors import UserError
from eagle3kit.extract.hf import HfEngine
from eagle3kit.format import (
    DatasetError,
    HiddenDataset,
    HiddenSample,
    HiddenWriter,
    hidden_bytes_per_token,
)
from eagle3kit.format.layout import SHARD_DIR
from eagle3kit.format.state_codecs import to_bf16
from eagle3kit.target import TargetInfo, resolve_layer_ids
from eagle3kit.tiny import make_tokenizer

extract_run = importlib.import_module("eagle3kit.extract.run")
"""The module (the face's `run` is the function)."""
pytestmark = pytest.mark.usefixtures("one_torch_thread")


# Fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    return build_tiny(tmp_path_factory)


def config(tiny: Tiny, out: Path, **options) -> extract.ExtractConfig:
    options.setdefault("target", tiny.llama)
    options.setdefault("output", QUIET)
    options.setdefault("batch_tokens", 200)
    write = {k: options.pop(k) for k in WRITE_KEYS if k in options}
    options["write"] = WriteOptions(**{"commit_every": 256, **write})
    return extract.ExtractConfig(options.pop("tokens", tiny.tokens), out, **options)


# The states are the target's --------------------------------------------------------------
def reference(model, ids: np.ndarray) -> tuple:
    """HF's own view of one sample, unbatched: hidden states and logits."""
    with torch.no_grad():
        out = model(torch.from_numpy(ids.astype(np.int64))[None], output_hidden_states=True)
    return out.hidden_states, out.logits[0]


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_states_equal_hf_output_hidden_states_and_give_the_logits(
    tiny: Tiny, arch: str, tmp_path: Path
) -> None:
    model_dir = getattr(tiny, arch)
    info = TargetInfo.load(model_dir)
    layers = resolve_layer_ids(None, info.num_layers)
    assert layers == [2, 4, 5]
    engine = HfEngine.load(config(tiny, tmp_path / "x", target=model_dir), info, layers, Ranks())
    from eagle3kit.format import Dataset

    tokens = Dataset(tiny.tokens)
    ids = [tokens.token_view(i).input_ids for i in (0, 1, 2, 3)]  # a padded batch of four
    got = list(engine.states(ids))
    model = engine.model
    references = []
    for x, (aux, last) in zip(ids, got, strict=True):
        hidden, logits = reference(model, x)
        references.append(hidden)
        # fp32 states are exactly HF's at the boundary ids, batching and padding included.
        want = torch.cat([hidden[k][0] for k in layers], -1)
        torch.testing.assert_close(torch.from_numpy(aux), want)
        # The last state is pre-norm: HF's hidden_states[N] is already normed...
        torch.testing.assert_close(model.model.norm(torch.from_numpy(last)), hidden[-1][0])
        # ...and lm_head(norm(last)) is the model's logits.
        with torch.no_grad():
            recomputed = model.lm_head(model.model.norm(torch.from_numpy(last)))
        torch.testing.assert_close(recomputed, logits)

    # Stored (raw codec) states are HF's, rounded to bf16, bit for bit: one sample per
    # forward pass computes exactly what the unbatched reference does.
    out = tmp_path / "hidden"
    extract.run(config(tiny, out, target=model_dir, batch_tokens=1))
    by_id = {s.sample_id: s for s in HiddenDataset(out)}
    for i, hidden in enumerate(references):
        stored = by_id[tokens[i].sample_id]
        want = torch.cat([hidden[k][0] for k in layers], -1)
        assert np.array_equal(
            to_bf16(stored.aux), want.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
        )
        ((_, alone),) = engine.states([ids[i]])
        assert np.array_equal(to_bf16(stored.last), to_bf16(alone))
        assert np.array_equal(stored.input_ids, ids[i])
        assert np.array_equal(stored.loss_mask, tokens[i].dense_loss_mask())


def test_dataset_records_what_the_states_are(tiny: Tiny, tmp_path: Path) -> None:
    out = tmp_path / "hidden"
    result = extract.run(config(tiny, out, codec="fp8", commit_every=5))
    assert (result.written, result.skipped, result.previously_done) == (N_SAMPLES, {}, 0)
    ds = HiddenDataset(out)
    assert len(ds) == N_SAMPLES and ds.verify() == []
    assert (ds.layer_ids, ds.hidden_size, ds.last_state) == ([2, 4, 5], 64, "pre_norm")
    assert ds.target["num_layers"] == 8 and ds.target["vocab_size"] == 1026
    assert ds.target["path"] == str(tiny.llama.absolute())
    assert ds.tokenizer["size"] == 1026
    assert ds.manifest["hidden"]["tokens"]["created"] is not None
    measured = ds.measured["fp8"]
    assert measured["tokens"] == ds.num_tokens
    assert 0 < measured["max_rel_error"] < 0.07  # e4m3: 3 mantissa bits
    # The forecast plan uses is close to what was measured (small samples: headers weigh).
    assert (
        hidden_bytes_per_token(64, 3, "fp8")
        <= measured["bytes_per_token"]
        < 1.4 * (hidden_bytes_per_token(64, 3, "fp8"))
    )
    sample = ds[0]
    assert sample.aux.shape == (len(sample.input_ids), 192) and sample.aux.dtype == np.float32
    assert sample.input_ids.dtype == np.int32 and sample.loss_mask.dtype == np.uint8
    assert sorted(ds.partitions) == ["code", "math"]
    assert len(ds.indices("math")) == N_SAMPLES // 2

    # The same command again has nothing to do; other layers are refused, even with --force.
    again = extract.run(config(tiny, out, codec="fp8", commit_every=5))
    assert (again.written, again.previously_done) == (0, N_SAMPLES)
    with pytest.raises(DatasetError, match="cannot be mixed"):
        extract.run(config(tiny, out, codec="fp8", layers="1,2,3", force=True))


@pytest.mark.parametrize("codec", ["raw", "fp8", "zstd"])
def test_codecs_round_trip(tmp_path: Path, codec: str) -> None:
    rng = np.random.default_rng(3)
    h = 32
    layout = {"layer_ids": [2, 4, 5], "hidden_size": h, "last_state": "pre_norm"}
    samples = [
        HiddenSample(
            f"x{i}",
            rng.integers(0, 99, t).astype(np.int32),
            (rng.random(t) < 0.7).astype(np.uint8),
            rng.standard_normal((t, 3 * h), np.float32),
            10 * rng.standard_normal((t, h), np.float32),
            prompt_len=1 + i % 2,
        )
        for i, t in enumerate((1, 7, 30, 2))
    ]
    with HiddenWriter(tmp_path / codec, layout=layout, codec=codec, commit_every=3) as writer:
        for s in samples:
            writer.add(s)
    ds = HiddenDataset(tmp_path / codec)
    bound = 0.07 if codec == "fp8" else 2**-8  # relative to each state's largest value
    for want, got in zip(samples, ds, strict=True):
        for a, b in ((want.aux, got.aux), (want.last, got.last)):
            peak = np.abs(a.reshape(len(a), -1, h)).max(-1, keepdims=True)
            assert (np.abs(a - b).reshape(len(a), -1, h) <= bound * peak).all()
    assert ds.measured[codec]["max_rel_error"] <= bound
    # Training's token-only passes read ids and masks without decoding any state.
    for i, want in enumerate(samples):
        view = ds.token_view(i)
        assert view.input_ids.tolist() == want.input_ids.tolist()
        assert view.loss_mask.tolist() == want.loss_mask.tolist()
        assert view.prompt_len == want.prompt_len


def test_an_older_datasets_target_record_is_kept_when_it_names_this_target(
    tiny: Tiny, tmp_path: Path
) -> None:
    """extract writes the one identity record; a dataset an older eagle3kit started records
    fewer keys of it, and rerunning on it continues instead of refusing a changed layout."""
    out = tmp_path / "hidden"
    extract.run(config(tiny, out))
    assert {k: v for k, v in HiddenDataset(out).target.items() if k != "path"} == (
        TargetInfo.load(tiny.llama).identity
    )
    manifest_path = out / "manifest.json"
    manifest = orjson.loads(manifest_path.read_bytes())
    old = {
        k: manifest["hidden"]["target"][k]
        for k in (
            "model_type",
            "num_layers",
            "hidden_size",
            "vocab_size",
            "config_xxh3",
            "weights_xxh3",
        )
    }
    manifest["hidden"]["target"] = old
    manifest_path.write_bytes(orjson.dumps(manifest))
    again = extract.run(config(tiny, out))
    assert (again.previously_done, again.written) == (N_SAMPLES, 0)
    assert HiddenDataset(out).layout["target"] == old


def test_an_older_datasets_tokens_record_without_the_sampling_is_kept(
    tiny: Tiny, tmp_path: Path
) -> None:
    """extract records how the token dataset's completions were sampled (what gen
    recorded; this one's writer recorded none) beside its identity; a dataset an older
    eagle3kit started has only the identity, and rerunning on it continues."""
    out = tmp_path / "hidden"
    extract.run(config(tiny, out))
    record = HiddenDataset(out).layout["tokens"]
    assert (record["sampling"], record["api_family"]) == (None, None)
    manifest_path = out / "manifest.json"
    manifest = orjson.loads(manifest_path.read_bytes())
    old = {k: record[k] for k in ("created", "written_by", "config_xxh3")}
    manifest["hidden"]["tokens"] = old
    manifest_path.write_bytes(orjson.dumps(manifest))
    again = extract.run(config(tiny, out))
    assert (again.previously_done, again.written) == (N_SAMPLES, 0)
    assert HiddenDataset(out).layout["tokens"] == old


# Bad input: one message, before any work ---------------------------------------------------
def test_bad_layers_and_a_shallow_target_are_refused(tiny: Tiny, tmp_path: Path) -> None:
    out = tmp_path / "hidden"
    args = ["extract", tiny.tokens, out, "--target", tiny.llama]
    assert "--layers 2,x" in refused(*args, "--layers", "2,x")
    assert "must lie in 0..8" in refused(*args, "--layers", "2,4,9")
    assert "distinct and increasing" in refused(*args, "--layers", "4,2,5")
    assert "--target is required" in refused("extract", tiny.tokens, out)
    assert "--codec" in refused(*args, "--codec", "gzip")
    with pytest.raises(UserError, match=r"too few for distinct default layer ids.*--layers"):
        resolve_layer_ids(None, 6)
    assert resolve_layer_ids(None, 7) == [2, 3, 4]
    assert not out.exists()


def test_a_dataset_for_another_model_is_refused(tiny: Tiny, tmp_path: Path) -> None:
    too_big = write_tokens(tmp_path / "big", tiny.tokenizer, n=3, top=5000)
    message = refused("extract", too_big, tmp_path / "h1", "--target", tiny.llama)
    assert "holds token id" in message and "embeds only 1026 ids" in message
    other = make_tokenizer(
        tmp_path / "other-tok", corpus=["a completely different corpus"] * 50, vocab_size=300
    )
    foreign = write_tokens(tmp_path / "foreign", other, n=3, top=300)
    message = refused("extract", foreign, tmp_path / "h2", "--target", tiny.llama)
    assert "tokenizer" in message and "differs from the target's" in message
    assert not (tmp_path / "h1").exists() and not (tmp_path / "h2").exists()


def test_short_disk_is_refused_and_dry_run_only_estimates(
    tiny: Tiny, tmp_path: Path, monkeypatch, capsys
) -> None:
    out = tmp_path / "hidden"
    monkeypatch.setattr(extract_run, "free_bytes", lambda path: 900)
    with pytest.raises(UserError, match=r"only 900 B free.*--ignore-disk-check"):
        extract.run(config(tiny, out))
    assert not out.exists()
    result = extract.run(config(tiny, out, dry_run=True, output=OutputOptions()))
    assert result.dry_run and result.estimate_bytes > 900 and not out.exists()
    assert "bytes/token (raw)" in capsys.readouterr().err
    assert extract.run(config(tiny, out, ignore_disk_check=True)).written == N_SAMPLES


def test_a_full_disk_stops_with_one_message(tiny: Tiny, tmp_path: Path, monkeypatch) -> None:
    import errno

    from eagle3kit.format import writer as writer_module
    from eagle3kit.format._io import disk_error

    def full(path, *args, **kwargs):
        raise disk_error(path, OSError(errno.ENOSPC, "No space left on device"))

    monkeypatch.setattr(writer_module, "write_shard", full)
    with pytest.raises(DatasetError, match=r"no space left.*rerun the same command"):
        extract.run(config(tiny, tmp_path / "hidden"))


def test_damaged_shards_are_named(tiny: Tiny, tmp_path: Path) -> None:
    out = tmp_path / "hidden"
    extract.run(config(tiny, out, commit_every=8))
    shard = sorted((out / SHARD_DIR).iterdir())[0]
    data = bytearray(shard.read_bytes())
    data[-10] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(DatasetError, match=f"{shard.name}.*damaged"):
        list(HiddenDataset(out))
    # A damaged input is named before any work too.
    tokens = tmp_path / "tokens"
    write_tokens(tokens, tiny.tokenizer, n=5)
    shard = sorted((tokens / SHARD_DIR).iterdir())[0]
    shard.write_bytes(shard.read_bytes()[:-3])
    assert "damaged" in refused("extract", tokens, tmp_path / "h2", "--target", tiny.llama)
    assert not (tmp_path / "h2").exists()


def test_nan_states_skip_the_sample_with_a_reason(tiny: Tiny, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    broken = tmp_path / "broken"
    model = AutoModelForCausalLM.from_pretrained(str(tiny.llama), dtype=torch.float32)
    bad_id = int(np.asarray(extract_run.Dataset(tiny.tokens)[5].prompt_ids)[0])
    with torch.no_grad():
        model.model.embed_tokens.weight[bad_id] = float("nan")
    model.save_pretrained(broken)
    for p in tiny.llama.iterdir():
        if p.name.startswith("tokenizer") or p.name == "chat_template.jinja":
            (broken / p.name).write_bytes(p.read_bytes())
    out = tmp_path / "hidden"
    result = extract.run(config(tiny, out, target=broken))
    ds = HiddenDataset(out)
    having = {
        s.sample_id
        for s in extract_run.Dataset(tiny.tokens)
        if bad_id in np.asarray(s.prompt_ids).tolist() + np.asarray(s.completion_ids).tolist()
    }
    assert set(result.skipped) == having and "s005" in having
    assert set(ds.skipped) == having and "NaN" in ds.skipped["s005"]
    assert len(ds) == N_SAMPLES - len(having)


# Crashes and ranks ------------------------------------------------------------------------
def extract_cmd(tiny: Tiny, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "eagle3kit",
        "extract",
        str(tiny.tokens),
        str(out),
        "--target",
        str(tiny.llama),
        "--batch-tokens",
        "64",
        "--commit-every",
        "2",
        "--dtype",
        "float32",
        "-q",
        *extra,
    ]


@pytest.mark.slow  # two CLI processes: ~60 s on a shared 2-core machine, mostly imports
def test_sigkill_mid_extract_then_rerun(tiny: Tiny, tmp_path: Path) -> None:
    out = tmp_path / "hidden"
    proc = subprocess.Popen(extract_cmd(tiny, out), env=cli_env(), stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    # Killed once something is committed and the run is still writing more.
    while proc.poll() is None and time.monotonic() < deadline:
        manifest = out / "manifest.json"
        if manifest.exists() and len(orjson.loads(manifest.read_bytes())["shards"]) >= 2:
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    held = {s.sample_id for s in HiddenDataset(out, warn_stray=False)}
    assert 0 < len(held) < N_SAMPLES

    final = subprocess.run(
        extract_cmd(tiny, out), env=cli_env(), capture_output=True, text=True, timeout=240
    )
    assert final.returncode == 0 and "Traceback" not in final.stderr, final.stderr
    ds = HiddenDataset(out)
    assert ds.verify() == [] and ds.stray_files() == ([], [])
    ids = list(ds.sample_ids())
    assert len(ids) == len(set(ids)) == N_SAMPLES and held <= set(ids)


def torchrun(nproc: int, *args: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(nproc),
            "-m",
            "eagle3kit",
            *args,
        ],
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]


@pytest.mark.slow
def test_two_torchrun_ranks_write_what_one_process_writes(tiny: Tiny, tmp_path: Path) -> None:
    # One sample per forward pass, so both runs compute each sample the same way.
    common = [
        "extract",
        str(tiny.tokens),
        "--target",
        str(tiny.llama),
        "--dtype",
        "float32",
        "--batch-tokens",
        "1",
        "--commit-every",
        "3",
        "-q",
    ]
    torchrun(2, *common[:2], str(tmp_path / "two"), *common[2:])
    torchrun(1, *common[:2], str(tmp_path / "one"), *common[2:])
    two, one = HiddenDataset(tmp_path / "two"), HiddenDataset(tmp_path / "one")
    assert two.verify() == [] and {s["rank"] for s in two.shards} == {0, 1}
    assert len(two.manifest["runs"]) == 1
    writers = [s["rank"] for s in two.shards for _ in range(s["samples"])]
    # Each sample was written by the rank its id names, and holds what one process wrote.
    for writer, sample in zip(writers, two, strict=True):
        assert writer == extract_run.owner(sample.sample_id, 2)
    ones = {s.sample_id: s for s in one}
    assert len(ones) == len(two) == N_SAMPLES
    for sample in two:
        twin = ones[sample.sample_id]
        assert np.array_equal(to_bf16(sample.aux), to_bf16(twin.aux))
        assert np.array_equal(to_bf16(sample.last), to_bf16(twin.last))
        assert np.array_equal(sample.input_ids, twin.input_ids)


@pytest.mark.parametrize("device", ["cuda:99", "cuda:0", "cuda"])
def test_a_gpu_that_is_not_here_is_one_line(tiny: Tiny, tmp_path: Path, device: str) -> None:
    """Refused by the flag before any state is computed (here: no GPU at all; on a GPU
    machine cuda:99 is still past the last one)."""
    import torch

    if device != "cuda:99" and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    line = refused(
        "extract", tiny.tokens, tmp_path / "hidden", "--target", tiny.llama, "--device", device
    )
    assert line.startswith(f"error: --device {device}"), line
    assert "no CUDA device here" in line or "CUDA device(s)" in line
    assert not (tmp_path / "hidden").exists()


def test_a_device_that_is_not_a_device_is_refused_by_the_config(tiny: Tiny, tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"--device must be auto, cpu, cuda or cuda:N \(got gpu"):
        config(tiny, tmp_path / "hidden", device="gpu")


def test_an_infinite_request_timeout_is_refused(tiny: Tiny, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="--request-timeout must be a finite number > 0"):
        config(
            tiny,
            tmp_path / "hidden",
            engine="vllm",
            server="http://127.0.0.1:9",
            request_timeout=float("inf"),
        )

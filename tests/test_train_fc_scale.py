"""--fc-scale: fc trained as if the target's states reached it multiplied by a factor c, its
weights kept the layout's own (docs/train.md, "The scale of fc's input").

The reference is the thing it stands for, run for real: a plain run whose every batch's states
are multiplied by c (what a drafter with c before fc would see) trains fc's weights V; the
--fc-scale run on the unscaled states must train W = c·V and the same everything else, step
for step, with clipping and resuming on the way, and its drafter must export to SGLang, whose
layout has nothing before fc.
"""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch
from tiny_train import (
    QUIET,
    config,
    extract,
    interrupt_at_step,
    losses,
    weights,
    write_tokens,
)

from eagle3kit.errors import UserError
from eagle3kit.train import run
from eagle3kit.train.feed import Feed

pytestmark = pytest.mark.usefixtures("one_torch_thread")

C = 0.25


def scaled_states(monkeypatch: pytest.MonkeyPatch, c: float) -> None:
    """Every batch a run makes (training and held-out) carries its states multiplied by c."""
    made = Feed._batch

    def scaled(self, items):
        batch = made(self, items)
        return dataclasses.replace(batch, aux=batch.aux * c)

    monkeypatch.setattr(Feed, "_batch", scaled)


def test_fc_trains_as_if_the_states_were_scaled_and_keeps_its_layout(
    train_world, tmp_path, monkeypatch
):
    # grad_clip 0.05 clips every step, so the clipped norm is checked too
    options = dict(max_steps=5, drafter_step="last", grad_clip=0.05)
    ours = run(
        config(train_world, train_world["hidden"], tmp_path / "ours", fc_scale=str(C), **options)
    )
    assert ours.metrics["fc_scale"] == C
    with monkeypatch.context() as patch:
        scaled_states(patch, C)
        run(config(train_world, train_world["hidden"], tmp_path / "ref", fc_scale="off", **options))
    w, v = weights(tmp_path / "ours"), weights(tmp_path / "ref")
    assert w.keys() == v.keys() and "input_norm.weight" not in w
    torch.testing.assert_close(w["fc.weight"], C * v["fc.weight"], rtol=1e-4, atol=1e-7)
    for name in w.keys() - {"fc.weight"}:
        torch.testing.assert_close(w[name], v[name], rtol=1e-4, atol=1e-6, msg=name)
    assert losses(tmp_path / "ours") == pytest.approx(losses(tmp_path / "ref"), rel=1e-4)
    # and without it fc would have trained otherwise: the check above can fail
    run(config(train_world, train_world["hidden"], tmp_path / "plain", fc_scale="off", **options))
    plain = weights(tmp_path / "plain")["fc.weight"]
    assert not torch.allclose(plain, w["fc.weight"], rtol=1e-2)

    from eagle3kit.export import ExportConfig
    from eagle3kit.export import run as export

    export(ExportConfig(tmp_path / "ours", tmp_path / "sglang", format="sglang", output=QUIET))
    exported = json.loads((tmp_path / "sglang" / "config.json").read_text())
    assert exported["architectures"] == ["LlamaForCausalLMEagle3"]


def test_an_interrupted_run_resumes_with_its_scale(train_world, tmp_path, monkeypatch):
    options = dict(max_steps=5, fc_scale=str(C))
    run(config(train_world, train_world["hidden"], tmp_path / "whole", **options))
    with monkeypatch.context() as patch, pytest.raises(KeyboardInterrupt):
        interrupt_at_step(patch, 4)
        run(config(train_world, train_world["hidden"], tmp_path / "cut", **options))
    # off is another run, and the message says which setting differs
    off = dict(max_steps=5, fc_scale="off")
    with pytest.raises(UserError, match=re.escape("--fc-scale: '0.25' -> None")):
        run(config(train_world, train_world["hidden"], tmp_path / "cut", **off))
    # under --force, the optimizer state's groups still decide, and the message says so
    with pytest.raises(UserError, match="saved with an --fc-scale, so the run goes on with it"):
        run(config(train_world, train_world["hidden"], tmp_path / "cut", force=True, **off))
    # not given, the run keeps its own
    resumed = run(config(train_world, train_world["hidden"], tmp_path / "cut", max_steps=5))
    assert resumed.resumed_from == 2
    a, b = weights(tmp_path / "whole"), weights(tmp_path / "cut")
    assert all(torch.equal(a[n], b[n]) for n in a)  # bitwise, CPU fp32
    recorded = json.loads((tmp_path / "cut" / "run.json").read_text())
    assert recorded["settings"]["fc_scale"] == str(C)


def test_a_new_run_takes_one_over_the_rms_of_the_states(train_world, tmp_path):
    """The default of a new run is auto, measured on the first eight training samples
    (here all of them)."""
    sequences = [[(7 * i + 3 * j) % 90 + 5 for j in range(24 + 5 * i)] for i in range(8)]
    tokens = write_tokens(tmp_path / "tokens", sequences)
    hidden = extract(tokens, tmp_path / "hidden", train_world["target"])
    result = run(config(train_world, hidden, tmp_path / "run", eval_split=0))
    recorded = json.loads((tmp_path / "run" / "run.json").read_text())
    assert recorded["settings"]["fc_scale"] == "auto"
    from eagle3kit.format import HiddenDataset

    data = list(HiddenDataset(hidden))
    squares = sum(float(torch.as_tensor(s.aux).double().square().sum()) for s in data)
    count = sum(torch.as_tensor(s.aux).numel() for s in data)
    assert result.metrics["fc_scale"] == pytest.approx((count / squares) ** 0.5, rel=1e-5)


def test_a_run_made_before_the_option_resumes_without_it(train_world, tmp_path, monkeypatch):
    """A run whose run.json records no --fc-scale (every run made before it, and one with
    --fc-scale off) goes on without it when the flag is not given."""
    off = dict(max_steps=5, fc_scale="off")
    run(config(train_world, train_world["hidden"], tmp_path / "whole", **off))
    with monkeypatch.context() as patch, pytest.raises(KeyboardInterrupt):
        interrupt_at_step(patch, 4)
        run(config(train_world, train_world["hidden"], tmp_path / "cut", **off))
    settings = json.loads((tmp_path / "cut" / "run.json").read_text())["settings"]
    assert "fc_scale" not in settings  # as a run made before the option records it
    resumed = run(config(train_world, train_world["hidden"], tmp_path / "cut", max_steps=5))
    assert resumed.resumed_from == 2 and "fc_scale" not in resumed.metrics
    a, b = weights(tmp_path / "whole"), weights(tmp_path / "cut")
    assert all(torch.equal(a[n], b[n]) for n in a)


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "large"])
def test_a_factor_must_be_a_positive_number(train_world, tmp_path, value):
    with pytest.raises(
        UserError, match=f"--fc-scale must be auto, off or a number > 0 \\(got {value}\\)"
    ):
        config(train_world, train_world["hidden"], tmp_path / "run", fc_scale=value)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # torchrun launches, on busy cores
def test_fsdp_with_its_own_group_takes_the_steps_of_one_process_and_resumes(train_world, tmp_path):
    """Under --fsdp the optimizer's two groups (fc's and the rest) are saved by parameter
    name and restored in their order: 2 processes take the steps of 1 with --grad-accum 2,
    and resume from a checkpoint to the same end."""
    import shutil
    import subprocess

    import numpy as np
    from tiny_train import close_weights, env, torchrun, train_cmd

    one = tmp_path / "one"
    run(
        config(
            train_world,
            train_world["hidden"],
            one,
            max_steps=4,
            grad_accum=2,
            batch_tokens=128,
            fc_scale=str(C),
        )
    )
    flags = ("--max-steps", "4", "--batch-tokens", "128", "--fc-scale", str(C), "--fsdp")
    flags += ("--eval-every", "2", "--checkpoint-every", "2")
    fsdp = tmp_path / "fsdp"
    for attempt in ("whole", "resumed"):
        proc = subprocess.run(
            torchrun(*train_cmd(train_world, fsdp, *flags)),
            capture_output=True,
            text=True,
            env=env(),
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert json.loads((fsdp / "run.json").read_text())["parallel"] == "fsdp"
        np.testing.assert_allclose(losses(fsdp), losses(one), rtol=1e-5)
        close_weights(fsdp, one)
        if attempt == "whole":
            shutil.rmtree(fsdp / "checkpoints" / "step-00000004")
            shutil.rmtree(fsdp / "drafter")
        else:
            assert "resuming after step 2" in proc.stderr

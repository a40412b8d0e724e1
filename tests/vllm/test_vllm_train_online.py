"""`train --online --server` against the real engine's extract_hidden_states method.

The drafter trained on states fetched from the server while it trains must be the drafter
trained on `extract --engine vllm` output of the same server: the same seed and the same
states (bf16, as extract stores them), so the same losses and the same held-out predicted
acceptance length. Both read the server one request at a time, so that vLLM computes every
sample alone and the two reads give the same numbers. No hidden-state file is left behind.
Runs on the extract tier's server (MODULE_ORDER puts it right after test_vllm_extract, whose
last test starts it).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import LAYERS, World

from eagle3kit import _ui, extract, train
from eagle3kit.quickstart import QuickstartConfig
from eagle3kit.quickstart.stages import train_options

QUIET = _ui.OutputOptions(quiet=True)

pytestmark = pytest.mark.vllm


def _losses(run_dir: Path) -> list[float]:
    import json

    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [m["loss"] for m in map(json.loads, lines) if "loss" in m]


@pytest.mark.timeout(1800)  # run alone, its fixtures start two servers (about 5 min)
def test_training_from_the_server_equals_training_on_what_extract_stored(
    tokens: Path, extract_server, world: World, tmp_path: Path
) -> None:
    # tokens first: its gen server (plain) must be done before the extract server starts
    import torch

    storage = world.root / "hs"
    hidden = tmp_path / "hidden"
    storage.mkdir(exist_ok=True)
    extract.run(
        extract.ExtractConfig(
            tokens,
            hidden,
            target=world.target,
            engine="vllm",
            server=extract_server.url,
            layers=LAYERS,
            concurrency=1,
            hidden_states_dir=storage,
            output=QUIET,
        )
    )
    options = train_options(QuickstartConfig())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        offline = train.run(
            train.TrainConfig([hidden], tmp_path / "offline", world.target, output=QUIET, **options)
        )
        # --server's default --fc-scale is off (its states arrive once training starts):
        # given the number offline measured, it trains alike
        options["fc_scale"] = str(offline.metrics["fc_scale"])
        served = train.run(
            train.TrainConfig(
                [tokens],
                tmp_path / "served",
                world.target,
                online=True,
                layers=LAYERS,
                servers=[f"{extract_server.url}@1"],
                prefetch=8,
                hidden_states_dir=storage,
                output=QUIET,
                **options,
            )
        )
    finally:
        torch.set_num_threads(threads)
    assert served.steps == offline.steps == served.total_steps
    np.testing.assert_allclose(
        _losses(tmp_path / "served"), _losses(tmp_path / "offline"), rtol=4e-3
    )  # bf16 rounding of the states, at most
    assert served.eval is not None and offline.eval is not None
    assert served.eval["predicted_acceptance_length"] == offline.eval["predicted_acceptance_length"]
    assert served.metrics["served"]["fetched"] >= 96 - served.metrics["heldout_samples"]
    assert list(storage.glob("*.safetensors")) == []  # every file read, then deleted

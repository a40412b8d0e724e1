"""`extract --engine vllm` against the real engine's extract_hidden_states method.

The server writes its files through the CPU-safe connector (cpu_hidden_states_connector.py);
what extract stores from them must be what the transformers path stores: ids exact, states
within the codec's rounding (raw stores bf16: one bf16 step). Servers launched the ways
docs/extract.md warns against are refused with the message it promises.
"""

from __future__ import annotations

from pathlib import Path

import launch
import numpy as np
import pytest
from conftest import LAYERS, PLAIN_ARGS, World

from eagle3kit import _ui, extract
from eagle3kit.extract.vllm import ServerError
from eagle3kit.format import HiddenDataset
from eagle3kit.format.state_codecs import to_bf16

QUIET = _ui.OutputOptions(quiet=True)

pytestmark = pytest.mark.vllm


def bf16_step(x: np.ndarray) -> np.ndarray:
    """The gap between consecutive bf16 values at each |x| (8 significant bits)."""
    exponent = np.floor(np.log2(np.maximum(np.abs(x), 2.0**-126)))
    return 2.0 ** (exponent - 7)


def test_a_server_with_prefix_caching_on_is_refused(
    servers, world: World, tokens: Path, tmp_path: Path
) -> None:
    # vLLM's default is prefix caching on: the plain server has it, and the refusal comes from
    # its /metrics before any request (first in this module, while that server still runs).
    server = servers.get("plain", world.target, PLAIN_ARGS)
    message = _refused(server, world, tokens, tmp_path / "out")
    assert "prefix caching is on" in message and "--no-enable-prefix-caching" in message


def _refused(server, world: World, tokens: Path, out: Path) -> str:
    with pytest.raises(ServerError) as caught:
        extract.run(
            extract.ExtractConfig(
                tokens,
                out,
                target=world.target,
                engine="vllm",
                server=server.url,
                layers=LAYERS,
                hidden_states_dir=out.parent,
                output=QUIET,
            )
        )
    assert len(HiddenDataset(out)) == 0 if (out / "manifest.json").is_file() else True
    return str(caught.value)


def test_a_server_launched_without_n_is_refused(
    servers, world: World, tokens: Path, tmp_path: Path
) -> None:
    server = servers.get(
        "extract-without-n",
        world.target,
        [*launch.hidden_states_args(LAYERS, tmp_path / "hs"), "--enforce-eager"],
    )
    message = _refused(server, world, tokens, tmp_path / "out")
    # docs/extract.md: "A server launched without N among its ids ... is refused with a
    # message saying so": the shape it found, and the ids to launch with.
    assert "the file holds states of shape [" in message
    assert "eagle_aux_hidden_state_layer_ids = [2, 4, 5, '<N>']" in message


# Last in this module: the extract server it starts stays up for test_vllm_train_online.
def test_served_states_equal_the_transformers_path(
    hidden: Path, tokens: Path, world: World, extract_server, tmp_path: Path
) -> None:
    served = HiddenDataset(hidden)
    assert served.verify() == [] and served.layer_ids == LAYERS
    assert served.manifest["provenance"]["server"] == extract_server.url
    assert list((world.root / "hs").glob("*.safetensors")) == []  # each file read, deleted
    extract.run(
        extract.ExtractConfig(
            tokens,
            tmp_path / "local",
            target=world.target,
            layers=LAYERS,
            dtype="float32",
            output=QUIET,
        )
    )
    local = {s.sample_id: s for s in HiddenDataset(tmp_path / "local")}
    assert len(served) == len(local) == 96
    differing = total = 0
    for sample in served:
        twin = local[sample.sample_id]
        assert np.array_equal(sample.input_ids, twin.input_ids)
        assert np.array_equal(sample.loss_mask, twin.loss_mask)
        for mine, theirs in ((sample.aux, twin.aux), (sample.last, twin.last)):
            assert mine.shape == theirs.shape
            # Both are bf16 roundings of fp32 states that differ in the last fp32 bits
            # (another kernel order): equal, or a bf16 step apart, where a value near zero
            # may move by one step at the scale of the state's largest value.
            gap = np.abs(mine - theirs)
            assert (gap <= bf16_step(theirs) + bf16_step(np.abs(theirs).max())).all()
            differing += int((to_bf16(mine) != to_bf16(theirs)).sum())
            total += mine.size
    assert differing < total * 0.01  # nearly all bit-equal after rounding

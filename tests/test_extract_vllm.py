"""`extract --engine vllm` against a loopback stand-in that answers and writes files as
vLLM's extract_hidden_states does (testkit/fake_vllm_hidden.py), on the same tiny target.

What the server path stores must be what the transformers path stores; a server launched
with the wrong layer ids, or that cannot be reached, is one clear message.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from extract_world import QUIET, Tiny, build_tiny
from fake_vllm_hidden import FakeVllmHidden

from eagle3kit import extract
from eagle3kit._options import WRITE_KEYS, WriteOptions
from eagle3kit.extract.vllm import ServerError
from eagle3kit.format import HiddenDataset
from eagle3kit.format.state_codecs import to_bf16


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    return build_tiny(tmp_path_factory)


def vllm_config(tiny: Tiny, out: Path, url: str, **options) -> extract.ExtractConfig:
    write = WriteOptions(**{k: options.pop(k) for k in WRITE_KEYS if k in options})
    options.setdefault("hidden_states_dir", out.parent / "shared")
    (out.parent / "shared").mkdir(exist_ok=True)
    return extract.ExtractConfig(
        tiny.tokens,
        out,
        target=tiny.llama,
        engine="vllm",
        server=url,
        output=QUIET,
        concurrency=4,
        write=write,
        **options,
    )


def test_server_states_equal_the_transformers_path(tiny: Tiny, tmp_path: Path) -> None:
    storage = tmp_path / "shared"
    # Aux ids 2, 4, 5 then N = 8 for the last, pre-norm state; files finish after answers.
    server = FakeVllmHidden(tiny.llama, storage, [2, 4, 5, 8], write_delay_s=0.02).start()
    try:
        result = extract.run(vllm_config(tiny, tmp_path / "served", server.url, commit_every=5))
    finally:
        server.stop()
    assert result.written == len(server.requests) == 24
    assert all(r["max_tokens"] == 1 for r in server.requests)
    assert list(storage.iterdir()) == []  # every file read, then deleted

    extract.run(
        extract.ExtractConfig(
            tiny.tokens,
            tmp_path / "local",
            target=tiny.llama,
            batch_tokens=1,
            dtype="float32",
            output=QUIET,
        )
    )
    local = {s.sample_id: s for s in HiddenDataset(tmp_path / "local")}
    served = HiddenDataset(tmp_path / "served")
    assert served.verify() == [] and served.layer_ids == [2, 4, 5]
    assert served.manifest["provenance"]["server"] == server.url
    for sample in served:
        twin = local[sample.sample_id]
        assert np.array_equal(sample.input_ids, twin.input_ids)
        assert np.array_equal(to_bf16(sample.aux), to_bf16(twin.aux))
        assert np.array_equal(to_bf16(sample.last), to_bf16(twin.last))


def test_a_server_without_the_last_layer_is_refused(tiny: Tiny, tmp_path: Path) -> None:
    server = FakeVllmHidden(tiny.llama, tmp_path / "shared", [2, 4, 5]).start()
    try:
        with pytest.raises(ServerError, match=r"eagle_aux_hidden_state_layer_ids = \[2, 4, 5"):
            extract.run(vllm_config(tiny, tmp_path / "out", server.url))
        with pytest.raises(ServerError, match="HTTP 404"):
            extract.run(vllm_config(tiny, tmp_path / "out2", server.url, model="other"))
    finally:
        server.stop()
    for out in ("out", "out2"):  # nothing half-written
        assert len(HiddenDataset(tmp_path / out)) == 0


def test_an_unreachable_server_is_one_message(tiny: Tiny, tmp_path: Path) -> None:
    with pytest.raises(ServerError, match="cannot list its models"):
        extract.run(vllm_config(tiny, tmp_path / "out", "http://127.0.0.1:9"))

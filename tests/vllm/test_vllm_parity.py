"""The parity gate against the real engine, with one setting broken on purpose.

One server configuration of its own: the reduced-vocabulary export with its aux layer ids
rewritten in the other convention (the run's boundary ids 2,4,5 written as the layer-output
ids 1,3,4 where vLLM reads boundary ids: a converter's classic slip). vLLM loads and
speculates with it; the gate reads what it serves from /server_info (the server runs with
VLLM_SERVER_DEV_MODE=1), exits 1 and names the aux layer ids. The other causes are broken
against the stand-ins (tests/test_bench_parity.py); agreement on the sound export is
test_vllm_export.py's.
"""

from __future__ import annotations

import json
from pathlib import Path

import launch
import pytest
from conftest import K, World, bench_parity

from eagle3kit import _ui, export

pytestmark = pytest.mark.vllm
PROMPTS = 8


@pytest.fixture(scope="module")
def broken(drafters: dict, world: World) -> Path:
    out = world.root / "exports" / "aux-other-convention"
    if not out.exists():
        export.run(
            export.ExportConfig(
                drafters["reduced"][0],
                out,
                format="vllm",
                target=world.target,
                num_speculative_tokens=K,
                output=_ui.OutputOptions(quiet=True),
            )
        )
        config = json.loads((out / "config.json").read_text())
        config["eagle_aux_hidden_state_layer_ids"] = [
            i - 1 for i in config["eagle_aux_hidden_state_layer_ids"]
        ]
        (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def test_the_gate_names_aux_ids_in_the_other_convention_served_by_vllm(
    servers, broken: Path, world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")  # read by the server as it starts
    vllm = servers.get(
        "eagle3-aux-other-convention",
        world.target,
        [*launch.eagle3_args(broken, K), "--enforce-eager"],
    )
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(world.bench_prompts.read_text().splitlines(True)[:PROMPTS]))
    gate = bench_parity(
        vllm.url, world.target, broken, prompts, "--max-new-tokens", 64, timeout=1200
    )
    assert gate.returncode == 1, gate.stderr[-3000:]
    report = json.loads(gate.stdout)
    assert report["served"]["source"] == "vLLM /server_info"
    assert report["served"]["method"] == "eagle3" and report["served"]["k"] == K
    found = [f for f in report["findings"] if f["cause"] == "aux-layer-ids"]
    assert found and "layer-output convention" in found[0]["message"], report["findings"]
    assert "aux layer ids [aux-layer-ids]" in " ".join(gate.stderr.split())
    print(
        f"broken aux ids on vLLM: engine {report['engine']['acceptance_length']}, offline "
        f"{report['offline']['acceptance_length']}, findings {report['findings']}"
    )

"""`eagle3kit bench parity` against the SGLang and vLLM stand-ins (tests/fake_spec_server.py):
each cause it names, broken on purpose one at a time, ends in exit 1 naming that cause.

The world: eagle3kit.tiny's target (real tokenizer, Qwen3-style template with `<think>`), a
train-style run for it (examples/make_tiny_run.py: aux ids 2,4,5, 300-token draft vocabulary)
and its `eagle3kit export --format vllm`. The stand-ins answer in the servers' wire formats
with a simulated acceptance; what they say they serve (/server_info, vLLM's /tokenize) is
what each test breaks. Agreement with a real engine is tests/vllm/test_vllm_export.py's.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch
from fake_spec_server import SpecServer
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from eagle3kit import _ui, export
from eagle3kit.bench import parity
from eagle3kit.bench.diagnose import engine_sampling, keeps_almost_nothing
from eagle3kit.bench.probe import worth_probing
from eagle3kit.bench.stats import compare_sampled, length_interval
from eagle3kit.cli import app

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location(
    "make_tiny_run", REPO / "examples" / "make_tiny_run.py"
)
make_tiny_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_tiny_run)

QUIET = _ui.OutputOptions(quiet=True)
NEVER = (0.0, 0.0, 0.0)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    from eagle3kit import tiny

    root = tmp_path_factory.mktemp("parity")
    target = tiny.make_target(root / "target")
    make_tiny_run.make_run(root / "run", target, [2, 4, 5])
    export.run(
        export.ExportConfig(
            root / "run", root / "export", format="vllm", target=target, output=QUIET
        )
    )
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"messages": m}) + "\n" for m in tiny.prompts(2)))
    return {"root": root, "target": target, "drafter": root / "export", "prompts": prompts}


def gate(
    world: dict, srv: SpecServer, drafter: Path | None = None, **options
) -> parity.ParityReport:
    return parity.run(
        parity.ParityConfig(
            srv.url,
            [world["prompts"]],
            world["target"],
            drafter or world["drafter"],
            max_new_tokens=6,
            device="cpu",
            **{"output": QUIET, **options},
        )
    )


def sglang(world: dict, accept=NEVER, **served) -> SpecServer:
    info = {
        "model_path": str(world["target"]),
        "speculative_draft_model_path": str(world["drafter"]),
    } | served
    return SpecServer(
        "sglang",
        accept=accept,
        tokenizer=world["target"],
        model_name=str(world["target"]),
        served=info,
    )


def causes(report: parity.ParityReport) -> list[str]:
    return [f["cause"] for f in report.findings]


def broken_copy(world: dict, tmp_path: Path, config_edit=None, tensors_edit=None) -> Path:
    out = tmp_path / "broken"
    shutil.copytree(world["drafter"], out)
    if config_edit is not None:
        config = json.loads((out / "config.json").read_text())
        config_edit(config)
        (out / "config.json").write_text(json.dumps(config, indent=2))
    if tensors_edit is not None:
        tensors = load_file(str(out / "model.safetensors"))
        tensors_edit(tensors)
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def test_a_sound_setup_names_no_setting_and_fails_only_on_acceptance_near_one(world) -> None:
    with sglang(world) as srv:
        report = gate(world, srv)
    # The run's drafter is untrained: both sides accept nothing, and agree on it.
    assert report.agree and report.engine["acceptance_length"] == pytest.approx(1.0)
    assert report.offline["acceptance_length"] == pytest.approx(1.0)
    assert report.served["method"] == "eagle3" and report.served["source"] == "SGLang /server_info"
    assert causes(report) == ["unexplained"] and "almost nothing" in report.findings[0]["message"]
    assert report.exit_code == 1
    assert set(report.phases) <= {"think", "answer"} and report.phases


def test_a_disagreement_beyond_the_tolerance_fails(world) -> None:
    with sglang(world, accept=(0.9, 0.8, 0.7)) as srv:
        report = gate(world, srv)
    # the stand-in's rates are far above what the tiny drafter reaches offline
    assert not report.agree and report.differences["acceptance_length"] > 4 * report.tolerance
    assert (
        causes(report) == ["unexplained"]
        and "differs from the offline" in report.findings[0]["message"]
    )
    assert report.exit_code == 1


def _aux_other_convention(c: dict) -> None:
    c["eagle_aux_hidden_state_layer_ids"] = [1, 3, 4]


def _d2t_absolute(t: dict) -> None:
    t["d2t"] = t["d2t"] + torch.arange(len(t["d2t"]))


def _random_embedding(t: dict) -> None:
    """A random embedding of the target's shape, where the target's copy belongs."""
    torch.manual_seed(1)
    t["embed_tokens.weight"] = torch.randn(len(t["t2d"]), t["fc.weight"].shape[0])


def _norm_flag(c: dict) -> None:
    c["norm_before_residual"] = not c["norm_before_residual"]


def _rope(c: dict) -> None:
    layer = c["transformer_layer_config"]
    layer["rope_theta"] = 500000.0
    if isinstance(layer.get("rope_parameters"), dict):
        layer["rope_parameters"]["rope_theta"] = 500000.0


def _draft_vocab(c: dict) -> None:
    c["draft_vocab_size"] = 256


BROKEN_DRAFTERS = {
    "aux-layer-ids": (_aux_other_convention, None, "layer-output convention"),
    "d2t": (None, _d2t_absolute, "d2t holds target ids, not offsets"),
    "embed-tokens": (None, _random_embedding, "embed_tokens differs"),
    "norm": (_norm_flag, None, "norm_before_residual"),
    "rope": (_rope, None, "RoPE"),
    "draft-vocab": (_draft_vocab, None, "draft_vocab_size"),
}


@pytest.mark.parametrize("cause", list(BROKEN_DRAFTERS))
def test_each_broken_drafter_setting_is_named(world, tmp_path: Path, cause: str) -> None:
    config_edit, tensors_edit, words = BROKEN_DRAFTERS[cause]
    broken = broken_copy(world, tmp_path, config_edit, tensors_edit)
    with sglang(world, speculative_draft_model_path=str(broken)) as srv:
        report = gate(world, srv, drafter=broken)
    assert cause in causes(report), report.findings
    assert "unexplained" not in causes(report)
    assert any(words in f["message"] for f in report.findings if f["cause"] == cause)
    assert report.exit_code == 1


SERVED = {
    "method": ({"speculative_algorithm": "EAGLE"}, "method 'eagle'"),
    "served-drafter": (
        {"speculative_draft_model_path": "/models/another-drafter"},
        "another-drafter",
    ),
    "served-target": ({"model_path": "/models/another-target"}, "another-target"),
}


@pytest.mark.parametrize("cause", list(SERVED))
def test_each_broken_served_setting_is_named(world, cause: str) -> None:
    served, words = SERVED[cause]
    with sglang(world, **served) as srv:
        report = gate(world, srv)
    assert cause in causes(report) and "unexplained" not in causes(report), report.findings
    assert any(words in f["message"] for f in report.findings)
    assert report.exit_code == 1


def test_vllm_without_dev_mode_is_checked_from_the_speculative_config_given(world) -> None:
    with SpecServer(
        "vllm", accept=NEVER, tokenizer=world["target"], model_name=str(world["target"])
    ) as srv:
        unseen = gate(world, srv)
        given = gate(
            world,
            srv,
            speculative_config=json.dumps(
                {"method": "eagle", "model": str(world["drafter"]), "num_speculative_tokens": 3}
            ),
        )
    assert unseen.served["source"] is None and any(
        "VLLM_SERVER_DEV_MODE" in w for w in unseen.warnings
    )
    assert given.served["source"] == "--speculative-config" and "method" in causes(given)


def test_a_variant_export_is_gated_and_a_lost_layout_flag_is_named(world, tmp_path) -> None:
    """A drafter of speculators' layout (norm_before_fc, norm_before_residual, norm_output)
    exported for vLLM: the gate measures it and agrees; served from a copy whose config lost
    norm_output, the gate names the norm flags."""
    run_dir = tmp_path / "run"
    make_tiny_run.make_run(run_dir, world["target"], [2, 4, 5])
    drafter = run_dir / "drafter"
    config = json.loads((drafter / "config.json").read_text())
    config["eagle3kit"]["drafter"].update(
        norm_before_residual=True, norm_before_fc=True, norm_output=True
    )
    (drafter / "config.json").write_text(json.dumps(config))
    tensors = load_file(str(drafter / "model.safetensors"))
    torch.manual_seed(3)
    tensors["input_norm.weight"] = 1 + 0.3 * torch.randn(tensors["fc.weight"].shape[1])
    save_file(tensors, str(drafter / "model.safetensors"), metadata={"format": "pt"})
    export.run(
        export.ExportConfig(
            run_dir, tmp_path / "export", format="vllm", target=world["target"], output=QUIET
        )
    )
    sound = {**world, "drafter": tmp_path / "export"}
    lost = broken_copy(sound, tmp_path, lambda c: c.update(norm_output=False))
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(world["target"])
    reports = {}
    for name, served in (("sound", sound["drafter"]), ("lost", lost)):
        spec = {"method": "eagle3", "model": str(served), "num_speculative_tokens": 3}
        with SpecServer(
            "vllm",
            accept=NEVER,
            tokenizer=world["target"],
            model_name=str(world["target"]),
            served=spec,
            chat_tokenizer=tokenizer,
        ) as srv:
            reports[name] = gate(world, srv, drafter=served)
    sound_causes = causes(reports["sound"])
    assert reports["sound"].agree and "norm" not in sound_causes, reports["sound"].findings
    assert "checkpoint" not in sound_causes and "served-drafter" not in sound_causes
    assert reports["sound"].offline["acceptance_length"] == pytest.approx(1.0)
    assert "norm" in causes(reports["lost"]) and "unexplained" not in causes(reports["lost"])
    assert any(
        "norm_output is false but the run trained with true" in f["message"]
        for f in reports["lost"].findings
    )


def test_the_server_chat_template_is_compared_with_the_runs(world) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(world["target"])
    served = {"method": "eagle3", "model": str(world["drafter"]), "num_speculative_tokens": 3}
    reports = {}
    for name, prefix in (("same", ()), ("bos", (7,))):
        with SpecServer(
            "vllm",
            accept=NEVER,
            tokenizer=world["target"],
            model_name=str(world["target"]),
            served=served,
            chat_tokenizer=tokenizer,
            chat_prefix=prefix,
        ) as srv:
            reports[name] = gate(world, srv)
    assert reports["same"].served["template_checked"]
    assert reports["same"].served["source"] == "vLLM /server_info"
    assert "chat-template" not in causes(reports["same"])
    assert "chat-template" in causes(reports["bos"])
    assert len(reports["same"].engine["per_position"]) == 3  # vLLM: compared per position


def test_the_command_exits_1_and_names_the_cause(world) -> None:
    with sglang(world, speculative_algorithm="EAGLE") as srv:
        result = CliRunner().invoke(
            app,
            [
                "bench",
                "parity",
                str(world["prompts"]),
                "--server",
                srv.url,
                "--target",
                str(world["target"]),
                "--drafter",
                str(world["drafter"]),
                "--max-new-tokens",
                "6",
                "--device",
                "cpu",
                "--json",
            ],
        )
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["passed"] is False and "method" in [f["cause"] for f in report["findings"]]
    assert "speculative method [method]" in " ".join(result.stderr.split())


def test_bad_input_is_one_message(world, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "parity",
            str(world["prompts"]),
            "--server",
            "http://127.0.0.1:9",
            "--target",
            str(world["target"]),
            "--drafter",
            str(tmp_path / "none"),
        ],
    )
    assert result.exit_code == 2
    assert "--drafter" in result.stderr and "Traceback" not in result.output
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "parity",
            str(world["prompts"]),
            "--server",
            "http://127.0.0.1:9",
            "--target",
            str(world["target"]),
            "--drafter",
            str(world["drafter"]),
            "--speculative-config",
            "{not json",
        ],
    )
    assert result.exit_code == 2 and "--speculative-config" in result.stderr


def test_both_sides_are_compared_per_context_depth(world) -> None:
    """vLLM with --per-request-spec-decode-metrics detailed reports each request's rounds:
    the gate sets them beside bench accept's, bucket by bucket, and names a bucket where they
    differ (the stand-in accepts far more than the untrained drafter)."""
    from eagle3kit.bench.contexts import DepthOptions

    with SpecServer(
        "vllm",
        accept=(0.9, 0.8, 0.7),
        tokenizer=world["target"],
        model_name=str(world["target"]),
        per_request_metrics=True,
    ) as srv:
        report = gate(world, srv, depth=DepthOptions(depth_buckets="1,2"))
        quiet = gate(world, srv)  # the default buckets: every round under 1K
    # Every round is at least 2 tokens deep: all of them fall in the last bucket.
    assert list(report.depths) == [">=2"]
    side = report.depths[">=2"]
    assert side["offline"]["rounds"] == report.offline["rounds"]
    assert side["engine"]["rounds"] == sum(len(r) for _, _, r in srv.log[: len(srv.log) // 2])
    assert side["engine"]["acceptance_length"] == pytest.approx(report.engine["acceptance_length"])
    assert side["difference"] == pytest.approx(
        side["engine"]["acceptance_length"] - side["offline"]["acceptance_length"]
    )
    assert any("at context depth >=2" in w for w in report.warnings), report.warnings
    assert list(quiet.depths) == ["<1K"] and (
        quiet.depths["<1K"]["from"],
        quiet.depths["<1K"]["to"],
    ) == (0, 1024)


def test_sampled_gating_verifies_as_the_server_says_and_names_another_rule(world) -> None:
    """At temperature > 0 bench accept verifies by the rule the server was started with
    (vLLM's draft_sample_method, a missing key being its default greedy: onehot), reports
    the interval the engine's figure must fall in, and names a rule forced to differ."""
    spec = {"method": "eagle3", "model": str(world["drafter"]), "num_speculative_tokens": 3}
    with SpecServer(
        "vllm", accept=NEVER, tokenizer=world["target"], model_name=str(world["target"])
    ) as srv:
        default = gate(world, srv, temperature=0.8, speculative_config=json.dumps(spec))
        served = gate(
            world,
            srv,
            temperature=0.8,
            speculative_config=json.dumps(spec | {"draft_sample_method": "probabilistic"}),
        )
        forced = gate(
            world,
            srv,
            temperature=0.8,
            verify="onehot",
            speculative_config=json.dumps(spec | {"draft_sample_method": "probabilistic"}),
        )
    assert default.verify == "onehot" and default.served["verify"] == "onehot"
    assert served.verify == "probabilistic" and "verification" not in causes(served)
    assert forced.verify == "onehot" and "verification" in causes(forced)
    for report in (default, served, forced):
        interval = report.interval
        assert interval is not None and interval["confidence"] == 0.99
        assert interval["offline_rounds"] == report.offline["rounds"] > 0
        assert interval["low"] <= report.offline["acceptance_length"] <= interval["high"]
    zero = None
    with SpecServer(
        "vllm", accept=NEVER, tokenizer=world["target"], model_name=str(world["target"])
    ) as srv:
        zero = gate(world, srv, speculative_config=json.dumps(spec))
    assert zero.interval is None and zero.verify is None and zero.temperature == 0.0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--temperature", "-1"], "--temperature must be >= 0 (got -1.0)"),
        (["--verify", "greedy"], "--verify must be one of auto, onehot, probabilistic, sglang"),
        (["--top-p", "1.5"], "--top-p must be in (0, 1] (got 1.5)"),
        (["--top-k", "0"], "--top-k must be -1 (off) or at least 1 (got 0)"),
    ],
)
def test_bad_sampling_flags_are_one_message(world, args: list[str], message: str) -> None:
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "parity",
            str(world["prompts"]),
            "--server",
            "http://127.0.0.1:9",
            "--target",
            str(world["target"]),
            "--drafter",
            str(world["drafter"]),
            *args,
        ],
    )
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "Traceback" not in result.output


# The engine's own fault: sampling at temperature > 0 (vLLM 0.32.0's CPU build) --------------
ALWAYS = (1.0, 1.0, 1.0)


@pytest.fixture(scope="module")
def certain(world) -> dict[str, Path]:
    """A target that always says one token and a drafter that always drafts it, exported:
    bench accept keeps every draft at every temperature (the target gives the token
    probability ~1), so a stand-in that keeps every draft at temperature 0 agrees with it
    exactly, and one that keeps none at 1.0 is far outside its interval.

    The token's embedding column 0 is large in every embedding, so the residual stream's
    component 0 is too, in the target's layers and in the drafter's fc output; both final
    norms pass only that component, and both heads map it onto the token alone."""
    import numpy as np

    from eagle3kit.model import build_vocab

    root = world["root"] / "certain"
    target = root / "target"
    shutil.copytree(world["target"], target)
    config = json.loads((target / "config.json").read_text())
    # make_tiny_run's draft vocabulary (seed 0, 300 ids): the token must be one of them.
    vocab = build_vocab(np.random.default_rng(0).integers(0, 50, config["vocab_size"]), 300)
    draft_id = 100
    token = draft_id + int(vocab.d2t[draft_id])
    weights = load_file(str(target / "model.safetensors"))
    weights["model.embed_tokens.weight"][:, 0] = 50.0
    weights["model.norm.weight"].zero_()
    weights["model.norm.weight"][0] = 1.0
    weights["lm_head.weight"].zero_()
    weights["lm_head.weight"][token, 0] = 10.0
    save_file(weights, str(target / "model.safetensors"), metadata={"format": "pt"})
    make_tiny_run.make_run(root / "run", target, [2, 4, 5])
    drafter = root / "run" / "drafter" / "model.safetensors"
    weights = load_file(str(drafter))
    hidden = weights["fc.weight"].shape[0]
    weights["fc.weight"].zero_()
    for aux in range(3):
        weights["fc.weight"][0, aux * hidden] = 1.0
    weights["norm.weight"].zero_()
    weights["norm.weight"][0] = 1.0
    weights["lm_head.weight"].zero_()
    weights["lm_head.weight"][draft_id, 0] = 10.0
    save_file(weights, str(drafter), metadata={"format": "pt"})
    export.run(
        export.ExportConfig(
            root / "run", root / "export", format="vllm", target=target, output=QUIET
        )
    )
    return {**world, "target": target, "drafter": root / "export"}


def vllm_cpu(world: dict, accept=ALWAYS, sampled=NEVER, spec_seed: int = 0) -> SpecServer:
    """A vLLM stand-in that keeps drafts at `accept`'s rates at temperature 0 and at
    `sampled`'s above it (NEVER: the CPU build's broken expand kernel, vllm#55005)."""
    from transformers import AutoTokenizer

    return SpecServer(
        "vllm",
        accept=accept,
        sampled_accept=sampled,
        spec_seed=spec_seed,
        tokenizer=world["target"],
        model_name=str(world["target"]),
        context_length=2048,
        chat_tokenizer=AutoTokenizer.from_pretrained(world["target"]),
    )


def greedy_requests(srv: SpecServer) -> int:
    return sum(
        r["path"] == "/v1/completions" and r["body"]["temperature"] == 0 for r in srv.requests
    )


def test_an_engine_that_keeps_no_sampled_drafts_but_agrees_at_temperature_0_is_named(
    certain,
) -> None:
    with vllm_cpu(certain) as srv:
        result = CliRunner().invoke(
            app,
            [
                "bench",
                "parity",
                str(certain["prompts"]),
                "--server",
                srv.url,
                "--target",
                str(certain["target"]),
                "--drafter",
                str(certain["drafter"]),
                "--temperature",
                "1",
                "--max-new-tokens",
                "6",
                "--device",
                "cpu",
                "--json",
            ],
        )
        probed = greedy_requests(srv)
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["engine"]["acceptance_length"] == pytest.approx(1.0)
    assert report["offline"]["acceptance_length"] == pytest.approx(4.0)
    assert [f["cause"] for f in report["findings"]] == ["engine-sampling"]
    message = report["findings"][0]["message"]
    assert "accepts 4.000, as bench accept does (4.000)" in message
    assert "vllm#55005" in message and "python -m eagle3kit.bench.vllm_cpu_expand_fix" in message
    stderr = " ".join(result.stderr.split())
    assert "the engine's sampling at temperature > 0 [engine-sampling]" in stderr
    assert "the engine's sampling at temperature > 0 is at fault" in stderr
    assert probed == 2  # the probe: both prompts again, at temperature 0


def test_an_engine_that_keeps_sampled_drafts_passes_without_a_probe(certain) -> None:
    with vllm_cpu(certain, sampled=ALWAYS) as srv:
        report = gate(certain, srv, temperature=1.0)
        probed = greedy_requests(srv)
    assert report.passed and report.findings == [], report.findings
    assert report.engine["acceptance_length"] == pytest.approx(4.0) and probed == 0


def test_an_engine_that_keeps_too_few_sampled_drafts_is_named_once_no_rule_explains_it(
    certain, capfd
) -> None:
    """The broken build does not always keep almost nothing (the vllm tier once saw 1.22 a
    round where bench accept kept 1.58): a shortfall short of that is tried against vLLM's
    other rule offline first (the server does not say its own here), and only when that
    misses too does the probe at temperature 0 decide."""
    # spec_seed 1: the stand-in's first draw (0.134) keeps a draft, so the engine keeps some
    # however few rounds the answers make (seed 0 draws two misses first: the full suite once
    # measured 1.000 here, as two rounds in all would).
    with vllm_cpu(certain, sampled=(0.5, 0.5, 0.5), spec_seed=1) as srv:
        report = gate(certain, srv, temperature=1.0, output=_ui.OutputOptions())
        probed = greedy_requests(srv)
    said = " ".join(capfd.readouterr().err.split())
    assert 1.0 < report.engine["acceptance_length"] < 3.0
    assert report.offline["acceptance_length"] == pytest.approx(4.0)
    assert "bench accept again as 'probabilistic'" in said  # the other rule, measured
    assert probed == 2
    assert causes(report) == ["engine-sampling"] and report.exit_code == 1
    message = report.findings[0]["message"]
    assert "keeps fewer drafts than bench accept allows under any rule it has" in message
    assert "(4.000 as verified)" in message and "vllm#55005" in message


def test_an_engine_bad_at_temperature_0_too_is_not_blamed_on_its_sampling(certain) -> None:
    with vllm_cpu(certain, accept=NEVER) as srv:
        report = gate(certain, srv, temperature=1.0)
        probed = greedy_requests(srv)
    assert probed > 0  # probed at temperature 0, where it disagrees with bench accept too
    assert causes(report) == ["unexplained"] and report.exit_code == 1


CI_ROUNDS = [3] * 20 + [2] * 2 + [1] * 10 + [0] * 143
"""bench accept's rounds in a vllm-tier run against vLLM's CPU build as shipped, temperature
1, k = 3: acceptance length 1.423, position 2 kept in 22 of the 32 rounds that kept position
1. The engine kept 32 first drafts in 139 rounds and no second one (1.230)."""


def ci_break() -> tuple[list[list[int]], dict, dict, bool, dict]:
    """CI_ROUNDS over 4 generations against that engine (32 first drafts in 139 rounds, no
    second): (generations, bench accept's interval, compare_sampled's three answers)."""
    generations = [CI_ROUNDS[g::4] for g in range(4)]
    offline = length_interval(generations)
    assert offline is not None
    differences, agree, interval = compare_sampled(
        1 + 32 / 139, 139, 1.423, offline.to_dict(), [32 / 139, 0.0, 0.0], generations
    )
    assert interval is not None
    return generations, offline.to_dict(), differences, agree, interval


def test_a_chain_that_breaks_after_the_first_draft_fails_inside_the_length_interval() -> None:
    generations, offline, _, agree, interval = ci_break()
    assert interval["low"] < 1 + 32 / 139  # the length: inside
    assert agree is False
    assert [b["position"] for b in interval["positions"]] == [2]
    assert interval["positions"][0]["engine"] == 0.0
    assert interval["positions"][0]["offline"] == pytest.approx(22 / 32)
    # The same engine keeping drafts as bench accept does, position by position: agreement.
    sound = [32 / 175, 22 / 175, 20 / 175]
    _, agree, interval = compare_sampled(1.423, 139, 1.423, offline, sound, generations)
    assert agree is True and interval is not None and interval["positions"] == []


def test_a_break_at_a_draft_position_is_named_in_the_failure_line(capfd) -> None:
    """The verdict says where the chain broke: which position, what each side kept of the
    rounds that reached it, and the margin that would have passed."""
    from eagle3kit.bench.parity_report import show_parity

    _, _, differences, agree, interval = ci_break()
    broken = [32 / 139, 0.0, 0.0]
    half = interval["positions"][0]["half_width"]
    report = parity.ParityReport(
        server="http://127.0.0.1:9",
        api="vllm",
        version="0.32.0",
        drafter="d",
        target="t",
        shape="eagle3, k = 3",
        k=3,
        temperature=1.0,
        tolerance=0.02,
        passed=False,
        agree=agree,
        engine={"acceptance_length": 1 + 32 / 139, "per_position": broken, "source": "metrics"},
        offline={
            "acceptance_length": 1.423,
            "per_position": [32 / 175, 22 / 175, 20 / 175],
            "lossless": True,
        },
        differences={**differences, "per_position": []},
        phases={},
        served={},
        findings=[],
        verify="onehot",
        interval=interval,
    )
    show_parity(report, _ui.OutputOptions(no_progress=True))
    said = " ".join(capfd.readouterr().err.split())
    assert (
        "bench parity failed: the engine and bench accept differ at draft position 2 (the "
        f"engine kept 0.000 of the rounds that reached it, bench accept 0.688, ±{half:.3f} "
        "passes)"
    ) in said, said


def test_an_engine_keeping_almost_nothing_is_probed_even_where_chance_admits_it() -> None:
    """A vllm-tier run on 4 prompts: the CPU build as shipped kept 5 first drafts in 150
    rounds where bench accept kept 1.423 a round, most of them on one prompt, which widened
    the interval past 1. The length and the position are inside it, yet an engine keeping
    almost nothing is the broken build's signature: the probe runs."""
    generations = [[3] * 20 + [2] * 2 + [1] * 10 + [0] * 12, [0] * 44, [0] * 44, [0] * 43]
    offline = length_interval(generations)
    assert offline is not None
    engine, per_position = 1 + 5 / 150, [5 / 150, 0.0, 0.0]
    _, agree, interval = compare_sampled(
        engine, 150, 1.423, offline.to_dict(), per_position, generations
    )
    assert agree is True and interval is not None and interval["low"] < 1.0
    garbled = keeps_almost_nothing(engine, per_position)
    assert garbled and worth_probing(engine, garbled, agree, 1.423)
    # Keeping drafts: probed only beyond chance, short of bench accept or above it (the
    # broken build once kept 1.465 a round against 1.423, its chain breaking elsewhere).
    assert not worth_probing(1.3, False, True, 1.423)
    assert worth_probing(1.3, False, False, 1.423)
    assert worth_probing(1.465, False, False, 1.423)
    assert not worth_probing(1.465, False, True, 1.423)
    # bench accept itself keeping almost nothing leaves nothing to probe against.
    assert not worth_probing(1.0, True, True, 1.02)
    # Named for what it did: more than bench accept is not "fewer".
    above = engine_sampling("vllm", 1.0, 1.465, 3.483, 3.483, bench_sampled=1.423)
    assert "keeps drafts at rates bench accept matches under no rule it has (1.423" in (
        above.message
    )
    below = engine_sampling("vllm", 1.0, 1.218, 3.483, 3.483, bench_sampled=1.583)
    assert "keeps fewer drafts than bench accept allows under any rule it has" in below.message


def test_every_cause_has_its_troubleshooting_entry() -> None:
    from eagle3kit.bench.diagnose import CAUSES

    page = (REPO / "docs" / "troubleshooting.md").read_text()
    table = page[page.index("## bench parity: the causes it names") :]
    assert [c for c in CAUSES if f"| `{c}` |" not in table] == []

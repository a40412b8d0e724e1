"""Train's forecast against a decode of the very prompts it held out.

`eagle3kit train` predicts the acceptance length its drafter will reach, on the samples it
held out (`--eval-split`), at the serving temperature and rule (`--eval-temperature`,
`--eval-verify`). This script decodes those samples' prompts again with `bench accept`
(which agrees with the vLLM engine: `bench parity`, tests/vllm/), as long as gen let the
target answer (the data's `max_tokens`), at the forecast's temperature and rule, and prints
the measurement against the forecast:

    python benchmarks/forecast_bench.py RUN_DIR [--tokens TOKENS_DIR] [--out DIR]

RUN_DIR is a finished `train` output; TOKENS_DIR the token dataset its hidden-state data was
extracted from (by default the one the hidden dataset's manifest names). The held-out
samples are chosen as train chooses them (`eagle3kit.train.held_out`, by sample id);
their prompts are the messages gen recorded with each sample. Prompts with several answers
(gen --n) are decoded once each.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from _common import with_testkit

with_testkit()

from eagle3kit.format import Dataset  # noqa: E402
from eagle3kit.train import held_out  # noqa: E402


def selected_eval(run: Path, step: int) -> dict:
    """The held-out evaluation of `step`, the one the run kept (its drafter/)."""
    evals = [
        json.loads(line)["eval"]
        for line in (run / "metrics.jsonl").read_text().splitlines()
        if '"eval"' in line
    ]
    return next(e for e in reversed(evals) if e.get("step") == step)


def heldout_prompts(tokens: Path, eval_split: float, out: Path) -> tuple[Path, int, int]:
    """(the prompts file, prompts, samples) of the samples train held out of `tokens`."""
    samples = list(Dataset(tokens))
    source = SimpleNamespace(ids=[s.sample_id for s in samples])
    (mask,) = held_out([cast(Any, source)], eval_split)
    seen: dict[str, None] = {}
    for sample, held in zip(samples, mask, strict=True):
        if held:
            seen.setdefault(json.dumps({"messages": sample.metadata["messages"]}))
    out.write_text("".join(line + "\n" for line in seen))
    return out, len(seen), int(mask.sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a finished eagle3kit train output directory")
    ap.add_argument("--tokens", type=Path, help="the token dataset (default: the manifest's)")
    ap.add_argument("--out", type=Path, help="where the prompts and the report go (default RUN)")
    ap.add_argument("--seed", type=int, default=0, help="bench accept's sampling seed")
    args = ap.parse_args()
    run_record = json.loads((args.run / "run.json").read_text())
    settings = run_record["settings"]
    hidden = Path(settings["data"][0]["path"])
    manifest = json.loads((hidden / "manifest.json").read_text())
    tokens = args.tokens or Path(manifest["provenance"]["tokens"])
    out = args.out or args.run
    out.mkdir(parents=True, exist_ok=True)
    forecast = selected_eval(args.run, run_record["selection"]["step"])
    prompts, n_prompts, n_samples = heldout_prompts(
        tokens, settings["eval_split"], out / "forecast-prompts.jsonl"
    )
    max_tokens = manifest["hidden"]["tokens"]["sampling"]["max_tokens"]
    temperature = forecast["temperature"]
    verify = settings.get("eval_verify", "onehot")
    argv = [
        sys.executable,
        "-m",
        "eagle3kit",
        "bench",
        "accept",
        str(prompts),
        "--target",
        str(settings["target"]),
        "--drafter",
        str(args.run / "drafter"),
        "--k",
        str(forecast["k"]),
        "--temperature",
        str(temperature),
        *(["--verify", verify] if temperature > 0 else []),
        "--seed",
        str(args.seed),
        "--max-new-tokens",
        str(max_tokens),
        "--device",
        "cpu",
        "--json",
        "-q",
    ]
    print(
        f"{n_samples} held-out samples, {n_prompts} prompts, {max_tokens} new tokens, "
        f"T = {temperature:g}",
        file=sys.stderr,
    )
    measured = json.loads(subprocess.run(argv, check=True, capture_output=True, text=True).stdout)
    kept = measured["per_position"]
    conditional = [kept[0], *(b / a if a else 0.0 for a, b in itertools.pairwise(kept))]
    report = {
        "run": str(args.run),
        "temperature": temperature,
        "prediction": forecast.get("prediction"),
        "predicted": forecast["predicted_acceptance_length"],
        "predicted_per_position": forecast["per_position"],
        "predicted_chains": forecast["chains"],
        "measured": measured["acceptance_length"],
        "measured_per_position": conditional,
        "measured_rounds": measured["rounds"],
        "ratio": forecast["predicted_acceptance_length"] / measured["acceptance_length"],
        "prompts": n_prompts,
    }
    (out / "forecast.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    print(
        f"forecast {report['predicted']:.3f} ({report['prediction']}), bench accept "
        f"{report['measured']:.3f} over {report['measured_rounds']} rounds: "
        f"{report['ratio']:.3f}x",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()

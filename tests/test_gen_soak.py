"""The fault soak of benchmarks/gen_soak.py, smaller: 1,500 samples through every fault.

The script itself checks the dataset (every sample once, each prompt and completion exactly
what the stand-in's deterministic model gives, nothing left failed, no request held past
--request-timeout, no run without progress); here its verdict must be a pass, with the
faults really injected. The 20,000-request run is `python benchmarks/gen_soak.py`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import gen_soak


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_gen_rides_out_every_fault_and_reruns_to_an_exact_dataset(tmp_path):
    args = gen_soak.parse_args(
        ["--requests", "1500", "--event-every", "2", "--seed", "1", "--dir", str(tmp_path)]
    )
    figures = gen_soak.soak_run(args)
    print(gen_soak.render(figures))
    assert figures["problems"] == []
    assert figures["samples"] == figures["expected"] == 1500 and figures["duplicates"] == 0
    faults = figures["faults"]
    assert faults["disk_full"] == 1  # the disk filled once, then was grown
    assert faults["malformed_ids"] > 0 and faults["503"] > 0 and faults["abort"] > 0
    assert faults["storms"] + faults["restarts_same_model"] + faults["restarts_other_model"] > 0
    assert figures["reruns"] >= 1 and figures["retries"] > 0
    assert figures["longest_hang_s"] <= args.request_timeout + gen_soak.HANG_SLACK_S

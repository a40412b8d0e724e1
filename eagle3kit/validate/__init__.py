"""`eagle3kit validate`: the checks a token dataset must pass before any GPU time is spent.

Every check runs over the shards' flat token arrays with numpy (figures.py), so a dataset of
tens of millions of tokens is checked in seconds without decoding a sample to text. Each
check is a small function in a registry (checks.py) returning its row from the figures; the
result is a `ValidateReport` (report.py) that collects every finding, damaged shards
included; the CLI turns it into the exit status (0 all passed, 1 a check failed, 2 unusable
input). What a correct final turn looks like is learned from the template by
chat/reasoning.py. See docs/validate.md.

Importing this package loads the config only (`validate --help` loads no numpy); the rest
loads on first use.
"""

from typing import TYPE_CHECKING

from eagle3kit._lazy import attribute_loader
from eagle3kit.validate.config import CHECKS, ValidateConfig

_HOMES = {"CheckResult": "checks", "ValidateReport": "report", "run": "run", "validate": "run"}

if TYPE_CHECKING:
    from eagle3kit.validate.checks import CheckResult
    from eagle3kit.validate.report import ValidateReport
    from eagle3kit.validate.run import run, validate

__getattr__ = attribute_loader(__name__, _HOMES)

__all__ = ["CHECKS", "CheckResult", "ValidateConfig", "ValidateReport", "run", "validate"]

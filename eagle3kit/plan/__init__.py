"""`eagle3kit plan`: a gen run's hours, tokens and disk, forecast from a pilot of it (run.py,
over pilot.py, slots.py, result.py and report.py); its settings in config.py. The face other
code imports."""

from eagle3kit.plan.config import PlanConfig
from eagle3kit.plan.pilot import allocate, pilot_size
from eagle3kit.plan.result import Estimate, PlanResult
from eagle3kit.plan.run import run, target_shape
from eagle3kit.plan.slots import chain_makespan, exact_tail, fifo_makespan, makespan

__all__ = [
    "Estimate",
    "PlanConfig",
    "PlanResult",
    "allocate",
    "chain_makespan",
    "exact_tail",
    "fifo_makespan",
    "makespan",
    "pilot_size",
    "run",
    "target_shape",
]

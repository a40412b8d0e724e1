"""`eagle3kit plan`: a gen run's hours, tokens and disk, forecast from a pilot of it (run.py);
its settings in config.py. The face other code imports."""

from eagle3kit.plan.config import PlanConfig
from eagle3kit.plan.run import (
    Estimate,
    PlanResult,
    allocate,
    chain_makespan,
    exact_tail,
    fifo_makespan,
    makespan,
    pilot_size,
    run,
    target_shape,
)

__all__ = ["Estimate", "PlanConfig", "PlanResult", "allocate", "chain_makespan", "exact_tail",
           "fifo_makespan", "makespan", "pilot_size", "run", "target_shape"]

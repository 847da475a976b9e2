"""curvplan planner: curvature measurements → data budget (numpy/scipy only).

Public entry point: `make_plan(measurements, targets, *, seed=0) -> Recommendation`.
"""

from app.planner.plan import make_plan
from app.planner.schemas import (
    Measurements,
    PlanInputError,
    Recommendation,
    Targets,
    check_workload,
)

__all__ = [
    "Measurements",
    "PlanInputError",
    "Recommendation",
    "Targets",
    "check_workload",
    "make_plan",
]

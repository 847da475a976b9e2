"""curvplan planner: curvature measurements → data budget (numpy/scipy only).

Public entry point: `make_plan(measurements, targets, *, seed=0) -> Recommendation`.

`make_plan` is imported lazily: the API validates plan bodies with the schemas alone,
and loading scipy's fitting code in every API process start cost about 2 s.
"""

from typing import TYPE_CHECKING, Any

from curvplan.types.planner import (
    Measurements,
    PlanInputError,
    Recommendation,
    Targets,
    check_workload,
)

if TYPE_CHECKING:
    from curvplan_core.planner.plan import make_plan

__all__ = [
    "Measurements",
    "PlanInputError",
    "Recommendation",
    "Targets",
    "check_workload",
    "make_plan",
]


def __getattr__(name: str) -> Any:
    if name == "make_plan":
        from curvplan_core.planner.plan import make_plan

        return make_plan
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

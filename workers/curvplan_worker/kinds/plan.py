"""The ``plan`` kind: measurements + targets → recommendation (docs/formulas.md)."""

from __future__ import annotations

import uuid

from curvplan.types.jobs import PlanJobCreate
from curvplan.types.planner import PlanInputError
from curvplan.types.results import PlanResult
from curvplan_core.planner import make_plan
from curvplan_core.planner.cancel import PlanCancelled, cancel_scope
from curvplan_worker.errors import JobCancelled, JobError
from curvplan_worker.job_context import JobContext


def _cancel_requested(ctx: JobContext) -> bool:
    try:
        ctx.check_cancelled()
    except JobCancelled:
        return True
    return False


def seed_for_job(job_id: str) -> int:
    """A seed fixed per job, so that every attempt of a job draws the same orderings."""
    return uuid.UUID(job_id).int % (2**31)


def run(request: PlanJobCreate, ctx: JobContext) -> PlanResult:
    """Run the planner on the request's measurements and targets (validated with the request,
    workload cap included: ``PlanJobCreate``)."""
    ctx.report_progress(0.0, "validate", "validating measurements and targets")
    measurements, targets = request.measurements, request.targets
    if measurements is None:  # a stored request always holds them (parse_stored_request)
        raise JobError("invalid-request", "Invalid plan request", "measurements: Field required")
    seed = targets.seed if targets.seed is not None else seed_for_job(ctx.job_id)
    ctx.report_progress(0.05, "plan", "fitting the data-budget model")
    with cancel_scope(lambda: _cancel_requested(ctx)):  # checked between orderings
        try:
            recommendation = make_plan(measurements, targets, seed=seed)
        except PlanCancelled:
            raise JobCancelled() from None
        except PlanInputError as exc:  # inputs beyond what float64 carries through the plan
            raise JobError("invalid-request", "Invalid plan request", str(exc)[:300]) from None
    ctx.report_progress(1.0, "done", "recommendation ready")
    return PlanResult(recommendation=recommendation)

"""The ``plan`` kind: measurements + targets → recommendation (docs/formulas.md)."""

from __future__ import annotations

import json
import uuid
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from curvplan_core.planner import Measurements, PlanInputError, Targets, check_workload, make_plan
from curvplan_core.planner.cancel import PlanCancelled, cancel_scope
from curvplan_worker.errors import JobCancelled, JobError
from curvplan_worker.job_context import JobContext

ModelT = TypeVar("ModelT", bound=BaseModel)


def _field_path(prefix: str, loc: tuple[Any, ...]) -> str:
    return ".".join([prefix, *(str(part) for part in loc)])


def _validate(model: type[ModelT], value: Any, field: str) -> ModelT:
    """Validate ``value`` as ``model`` (JSON semantics); JobError naming the failing field."""
    if not isinstance(value, dict):
        raise JobError(
            "invalid-request",
            "Invalid plan request",
            f"{field}: expected an object, got {type(value).__name__}",
        )
    try:
        # JSON mode: the stored request is JSON, so arrays are valid for tuple fields.
        return model.model_validate_json(json.dumps(value))
    except ValidationError as exc:
        first = exc.errors()[0]
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise JobError(
            "invalid-request",
            "Invalid plan request",
            f"{_field_path(field, tuple(first['loc']))}: {first['msg']}{more}",
        ) from None


def _cancel_requested(ctx: JobContext) -> bool:
    try:
        ctx.check_cancelled()
    except JobCancelled:
        return True
    return False


def seed_for_job(job_id: str) -> int:
    """A seed fixed per job, so that every attempt of a job draws the same orderings."""
    return uuid.UUID(job_id).int % (2**31)


def run(request: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Run the planner on ``request["measurements"]`` and ``request["targets"]``."""
    ctx.report_progress(0.0, "validate", "validating measurements and targets")
    measurements = _validate(Measurements, request.get("measurements"), "measurements")
    targets = _validate(Targets, request.get("targets") or {}, "targets")
    try:
        check_workload(measurements, targets)
    except PlanInputError as exc:
        raise JobError("invalid-request", "Invalid plan request", str(exc)) from None
    seed = targets.seed if targets.seed is not None else seed_for_job(ctx.job_id)
    ctx.report_progress(0.05, "plan", "fitting the data-budget model")
    with cancel_scope(lambda: _cancel_requested(ctx)):  # checked between orderings
        try:
            recommendation = make_plan(measurements, targets, seed=seed)
        except PlanCancelled:
            raise JobCancelled() from None
    ctx.report_progress(1.0, "done", "recommendation ready")
    return {"recommendation": recommendation.model_dump(mode="json")}

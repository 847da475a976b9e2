"""What ``POST /v1/jobs`` checks of a validated body before it queues the job, for every kind.

The kinds are declared once, in ``curvplan.types.jobs``: each create model names its
artifact fields and whether clients may submit it. From those, every kind's body gets the
same treatment here, in the transaction that inserts the job:

1. an internal kind (``client_submittable = False``) is refused with a 422 at ``body.kind``
   (the router's validation already refuses it; this guards any other caller);
2. every artifact id it names must be an artifact of the caller's project of the declared
   kind — else a 422 naming the field, e.g. ``body.train_data`` — and the rows stay locked
   (``FOR KEY SHARE``) until the job, and its ``job_artifact`` rows, are committed;
3. then the kind's own checks, the ones that need the database or the service's settings,
   declared below for its create model (its :class:`KindSubmission`'s ``check``). A check
   returns the body to queue (a re-plan completes its measurements);
4. last, a kind that fans out at submission (its ``fan_out``: ``analyze``, by its estimated
   cost) says which children to insert with the job (:func:`plan_fan_out`); its admission
   errors (``too-large``, ``over-time-limit``) are 422s, before anything is queued.

The rest of a kind (queue, artifact fields, result model, time limit, fail-fast rule) is
declared on its create model; these are the parts that need the server (the database, the
blob store), so they cannot sit in the contract package.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar
from uuid import UUID

from sqlalchemy.orm import Session

from curvplan.types.jobs import (
    CLIENT_JOB_KINDS,
    INTERNAL_JOB_KINDS,
    AnalyzeJobCreate,
    JobCreateModel,
    PlanJobCreate,
    SweepJobCreate,
    artifact_references,
    kind_name,
)
from curvplan_core.config import Settings
from curvplan_server.analyze import admission, references, replan
from curvplan_server.analyze.admission import SubmissionFanOut
from curvplan_server.artifacts.service import check_references
from curvplan_server.problems import Problem, validation_problem


@dataclass(frozen=True, slots=True)
class SubmissionContext:
    """Where a body is being submitted: the caller's project and the service's limits."""

    session: Session
    project_id: UUID
    data_dir: Path  # the blob store a re-plan reads from
    max_model_parameters: int | None = None  # the largest Hugging Face model (None: any)
    max_job_devices: int = 1
    settings: Settings | None = None  # the fan-out's and the admission's limits (None: none)


BodyT = TypeVar("BodyT", bound=JobCreateModel)


@dataclass(frozen=True, slots=True)
class KindSubmission(Generic[BodyT]):
    """The server's part of a kind, declared for its create model: ``check`` (its validated
    body in, the body to queue out; a 422/409 problem for a bad one) and ``fan_out`` (the
    children to insert with the job, None: it runs alone). A kind without them gets only the
    checks every kind gets."""

    create_type: type[BodyT]
    check: Callable[[SubmissionContext, BodyT], BodyT] | None = None
    fan_out: Callable[[SubmissionContext, BodyT], SubmissionFanOut | None] | None = None


def _check_plan(ctx: SubmissionContext, body: PlanJobCreate) -> PlanJobCreate:
    return replan.complete_replan(ctx.session, ctx.project_id, body, ctx.data_dir)


def _check_analyze(ctx: SubmissionContext, body: AnalyzeJobCreate) -> AnalyzeJobCreate:
    references.check_job_devices(body, ctx.max_job_devices)
    references.check_model_size(body, ctx.max_model_parameters)
    references.check_artifact_contents(ctx.session, ctx.project_id, body)
    return body


def _fan_out_analyze(ctx: SubmissionContext, body: AnalyzeJobCreate) -> SubmissionFanOut | None:
    if ctx.settings is None:
        return None
    # planned on the validated model (block_definitions in the stored row's key order)
    return admission.admit_analysis(ctx.session, ctx.project_id, body, ctx.settings)


def _check_sweep(ctx: SubmissionContext, body: SweepJobCreate) -> SweepJobCreate:
    references.check_model_size(body, ctx.max_model_parameters)
    references.check_branch_checkpoints(ctx.session, ctx.project_id, body.checkpoints)
    references.check_optimizer_states(
        ctx.session, ctx.project_id, body.checkpoints, body.optimizer_states
    )
    return body


PLAN = KindSubmission(PlanJobCreate, check=_check_plan)
#: An analysis is admitted (and fanned out) by its estimated cost
#: (docs/operations.md#fan-out-at-submission).
ANALYZE = KindSubmission(AnalyzeJobCreate, check=_check_analyze, fan_out=_fan_out_analyze)
SWEEP = KindSubmission(SweepJobCreate, check=_check_sweep)

#: create model → the server's part of its kind (by type: mypy checks each hook's body type).
KIND_SUBMISSIONS: Mapping[type[JobCreateModel], KindSubmission[Any]] = {
    s.create_type: s for s in (PLAN, ANALYZE, SWEEP)
}


def submission_of(create_type: type[BodyT]) -> KindSubmission[BodyT]:
    """The server's part of the kind of ``create_type`` (a bare one for a kind that declares
    none)."""
    declared: KindSubmission[BodyT] | None = KIND_SUBMISSIONS.get(create_type)
    return declared if declared is not None else KindSubmission(create_type)


def plan_fan_out(ctx: SubmissionContext, body: JobCreateModel) -> SubmissionFanOut | None:
    """The children to insert with a checked body (None: it runs alone); raises a 422 for an
    analysis that cannot be admitted."""
    fan_out = submission_of(type(body)).fan_out
    return None if fan_out is None else fan_out(ctx, body)


def internal_kind_message(kind: str) -> str:
    """Why a client may not submit ``kind`` (the 422's message at ``body.kind``)."""
    allowed = ", ".join(repr(k) for k in CLIENT_JOB_KINDS)
    return (
        f"jobs of kind {kind!r} are created by the service (a fan-out's children), not "
        f"submitted; submit one of {allowed}"
    )


def internal_kind_problem(kind: str) -> Problem:
    """422 at ``body.kind`` for an internal kind."""
    return validation_problem(
        [
            {
                "field": "body.kind",
                "loc": ["body", "kind"],
                "message": internal_kind_message(kind),
                "type": "internal_kind",
            }
        ]
    )


def prepare_job_body(ctx: SubmissionContext, body: JobCreateModel) -> JobCreateModel:
    """Check (and, for re-plans, complete) a validated client body (its create model); raises
    a 422/409 problem."""
    kind = kind_name(type(body))
    if kind in INTERNAL_JOB_KINDS:
        raise internal_kind_problem(kind)
    check_references(ctx.session, ctx.project_id, artifact_references(kind, body))
    check = submission_of(type(body)).check
    return body if check is None else check(ctx, body)

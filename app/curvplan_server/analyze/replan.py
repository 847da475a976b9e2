"""Re-plan a finished analysis: ``POST /v1/jobs {"kind": "plan", "from_job": <analyze id>}``.

The analyze job's result keeps the planner's inputs without the bulky arrays
(``result.planner_inputs``: scalar fields inline, per-sample and perturbed losses as job
artifacts). This module reads them back typed (:class:`StoredPlannerInputs`), loads the arrays
from the artifacts and validates the full ``Measurements`` from them in one strict pass (the
plan job's own validation, no JSON text in between), so the plan job that is queued is an
ordinary plan job with its measurements copied in (a snapshot: the analysis cannot change
after it succeeded).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field, JsonValue, StrictFloat, ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from curvplan.types.jobs import PlanJobCreate
from curvplan.types.planner import Measurements
from curvplan_core.artifacts.blobstore import BlobStore, default_store
from curvplan_core.jobs.models import Job
from curvplan_server.artifacts.models import Artifact
from curvplan_server.problems import Problem, conflict, validation_problem

if TYPE_CHECKING:
    import numpy as np

JOB = Job.__table__
ARTIFACT = Artifact.__table__


# --------------------------------------------------------------------------- the stored form
class ArrayRef(BaseModel):
    """A bulky planner input kept in an output artifact of the analysis: the tensor
    ``tensor`` of the safetensors artifact ``artifact_id``."""

    model_config = ConfigDict(frozen=True)

    artifact_id: uuid.UUID
    tensor: str = Field(min_length=1)


class PerturbedRef(ArrayRef):
    """The perturbed-loss set the planner was given: its rows in the artifact, its radius and
    kind inline (``curvplan.types.planner.PerturbedLosses``)."""

    radius: StrictFloat
    kind: Literal["random", "top_eigenspace"]


class StoredArrays(BaseModel):
    """``planner_inputs.arrays``: which ``Measurements`` fields live in artifacts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    per_sample_losses: ArrayRef | None = None
    per_sample_groups: ArrayRef | None = None
    perturbed_losses: PerturbedRef | None = None


class StoredPlannerInputs(BaseModel):
    """``result.planner_inputs`` of an analyze job, as the worker stores it."""

    model_config = ConfigDict(frozen=True)

    # The Measurements fields other than the arrays, as the worker stored them: arbitrary JSON
    # here on purpose, validated (strictly) by Measurements itself together with the arrays.
    fields: dict[str, JsonValue] = Field(default_factory=dict)
    arrays: StoredArrays = Field(default_factory=StoredArrays)


class _StoredResult(BaseModel):
    """The part of an analyze job's result a re-plan reads (the rest is ignored)."""

    planner_inputs: StoredPlannerInputs | None = None


class _PerturbedRows(TypedDict):
    radius: float
    kind: Literal["random", "top_eigenspace"]
    losses: list[list[float]]


class PlannerArrays(TypedDict, total=False):
    """The bulky ``Measurements`` fields read back from the artifacts."""

    per_sample_losses: list[float]
    per_sample_groups: list[int]
    perturbed_losses: _PerturbedRows


# --------------------------------------------------------------------------- reading
def _from_job_error(message: str, type_: str) -> Problem:
    loc: list[str | int] = ["body", "from_job"]
    return validation_problem(
        [{"field": "body.from_job", "loc": loc, "message": message, "type": type_}],
        detail=f"body.from_job: {message}",
    )


def stored_planner_inputs(
    session: Session, project_id: uuid.UUID, job_id: uuid.UUID
) -> StoredPlannerInputs:
    """The stored planner inputs of a succeeded analyze job of the project.

    422 naming ``from_job`` when the job is not the project's or not an analyze job; 409
    while it has not succeeded (or failed/cancelled: there is nothing to re-plan) and when it
    holds no planner inputs that can be read.
    """
    row = session.execute(
        select(JOB.c.kind, JOB.c.status, JOB.c.result).where(
            JOB.c.id == job_id, JOB.c.project_id == project_id
        )
    ).first()
    if row is None:
        raise _from_job_error(f"job {job_id} not found in this project", "job_not_found")
    if row.kind != "analyze":
        raise _from_job_error(
            f"job {job_id} is a {row.kind} job; from_job must name an analyze job", "job_kind"
        )
    if row.status != "succeeded":
        raise conflict(
            f"job {job_id} is {row.status}; an analysis can be re-planned once it has succeeded",
            job_status=row.status,
        )
    try:
        inputs = _StoredResult.model_validate(row.result or {}).planner_inputs
    except ValidationError as exc:  # e.g. an array this version does not know how to read
        raise conflict(
            f"job {job_id}'s planner inputs cannot be read for a re-plan: {exc}"[:500],
            job_status=row.status,
        ) from None
    if inputs is None:
        raise conflict(f"job {job_id} holds no planner inputs to re-plan", job_status=row.status)
    return inputs


def read_arrays(
    arrays: StoredArrays, load: Callable[[uuid.UUID], dict[str, np.ndarray]]
) -> PlannerArrays:
    """The bulky fields from their artifacts (``load``: artifact id → its tensors)."""
    loaded: dict[uuid.UUID, dict[str, np.ndarray]] = {}

    def tensor(ref: ArrayRef) -> np.ndarray:
        if ref.artifact_id not in loaded:
            loaded[ref.artifact_id] = load(ref.artifact_id)
        try:
            return loaded[ref.artifact_id][ref.tensor]
        except KeyError:
            raise conflict(
                f"artifact {ref.artifact_id} of the analysis holds no tensor {ref.tensor!r}"
            ) from None

    out = PlannerArrays()
    if arrays.per_sample_losses is not None:
        out["per_sample_losses"] = tensor(arrays.per_sample_losses).astype(float).tolist()
    if arrays.per_sample_groups is not None:
        out["per_sample_groups"] = tensor(arrays.per_sample_groups).astype("int64").tolist()
    perturbed = arrays.perturbed_losses
    if perturbed is not None:
        out["perturbed_losses"] = _PerturbedRows(
            radius=perturbed.radius,
            kind=perturbed.kind,
            losses=tensor(perturbed).astype(float).tolist(),  # the set the planner was given
        )
    return out


def measurements_from_job(
    session: Session, project_id: uuid.UUID, job_id: uuid.UUID, data_dir: Path
) -> Measurements:
    """The ``measurements`` of a succeeded analyze job of the project: its stored fields and
    its arrays, validated as a plan job's (strict; the same values the analysis planned with).

    Errors as :func:`stored_planner_inputs`; 410 when an artifact is no longer stored, 409
    when the measurements no longer fit the planner.
    """
    inputs = stored_planner_inputs(session, project_id, job_id)
    store = default_store(data_dir)
    return planner_measurements(
        inputs, lambda artifact_id: _load(session, store, project_id, artifact_id)
    )


def planner_measurements(
    inputs: StoredPlannerInputs, load: Callable[[uuid.UUID], dict[str, np.ndarray]]
) -> Measurements:
    """``Measurements`` from stored planner inputs, the arrays read with ``load`` (artifact id
    → its tensors): validated as a plan job's, strictly, in one pass (the cross-field checks
    included). 409 when they no longer fit the planner."""
    arrays = read_arrays(inputs.arrays, load)
    try:
        return Measurements.model_validate({**inputs.fields, **arrays})
    except ValidationError as exc:
        raise Problem(
            409,
            f"the analysis's stored measurements no longer fit the planner: {exc}"[:500],
            title="Conflict",
        ) from None


def complete_replan(
    session: Session, project_id: uuid.UUID, body: PlanJobCreate, data_dir: Path
) -> PlanJobCreate:
    """A plan body with ``from_job``, completed with that analysis's measurements (a plan
    body without it is returned as is). 409 when they no longer fit the planner."""
    if body.from_job is None:
        return body
    measurements = measurements_from_job(session, project_id, body.from_job, data_dir)
    # Stored with from_job: the worker reads it in the stored context (parse_stored_request).
    return body.model_copy(update={"measurements": measurements})


def _load(
    session: Session, store: BlobStore, project_id: uuid.UUID, artifact_id: uuid.UUID
) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    sha256 = session.execute(
        select(ARTIFACT.c.sha256).where(
            ARTIFACT.c.id == artifact_id, ARTIFACT.c.project_id == project_id
        )
    ).scalar_one_or_none()
    path = store.path_for(sha256) if sha256 else None
    if path is None or not path.is_file():
        raise Problem(
            410,
            f"artifact {artifact_id} of the analysis is no longer stored; run the analysis again",
            title="Gone",
        )
    return dict(load_file(str(path)))

"""Re-plan a finished analysis: ``POST /v1/jobs {"kind": "plan", "from_job": <analyze id>}``.

The analyze job's result keeps the planner's inputs without the bulky arrays
(``result.planner_inputs``: scalar fields inline, per-sample and perturbed losses as job
artifacts). This module rebuilds the full ``measurements`` object from them, so the plan
job that is queued is an ordinary plan job with its measurements copied in (a snapshot:
the analysis cannot change after it succeeded).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import JsonValue, ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from curvplan.types.jobs import PlanJobCreate
from curvplan.types.planner import Measurements
from curvplan_core.artifacts.blobstore import default_store
from curvplan_core.jobs.models import Job
from curvplan_server.artifacts.models import Artifact
from curvplan_server.problems import Problem, conflict, validation_problem

if TYPE_CHECKING:
    import numpy as np

JOB = Job.__table__
ARTIFACT = Artifact.__table__


def _from_job_error(message: str, type_: str) -> Problem:
    loc: list[str | int] = ["body", "from_job"]
    return validation_problem(
        [{"field": "body.from_job", "loc": loc, "message": message, "type": type_}],
        detail=f"body.from_job: {message}",
    )


def measurements_from_job(
    session: Session, project_id: uuid.UUID, job_id: uuid.UUID, data_dir: Path
) -> dict[str, JsonValue]:
    """The ``measurements`` of a succeeded analyze job of the project, as JSON.

    422 naming ``from_job`` when the job is not the project's or not an analyze job; 409
    while it has not succeeded (or failed/cancelled: there is nothing to re-plan).
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
    inputs = (row.result or {}).get("planner_inputs")
    if not isinstance(inputs, dict):
        raise conflict(f"job {job_id} holds no planner inputs to re-plan", job_status=row.status)
    fields: dict[str, JsonValue] = dict(inputs.get("fields") or {})
    arrays = inputs.get("arrays") or {}
    store = default_store(data_dir)
    losses_ref = arrays.get("per_sample_losses")
    if losses_ref is not None:
        tensors = _load(session, store, project_id, losses_ref["artifact_id"])
        fields["per_sample_losses"] = tensors[losses_ref["tensor"]].astype(float).tolist()
    groups_ref = arrays.get("per_sample_groups")
    if groups_ref is not None:
        tensors = _load(session, store, project_id, groups_ref["artifact_id"])
        fields["per_sample_groups"] = tensors[groups_ref["tensor"]].astype("int64").tolist()
    perturbed_ref = arrays.get("perturbed_losses")
    if perturbed_ref is not None:
        tensors = _load(session, store, project_id, perturbed_ref["artifact_id"])
        rows = tensors[perturbed_ref["tensor"]]  # the set the planner was given
        fields["perturbed_losses"] = {
            "radius": perturbed_ref["radius"],
            "kind": perturbed_ref["kind"],
            "losses": rows.astype(float).tolist(),
        }
    return fields


def complete_replan(
    session: Session, project_id: uuid.UUID, body: PlanJobCreate, data_dir: Path
) -> PlanJobCreate:
    """A plan body with ``from_job``, completed with that analysis's measurements (a plan
    body without it is returned as is). 409 when they no longer fit the planner."""
    if body.from_job is None:
        return body
    fields = measurements_from_job(session, project_id, body.from_job, data_dir)
    try:
        measurements = Measurements.model_validate_json(json.dumps(fields))
    except ValidationError as exc:
        raise Problem(
            409,
            f"the analysis's stored measurements no longer fit the planner: {exc}"[:500],
            title="Conflict",
        ) from None
    # Stored with from_job: the worker reads it in the stored context (parse_stored_request).
    return body.model_copy(update={"measurements": measurements})


def _load(
    session: Session, store: Any, project_id: uuid.UUID, artifact_id: str
) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    sha256 = session.execute(
        select(ARTIFACT.c.sha256).where(
            ARTIFACT.c.id == uuid.UUID(artifact_id), ARTIFACT.c.project_id == project_id
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

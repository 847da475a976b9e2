"""Checks of a job body against the database, run before the job is queued.

``prepare_job_body`` is called by ``POST /v1/jobs`` after the body's schema validation, in
the same transaction as the insert. For an ``analyze`` job every artifact id must be an
artifact of the caller's project with the right kind (else a 422 naming the field). Plan
jobs without references pass through untouched (no database work on the hot path).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from curvplan.types.planner import Measurements
from curvplan_server.artifacts.service import ArtifactRef, check_references
from curvplan_server.problems import Problem


def analyze_references(body: dict[str, Any]) -> list[ArtifactRef]:
    """The artifact fields of a validated analyze body, with the kind each must have."""
    refs = [
        ArtifactRef(("checkpoint",), uuid.UUID(body["checkpoint"]), "checkpoint"),
        ArtifactRef(("dataset",), uuid.UUID(body["dataset"]), "dataset"),
    ]
    for i, artifact_id in enumerate(body.get("intermediate_checkpoints") or []):
        refs.append(
            ArtifactRef(("intermediate_checkpoints", i), uuid.UUID(artifact_id), "checkpoint")
        )
    return refs


def prepare_job_body(
    session: Session, project_id: uuid.UUID, body: dict[str, Any], data_dir: Path
) -> dict[str, Any]:
    """Check (and, for re-plans, complete) a validated job body; raises a 422/409 problem.

    ``data_dir`` is the service's data directory (the blob store a re-plan reads from).
    """
    if body["kind"] == "analyze":
        check_references(session, project_id, analyze_references(body))
    elif body["kind"] == "plan" and body.get("from_job") is not None:
        from curvplan_server.analyze.replan import measurements_from_job

        fields = measurements_from_job(session, project_id, uuid.UUID(body["from_job"]), data_dir)
        try:
            measurements = Measurements.model_validate_json(json.dumps(fields))
        except ValidationError as exc:
            raise Problem(
                409,
                f"the analysis's stored measurements no longer fit the planner: {exc}"[:500],
                title="Conflict",
            ) from None
        body = {**body, "measurements": measurements.model_dump(mode="json", exclude_none=True)}
    return body

"""``DELETE /v1/artifacts/{id}``: remove an uploaded artifact that no live job needs.

The jobs that use an artifact are those its ``job_artifact`` rows name (every kind's
artifact fields, written with the job: :mod:`curvplan_core.jobs.links`). The artifact row
is locked (``FOR UPDATE``) before that check, and ``POST /v1/jobs`` (and a fan-out) locks the
rows it references (``FOR KEY SHARE``) in the transaction that inserts the job. So a job
submitted concurrently either commits first (the delete then sees it and answers 409) or
waits for the delete and is refused with 422 "artifact not found": no queued job ever names
a deleted artifact. The blob file goes once no row of any project
references it (under the blob's lock, see :mod:`curvplan_core.storage.blobs`).
"""

from __future__ import annotations

import uuid

from sqlalchemy import text
from sqlalchemy.orm import Session

from curvplan_core.artifacts.blobstore import BlobStore
from curvplan_core.jobs.links import active_jobs_using
from curvplan_core.storage.blobs import delete_if_unreferenced
from curvplan_server.problems import Problem, not_found

MAX_JOBS_LISTED = 20


def delete_artifact(
    session: Session, store: BlobStore, project_id: uuid.UUID, artifact_id: uuid.UUID
) -> None:
    """Delete the project's artifact; 404 if not the project's, 409 while a job needs it."""
    row = session.execute(
        text("SELECT id, kind, sha256 FROM artifact WHERE id = :id AND project_id = :p FOR UPDATE"),
        {"id": artifact_id, "p": project_id},
    ).first()
    if row is None:
        raise not_found("artifact")
    if row.kind == "job-output":
        raise Problem(
            409,
            "a job's outputs are deleted together with the job (retention, `curvplan gc`), "
            "not one by one",
            title="Conflict",
            extra={"artifact_kind": row.kind},
        )
    jobs = active_jobs_using(session.connection(), project_id, artifact_id, MAX_JOBS_LISTED)
    if jobs:
        raise Problem(
            409,
            f"{len(jobs)} queued or running job(s) use this artifact; cancel them or wait "
            "until they finish",
            title="Artifact In Use",
            extra={"jobs": jobs},
        )
    session.execute(text("DELETE FROM artifact WHERE id = :id"), {"id": artifact_id})
    session.commit()
    if row.sha256 is not None:
        delete_if_unreferenced(session.connection(), store, row.sha256)
        session.commit()

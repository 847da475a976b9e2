"""``DELETE /v1/artifacts/{id}``: remove an uploaded artifact that no live job needs.

The artifact row is locked (``FOR UPDATE``) before the check for jobs that reference it, and
``POST /v1/jobs`` locks the rows it references (``FOR KEY SHARE``) in the transaction that
inserts the job. So a job submitted concurrently either commits first (the delete then sees
it and answers 409) or waits for the delete and is refused with 422 "artifact not found":
no queued job ever names a deleted artifact. The blob file goes once no row of any project
references it (under the blob's lock, see :mod:`curvplan_core.storage.blobs`).
"""

from __future__ import annotations

import uuid

from sqlalchemy import text
from sqlalchemy.orm import Session

from curvplan_core.artifacts.blobstore import BlobStore
from curvplan_core.storage.blobs import delete_if_unreferenced
from curvplan_server.problems import Problem, not_found

ACTIVE = ("queued", "running", "cancelling")
MAX_JOBS_LISTED = 20


def active_jobs_referencing(
    session: Session, project_id: uuid.UUID, artifact_id: uuid.UUID
) -> list[dict[str, str]]:
    """Queued/running jobs of the project whose request names the artifact (any field)."""
    rows = session.execute(
        text(
            "SELECT id, status FROM job WHERE project_id = :p "
            "AND status IN ('queued', 'running', 'cancelling') "
            "AND strpos(request::text, :needle) > 0 ORDER BY created_at LIMIT :n"
        ),
        {"p": project_id, "needle": f'"{artifact_id}"', "n": MAX_JOBS_LISTED},
    ).all()
    return [{"id": str(r.id), "status": r.status} for r in rows]


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
    jobs = active_jobs_referencing(session, project_id, artifact_id)
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

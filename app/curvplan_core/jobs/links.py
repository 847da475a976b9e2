"""The ``job_artifact`` table: which artifacts each job's body names (migration 0013).

One row per artifact id in a job's body (``field`` is its dotted path, e.g. ``checkpoint.1``
for a checkpoint's second shard), written in the transaction that inserts the job — by
``POST /v1/jobs`` and by a fan-out for its children alike — from the fields the kind
declares (``curvplan.types.jobs.artifact_references``). It answers "which live jobs use this
artifact" through its index on ``artifact_id`` (``DELETE /v1/artifacts/{id}`` refuses while
one does). Rows go with their job and with their artifact (``ON DELETE CASCADE``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import Connection, text

from curvplan.types.jobs import ACTIVE_STATUSES, artifact_references

# Only the project's own artifacts are linked: the API has checked every id by then, and a
# job a test or an operator inserts by hand with unknown ids gets no rows instead of an
# integrity error.
_LINK_SQL = text(
    "INSERT INTO job_artifact (job_id, artifact_id, field)"
    " SELECT :job_id, a.id, :field FROM artifact a"
    " WHERE a.id = :artifact_id AND a.project_id = :project_id"
)
_ACTIVE_SQL = ", ".join(f"'{s}'" for s in sorted(ACTIVE_STATUSES))


def link_artifacts(
    conn: Connection,
    project_id: uuid.UUID,
    jobs: Iterable[tuple[uuid.UUID, str, Mapping[str, Any]]],
) -> int:
    """Record the artifacts named by each ``(job id, kind, validated body)``; rows written.

    Call in the transaction that inserts the jobs (no database work for kinds that name no
    artifact, such as ``plan``).
    """
    rows = [
        {
            "job_id": job_id,
            "artifact_id": ref.artifact_id,
            "field": ref.path,
            "project_id": project_id,
        }
        for job_id, kind, body in jobs
        for ref in artifact_references(kind, body)
    ]
    if rows:
        conn.execute(_LINK_SQL, rows)
    return len(rows)


def active_jobs_using(
    conn: Connection, project_id: uuid.UUID, artifact_id: uuid.UUID, limit: int
) -> list[dict[str, str]]:
    """Queued, running or cancelling jobs of the project whose body names the artifact
    (oldest first, at most ``limit``), as ``{id, status}``."""
    rows = conn.execute(
        text(
            "SELECT j.id, j.status FROM job j WHERE j.project_id = :p"
            f" AND j.status IN ({_ACTIVE_SQL})"
            " AND j.id IN (SELECT l.job_id FROM job_artifact l WHERE l.artifact_id = :a)"
            " ORDER BY j.created_at, j.id LIMIT :n"
        ),
        {"p": project_id, "a": artifact_id, "n": limit},
    ).all()
    return [{"id": str(r.id), "status": r.status} for r in rows]

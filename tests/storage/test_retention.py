"""Retention of finished jobs: old finished jobs go with their outputs; the latest succeeded
job of each (project, name), unfinished and recent jobs stay; a parent and its children go
together or not at all."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import text

NOW = datetime.now(UTC)


def project(conn: Any) -> uuid.UUID:
    pid = uuid.uuid4()
    conn.execute(
        text("INSERT INTO project (id, name) VALUES (:id, :name)"),
        {"id": pid, "name": f"retention-{pid.hex[:8]}"},
    )
    return pid


def job(
    conn: Any,
    project_id: uuid.UUID,
    status: str,
    days_ago: float | None,
    name: str | None = None,
    parent: uuid.UUID | None = None,
) -> uuid.UUID:
    jid = uuid.uuid4()
    finished = None if days_ago is None else NOW - timedelta(days=days_ago)
    columns = "id, project_id, kind, queue, name, status, request, finished_at"
    values = ":id, :p, 'plan', 'cpu', :name, :status, '{}'::jsonb, :finished"
    if parent is not None:
        columns += ", parent_id"
        values += ", :parent"
    conn.execute(
        text(f"INSERT INTO job ({columns}) VALUES ({values})"),
        {
            "id": jid,
            "p": project_id,
            "name": name,
            "status": status,
            "finished": finished,
            "parent": parent,
        },
    )
    return jid


def output(conn: Any, job_id: uuid.UUID, sha: str) -> None:
    conn.execute(
        text(
            "INSERT INTO artifact (id, project_id, kind, name, storage, sha256, size_bytes, job_id)"
            " SELECT :id, project_id, 'job-output', 'losses', 'blob', :sha, 1, id FROM job "
            "WHERE id = :job"
        ),
        {"id": uuid.uuid4(), "sha": sha, "job": job_id},
    )


def remaining(conn: Any, ids: list[uuid.UUID]) -> set[uuid.UUID]:
    rows = conn.execute(text("SELECT id FROM job WHERE id = ANY(:ids)"), {"ids": ids})
    return {r[0] for r in rows}


def test_retention_keeps_the_latest_succeeded_of_a_name_and_unfinished_jobs(
    db_session: Any,
) -> None:
    from curvplan_core.storage.retention import delete_expired_jobs

    conn = db_session.connection()
    p, q = project(conn), project(conn)
    expired = [
        job(conn, p, "failed", 40, "m"),
        job(conn, p, "succeeded", 50, "m"),  # an older success of "m"
        job(conn, p, "cancelled", 40),
        job(conn, p, "succeeded", 45),  # unnamed: nothing protects it
    ]
    kept = [
        job(conn, p, "succeeded", 35, "m"),  # the latest success of "m" in p
        job(conn, p, "failed", 1, "m"),  # recent
        job(conn, p, "running", None, "m"),
        job(conn, p, "queued", None),
        job(conn, q, "succeeded", 60, "m"),  # the latest success of "m" in q
    ]
    output(conn, expired[0], "a" * 64)
    output(conn, kept[0], "b" * 64)
    report = delete_expired_jobs(conn, older_than=timedelta(days=30))
    assert remaining(conn, expired + kept) == set(kept)
    assert report.jobs_deleted >= len(expired)  # other tests' old jobs may go too
    assert set(map(str, expired)) <= set(report.job_ids)
    shas = {
        r[0] for r in conn.execute(text("SELECT sha256 FROM artifact WHERE job_id IS NOT NULL"))
    }
    assert "a" * 64 not in shas and "b" * 64 in shas


def test_a_parent_and_its_children_go_together(db_session: Any) -> None:
    from curvplan_core.storage.retention import delete_expired_jobs

    conn = db_session.connection()
    # The column jobs that spawn jobs carry; added here (rolled back with the test) when the
    # schema does not have it yet.
    conn.execute(text("ALTER TABLE job ADD COLUMN IF NOT EXISTS parent_id uuid REFERENCES job(id)"))
    p = project(conn)
    old_parent = job(conn, p, "succeeded", 40)
    old_children = [job(conn, p, "failed", 40, parent=old_parent) for _ in range(2)]
    parent_recent_child = job(conn, p, "succeeded", 40)
    recent_child = job(conn, p, "succeeded", 2, parent=parent_recent_child)
    recent_parent = job(conn, p, "failed", 2)
    old_child = job(conn, p, "failed", 40, parent=recent_parent)
    parent_of_latest = job(conn, p, "failed", 40)
    latest_named = job(conn, p, "succeeded", 40, "sweep", parent=parent_of_latest)
    delete_expired_jobs(conn, older_than=timedelta(days=30))
    assert remaining(conn, [old_parent, *old_children]) == set()
    assert remaining(conn, [parent_recent_child, recent_child]) == {
        parent_recent_child,
        recent_child,
    }
    assert remaining(conn, [recent_parent, old_child]) == {
        recent_parent,
        old_child,
    }
    assert remaining(conn, [parent_of_latest, latest_named]) == {parent_of_latest, latest_named}

"""Retention of finished jobs: delete jobs (and with them their attempts and output artifacts)
that finished longer ago than the configured age.

Rules, all in one query (:func:`expired_families`):

* only finished jobs (succeeded, failed, cancelled) whose ``finished_at`` is older than the
  cutoff are eligible;
* the latest succeeded job of each (project, name) is kept whatever its age — it is what a
  re-plan or a report of "the current model" reads;
* a job and the jobs derived from it form a *family* and go together: a family is deleted
  only when every member is eligible, never a parent without its children or the reverse.

Families: a job's family root is ``COALESCE(parent_id, id)`` when the ``job`` table has a
``parent_id`` column (jobs that spawn child jobs), else the job itself. The column is looked up
at run time (:func:`family_root_sql`), so the query follows the schema without a change here;
deeper trees need a recursive root instead of ``COALESCE``.

Deleting a job row (``lifecycle.expire``) cascades to ``job_attempt`` and to its
``job-output`` artifacts (foreign keys ``ON DELETE CASCADE``); the blob files then go with the
blob garbage collection.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TypedDict

from sqlalchemy import Connection, Engine, text

from curvplan_core.jobs import lifecycle
from curvplan_core.storage.blobs import transaction

log = logging.getLogger("curvplan.storage")

TERMINAL = ("succeeded", "failed", "cancelled")


def family_root_sql(conn: Connection) -> str:
    """The SQL expression of a job's family root over table alias ``j``."""
    has_parent = conn.execute(
        text(
            "SELECT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_name = 'job' "
            "AND column_name = 'parent_id' AND table_schema = current_schema())"
        )
    ).scalar_one()
    return "COALESCE(j.parent_id, j.id)" if has_parent else "j.id"


def _families_query(root: str) -> str:
    return f"""
        WITH member AS (
            SELECT j.id, j.project_id, j.name, j.status, j.finished_at, {root} AS root
            FROM job AS j
        ),
        latest_succeeded AS (
            SELECT DISTINCT ON (project_id, name) id
            FROM job
            WHERE status = 'succeeded' AND name IS NOT NULL
            ORDER BY project_id, name, finished_at DESC NULLS LAST, created_at DESC, id DESC
        ),
        kept AS (
            SELECT DISTINCT root FROM member
            WHERE status NOT IN ('succeeded', 'failed', 'cancelled')
               OR finished_at IS NULL
               OR finished_at >= :cutoff
               OR id IN (SELECT id FROM latest_succeeded)
        )
        SELECT DISTINCT root FROM member
        WHERE root NOT IN (SELECT root FROM kept)
        LIMIT :limit
    """


def expired_families(conn: Connection, cutoff: datetime, limit: int) -> list[object]:
    """Up to ``limit`` family roots whose every member may be deleted."""
    rows = conn.execute(
        text(_families_query(family_root_sql(conn))), {"cutoff": cutoff, "limit": limit}
    )
    return [r[0] for r in rows]


class RetentionJson(TypedDict):
    """A retention pass in a GC summary (``cutoff`` None when retention is off)."""

    cutoff: str | None
    jobs_deleted: int
    outputs_deleted: int


@dataclass
class RetentionReport:
    cutoff: datetime
    jobs_deleted: int = 0
    outputs_deleted: int = 0
    job_ids: list[str] = field(default_factory=list)

    def as_dict(self) -> RetentionJson:
        return {
            "cutoff": self.cutoff.isoformat(),
            "jobs_deleted": self.jobs_deleted,
            "outputs_deleted": self.outputs_deleted,
        }


def delete_expired_jobs(
    bind: Engine | Connection,
    *,
    older_than: timedelta,
    batch: int = 200,
    now: datetime | None = None,
) -> RetentionReport:
    """Delete every expired family (in batches of ``batch`` families, one transaction each)."""
    cutoff = (now or datetime.now(UTC)) - older_than
    report = RetentionReport(cutoff)
    while True:
        with transaction(bind) as conn:
            root = family_root_sql(conn)
            roots = expired_families(conn, cutoff, batch)
            if not roots:
                break
            outputs = conn.execute(
                text(
                    f"SELECT count(*) FROM artifact WHERE job_id IN "
                    f"(SELECT j.id FROM job AS j WHERE {root} = ANY(:roots))"
                ),
                {"roots": roots},
            ).scalar_one()
            deleted = lifecycle.expire(conn, roots, cutoff, root)
        if not deleted:
            break
        report.jobs_deleted += len(deleted)
        report.outputs_deleted += int(outputs)
        report.job_ids.extend(str(job_id) for job_id in deleted)
    if report.jobs_deleted:
        log.info("retention deleted finished jobs", extra=report.as_dict())
    return report

"""The SQL of the queue: claim, heartbeat, fenced writes, reaper, worker rows (docs/layout.md).

With :mod:`curvplan_core.jobs.fanout` (a waiting parent, its fan-in, cancelling children) this
is where a job's status changes after its submission; the worker is its caller.

Every statement uses the database clock (``now()``), so workers on machines with
skewed clocks agree on leases. Every write to a job after its claim is *fenced*: it
matches the row only while ``(worker_id, attempt)`` are still the claimer's and the
job is ``running`` or ``cancelling``. A write that matches nothing means the lease
was lost (the reaper re-queued the job, or another worker holds it now); the caller
must abandon the attempt and never write its result.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import Connection, text

from curvplan_core.credentials.service_keys import revoke_worker_keys
from curvplan_core.jobs.errors import error_dict
from curvplan_core.jobs.fanout import (
    children_counts,
    children_of,
    insert_children,
    lock_children,
    refresh_parent_eta,
    settle_orphaned_waits,
    settle_parents,
    waiting_progress,
)

ACTIVE = "('running', 'cancelling')"
FENCE = f"id = :job_id AND worker_id = :worker_id AND attempt = :attempt AND status IN {ACTIVE}"


@dataclass(frozen=True)
class Fence:
    """The claim a worker holds on a job: every later write must match it."""

    job_id: uuid.UUID
    worker_id: str
    attempt: int

    def params(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "worker_id": self.worker_id, "attempt": self.attempt}


@dataclass(frozen=True)
class ClaimedJob:
    """A job this worker has just claimed (status ``running``)."""

    fence: Fence
    kind: str
    queue: str
    request: dict[str, Any]
    max_attempts: int


@dataclass(frozen=True)
class Heartbeat:
    """What a fenced heartbeat saw: whether the job's cancellation was requested."""

    status: str
    cancel_requested: bool


@dataclass(frozen=True)
class ReapedJob:
    """A job whose lease had expired, and what the reaper made of it."""

    job_id: uuid.UUID
    attempt: int
    lost_worker_id: str | None
    status: str


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, allow_nan=False)


def backoff_seconds(attempt: int, base: float, cap: float) -> float:
    """Retry delay after ``attempt`` failed: ``min(cap, base·2^(attempt−1))``."""
    return min(cap, base * 2.0 ** max(attempt - 1, 0))


# --------------------------------------------------------------------------- worker rows
def register_worker(
    conn: Connection,
    worker_id: str,
    hostname: str,
    pid: int,
    queues: list[str],
    devices: int = 1,
) -> None:
    """Insert the worker's row (status ``running``) with the devices it gives one job."""
    conn.execute(
        text(
            "INSERT INTO worker"
            " (id, hostname, pid, queues, devices, status, started_at, last_heartbeat_at)"
            " VALUES (:id, :hostname, :pid, :queues, :devices, 'running', now(), now())"
        ),
        {"id": worker_id, "hostname": hostname, "pid": pid, "queues": queues, "devices": devices},
    )


def touch_worker(
    conn: Connection,
    worker_id: str,
    status: Literal["running", "stopping"],
    current_job_id: uuid.UUID | None,
) -> None:
    """Record a worker heartbeat (also revives a row the reaper had marked stale)."""
    conn.execute(
        text(
            "UPDATE worker SET last_heartbeat_at = now(), status = :status,"
            " current_job_id = :job_id WHERE id = :id"
        ),
        {"id": worker_id, "status": status, "job_id": current_job_id},
    )


def stop_worker(conn: Connection, worker_id: str) -> None:
    """Mark the worker ``stopped`` (at exit) and revoke its ``worker`` credentials."""
    revoke_worker_keys(conn, [worker_id])
    conn.execute(
        text(
            "UPDATE worker SET status = 'stopped', current_job_id = NULL,"
            " last_heartbeat_at = now() WHERE id = :id"
        ),
        {"id": worker_id},
    )


def mark_stale_workers(conn: Connection, stale_seconds: float) -> list[str]:
    """Mark workers without a heartbeat for ``stale_seconds`` as ``stopped``; return their ids.

    Their ``worker`` credentials are revoked in the same transaction (a dead host's key
    must not keep reaching the blob routes). A worker that was only paused (not dead) sets
    itself back to ``running`` at its next heartbeat (:func:`touch_worker`) and creates a
    new credential before its next attempt.
    """
    rows = conn.execute(
        text(
            "UPDATE worker SET status = 'stopped', current_job_id = NULL"
            " WHERE status <> 'stopped'"
            " AND last_heartbeat_at < now() - make_interval(secs => :stale)"
            " RETURNING id"
        ),
        {"stale": float(stale_seconds)},
    )
    stale = [row.id for row in rows]
    revoke_worker_keys(conn, stale)
    return stale


# --------------------------------------------------------------------------- claim
CLAIM_DEPTH = 4
"""Head jobs per project and queue the fair claim considers: a claimer skips the ones other
claimers hold locked (SKIP LOCKED), so a few per project keep concurrent claims apart."""

DEVICES_FIT = (
    "coalesce((request #>> '{resources,devices}')::int, 1)"
    " <= coalesce((SELECT devices FROM worker WHERE id = :worker_id), 1)"
)
"""A job asking for more devices than this worker gives one job is left to others."""

CLAIM_SQL = text(
    f"""
    WITH RECURSIVE queued AS (
        -- the (project, queue) pairs with queued jobs: one skip-scan step of
        -- ix_job_project_claim each
        (
            SELECT project_id, queue FROM job WHERE status = 'queued'
            ORDER BY project_id, queue LIMIT 1
        )
        UNION ALL
        SELECT next.project_id, next.queue
        FROM queued q
        CROSS JOIN LATERAL (
            SELECT j.project_id, j.queue FROM job j
            WHERE j.status = 'queued' AND (j.project_id, j.queue) > (q.project_id, q.queue)
            ORDER BY j.project_id, j.queue LIMIT 1
        ) next
    ),
    running AS MATERIALIZED (  -- computed once, not per head
        SELECT project_id, count(*) AS n FROM job
        WHERE status IN {ACTIVE} AND lease_expires_at IS NOT NULL
        GROUP BY project_id
    ),
    head AS (
        SELECT h.id, h.priority, h.created_at, coalesce(r.n, 0) AS n_running,
               p.last_claimed_at
        FROM queued q
        JOIN project p ON p.id = q.project_id
        LEFT JOIN running r ON r.project_id = q.project_id
        CROSS JOIN LATERAL (
            SELECT id, priority, created_at FROM job
            WHERE project_id = q.project_id AND queue = q.queue
              AND status = 'queued' AND queue = ANY(:queues) AND run_after <= now()
              AND {DEVICES_FIT}
            ORDER BY priority DESC, created_at
            LIMIT {CLAIM_DEPTH}
        ) h
        WHERE q.queue = ANY(:queues)
    ),
    claimed AS (
        UPDATE job SET
            status = 'running',
            attempt = attempt + 1,
            worker_id = :worker_id,
            lease_expires_at = now() + make_interval(secs => :lease),
            started_at = coalesce(started_at, now()),
            updated_at = now(),
            progress = NULL
        WHERE id = coalesce(
            (
                -- fair: within a priority, the project with the fewest running jobs, then
                -- the one served longest ago (round robin), then the oldest job
                SELECT j.id FROM job j JOIN head h ON h.id = j.id
                WHERE j.status = 'queued'
                ORDER BY h.priority DESC, h.n_running, h.last_claimed_at NULLS FIRST,
                         h.created_at
                FOR UPDATE OF j SKIP LOCKED
                LIMIT 1
            ),
            (
                -- every head is held by another claimer: the oldest other job
                SELECT id FROM job
                WHERE status = 'queued' AND queue = ANY(:queues) AND run_after <= now()
                  AND {DEVICES_FIT}
                ORDER BY priority DESC, created_at
                FOR UPDATE SKIP LOCKED
                LIMIT 1
            )
        )
        RETURNING id, project_id, kind, queue, request, attempt, max_attempts
    ),
    project_row AS (
        UPDATE project SET last_claimed_at = now()
        WHERE id = (SELECT project_id FROM claimed)
    ),
    attempt_row AS (
        INSERT INTO job_attempt (job_id, attempt, worker_id, claimed_at)
        SELECT id, attempt, :worker_id, now() FROM claimed
    ),
    worker_row AS (
        UPDATE worker SET current_job_id = (SELECT id FROM claimed), last_heartbeat_at = now()
        WHERE id = :worker_id AND EXISTS (SELECT 1 FROM claimed)
    )
    SELECT * FROM claimed
    """
)
"""Claim one runnable job, fairly across projects (docs/operations.md#claim-order).

Within a priority the claim prefers the project with the fewest running (leased) jobs, then
the project whose last claim is oldest, then the oldest job: one project's many queued jobs
(a fan-out's children) cannot starve another project's. The candidates come from
``ix_job_project_claim`` (a skip scan over the (project, queue) pairs with queued jobs, then
at most :data:`CLAIM_DEPTH` rows of each pair on the claimer's queues), so the sort sees
pairs × depth rows, never the backlog.
"""


def claim(
    conn: Connection, worker_id: str, queues: list[str], lease_seconds: float
) -> ClaimedJob | None:
    """Claim the next runnable job of ``queues`` (one statement, SKIP LOCKED) or None.

    The same statement records the ``job_attempt`` row and the worker's current job,
    so a claim is never visible without its attempt row.
    """
    row = conn.execute(
        CLAIM_SQL, {"worker_id": worker_id, "queues": queues, "lease": float(lease_seconds)}
    ).one_or_none()
    if row is None:
        return None
    return ClaimedJob(
        fence=Fence(job_id=row.id, worker_id=worker_id, attempt=row.attempt),
        kind=row.kind,
        queue=row.queue,
        request=row.request,
        max_attempts=row.max_attempts,
    )


def seconds_until_runnable(conn: Connection, queues: list[str]) -> float | None:
    """Seconds until the earliest queued job of ``queues`` may run (≤ 0: now), or None.

    An idle worker that waits for notifications sleeps until then at most: a retried
    job becomes runnable when its backoff ends, which no notification announces.
    """
    value = conn.execute(
        text(
            "SELECT extract(epoch FROM min(run_after) - now()) FROM job"
            " WHERE status = 'queued' AND queue = ANY(:queues)"
        ),
        {"queues": queues},
    ).scalar_one_or_none()
    return None if value is None else float(value)


# --------------------------------------------------------------------------- fenced writes
def heartbeat(
    conn: Connection,
    fence: Fence,
    lease_seconds: float,
    progress: dict[str, Any] | None,
) -> Heartbeat | None:
    """Renew the lease and write progress (fenced); None means the lease was lost."""
    row = conn.execute(
        text(
            "UPDATE job SET lease_expires_at = now() + make_interval(secs => :lease),"
            " progress = coalesce(CAST(:progress AS jsonb), progress), updated_at = now()"
            f" WHERE {FENCE} RETURNING status, cancel_requested, parent_id"
        ),
        {**fence.params(), "lease": float(lease_seconds), "progress": _json(progress)},
    ).one_or_none()
    if row is None:
        return None
    if progress is not None and row.parent_id is not None:
        refresh_parent_eta(conn, row.parent_id)  # a waiting parent's ETA is its children's
    return Heartbeat(status=row.status, cancel_requested=row.cancel_requested)


AttemptOutcome = Literal["succeeded", "failed", "cancelled", "crashed", "released"]


def _end_attempt(conn: Connection, fence: Fence, outcome: str) -> None:
    conn.execute(
        text(
            "UPDATE job_attempt SET outcome = :outcome, ended_at = now()"
            " WHERE job_id = :job_id AND attempt = :attempt AND worker_id = :worker_id"
            " AND outcome IS NULL"
        ),
        {**fence.params(), "outcome": outcome},
    )


def _clear_current_job(conn: Connection, fence: Fence) -> None:
    conn.execute(
        text(
            "UPDATE worker SET current_job_id = NULL"
            " WHERE id = :worker_id AND current_job_id = :job_id"
        ),
        fence.params(),
    )


def finish(
    conn: Connection,
    fence: Fence,
    outcome: Literal["succeeded", "failed", "cancelled"],
    *,
    result: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
    progress: dict[str, Any] | None = None,
) -> str | None:
    """End the attempt with a terminal job status (fenced); return it, or None if fenced out.

    A job in ``cancelling`` always ends ``cancelled`` (the client asked for that; a
    result that arrived after the request is dropped), whatever the attempt produced.
    """
    row = conn.execute(
        text(
            "UPDATE job SET"
            " status = CASE WHEN status = 'cancelling' THEN 'cancelled' ELSE :outcome END,"
            " result = CASE WHEN status = 'cancelling' THEN NULL"
            "               ELSE CAST(:result AS jsonb) END,"
            " error = CASE WHEN status = 'cancelling' THEN NULL ELSE CAST(:error AS jsonb) END,"
            " progress = coalesce(CAST(:progress AS jsonb), progress),"
            " lease_expires_at = NULL, finished_at = now(), updated_at = now()"
            f" WHERE {FENCE} RETURNING status"
        ),
        {
            **fence.params(),
            "outcome": outcome,
            "result": _json(result),
            "error": _json(error),
            "progress": _json(progress),
        },
    ).one_or_none()
    if row is None:
        return None
    _end_attempt(conn, fence, "cancelled" if row.status == "cancelled" else outcome)
    _clear_current_job(conn, fence)
    settle_parents(conn, [fence.job_id])
    return row.status


def end_crashed(
    conn: Connection,
    fence: Fence,
    *,
    detail: str,
    backoff_base: float,
    backoff_max: float,
    error_type: str = "worker-crashed",
    title: str = "The job's process crashed",
) -> str | None:
    """The attempt's child died without a result (crash, signal, out of memory), or reported
    a transient failure (a blob transfer, ``error_type``/``title``); fenced.

    Either may be transient (the out-of-memory killer, a lost GPU, the network), so the job
    is re-queued with backoff like a lost lease while attempts remain; after
    ``max_attempts`` it fails with error type ``error_type`` (``worker-crashed``). A
    ``cancelling`` job becomes ``cancelled``. Returns the job's new status, or None if
    fenced out.
    """
    row = conn.execute(
        text(f"SELECT status, attempt, max_attempts FROM job WHERE {FENCE} FOR UPDATE"),
        fence.params(),
    ).one_or_none()
    if row is None:
        return None
    error = None
    run_after_delay = 0.0
    if row.status == "cancelling":
        status = "cancelled"
    elif row.attempt < row.max_attempts:
        status = "queued"
        run_after_delay = backoff_seconds(row.attempt, backoff_base, backoff_max)
    else:
        status = "failed"
        error = error_dict(
            error_type,
            title,
            f"{detail}; attempt {row.attempt} of {row.max_attempts}, no attempts left",
        )
    conn.execute(
        text(
            "UPDATE job SET status = :status, error = CAST(:error AS jsonb),"
            " worker_id = CASE WHEN :status = 'queued' THEN NULL ELSE worker_id END,"
            " run_after = CASE WHEN :status = 'queued'"
            "   THEN now() + make_interval(secs => :delay) ELSE run_after END,"
            " finished_at = CASE WHEN :status = 'queued' THEN NULL ELSE now() END,"
            " lease_expires_at = NULL, updated_at = now()"
            f" WHERE {FENCE}"
        ),
        {**fence.params(), "status": status, "error": _json(error), "delay": run_after_delay},
    )
    _end_attempt(conn, fence, "crashed")
    _clear_current_job(conn, fence)
    settle_parents(conn, [fence.job_id])
    return status


def release(conn: Connection, fence: Fence) -> str | None:
    """Give the job back without finishing it (graceful shutdown); fenced.

    The job is ``queued`` again at once and its ``max_attempts`` grows by one, so a
    release does not count against the retry budget. A ``cancelling`` job becomes
    ``cancelled``. Returns the new status, or None if fenced out.
    """
    row = conn.execute(
        text(
            "UPDATE job SET"
            " status = CASE WHEN status = 'cancelling' THEN 'cancelled' ELSE 'queued' END,"
            " max_attempts = CASE WHEN status = 'cancelling' THEN max_attempts"
            "                     ELSE max_attempts + 1 END,"
            " finished_at = CASE WHEN status = 'cancelling' THEN now() ELSE NULL END,"
            " worker_id = CASE WHEN status = 'cancelling' THEN worker_id ELSE NULL END,"
            " run_after = now(), lease_expires_at = NULL, updated_at = now()"
            f" WHERE {FENCE} RETURNING status"
        ),
        fence.params(),
    ).one_or_none()
    if row is None:
        return None
    _end_attempt(conn, fence, "released")
    _clear_current_job(conn, fence)
    settle_parents(conn, [fence.job_id])
    return row.status


# --------------------------------------------------------------------------- reaper
REAP_SQL = text(
    """
    WITH expired AS (
        SELECT id, status, attempt, max_attempts, worker_id
        FROM job
        WHERE status IN ('running', 'cancelling') AND lease_expires_at < now()
        ORDER BY lease_expires_at
        LIMIT :batch
        FOR UPDATE SKIP LOCKED
    ),
    decided AS (
        SELECT e.*,
            CASE WHEN e.status = 'cancelling' THEN 'cancelled'
                 WHEN e.attempt >= e.max_attempts THEN 'failed'
                 ELSE 'queued' END AS new_status
        FROM expired e
    ),
    reaped AS (
        UPDATE job AS j SET
            status = d.new_status,
            error = CASE WHEN d.new_status = 'failed' THEN jsonb_build_object(
                        'type', 'worker-lost',
                        'title', 'The worker running the job was lost',
                        'detail', format(
                            'worker %s stopped renewing its lease during attempt %s of %s;'
                            ' no attempts left', d.worker_id, d.attempt, d.max_attempts))
                    ELSE j.error END,
            run_after = CASE WHEN d.new_status = 'queued'
                        THEN now() + make_interval(secs => least(
                            CAST(:backoff_max AS float8),
                            CAST(:backoff_base AS float8)
                              * power(2.0::float8, CAST(d.attempt - 1 AS float8))))
                        ELSE j.run_after END,
            worker_id = CASE WHEN d.new_status = 'queued' THEN NULL ELSE j.worker_id END,
            finished_at = CASE WHEN d.new_status = 'queued' THEN NULL ELSE now() END,
            lease_expires_at = NULL,
            updated_at = now()
        FROM decided d
        WHERE j.id = d.id
        RETURNING j.id, d.attempt, d.worker_id AS lost_worker_id, j.status
    ),
    ended AS (
        UPDATE job_attempt a SET outcome = 'lease-lost', ended_at = now()
        FROM reaped r
        WHERE a.job_id = r.id AND a.attempt = r.attempt AND a.outcome IS NULL
    )
    SELECT * FROM reaped
    """
)


def reap_expired(
    conn: Connection, *, backoff_base: float, backoff_max: float, batch: int = 100
) -> list[ReapedJob]:
    """Recover jobs whose lease expired (one statement; safe to run in many workers at once).

    ``running`` jobs go back to ``queued`` after ``min(max, base·2^(attempt−1))``
    seconds, or become ``failed`` with error type ``worker-lost`` when the attempt was
    the last one; ``cancelling`` jobs become ``cancelled``. The attempt row gets
    outcome ``lease-lost``. Rows locked by a concurrent reaper or their (live) owner
    are skipped, not waited for.
    """
    rows = conn.execute(
        REAP_SQL,
        {"backoff_base": float(backoff_base), "backoff_max": float(backoff_max), "batch": batch},
    )
    reaped = [
        ReapedJob(
            job_id=row.id, attempt=row.attempt, lost_worker_id=row.lost_worker_id, status=row.status
        )
        for row in rows
    ]
    # A reaped child that ended (failed / cancelled) settles its waiting parent here, in the
    # same transaction; then the safety net for a parent whose children all ended otherwise.
    settle_parents(conn, [job.job_id for job in reaped if job.status != "queued"])
    settle_orphaned_waits(conn)
    return reaped


# --------------------------------------------------------------------------- fan-out
def fan_out(
    conn: Connection,
    fence: Fence,
    children: list[dict[str, Any]],
    *,
    progress: dict[str, Any] | None = None,
) -> str | None:
    """End a fan-out attempt: insert ``children`` and leave the job waiting for them (fenced).

    ``children`` are ``{"kind", "request", "name"}`` objects (requests already validated by
    the contract). In one transaction: the children are inserted (``queued``, same project,
    tags and priority as the parent, ``parent_id`` set), the parent keeps status ``running`` but
    loses its lease and worker (stage ``waiting for children``), and the attempt ends with
    outcome ``fanned-out``. A job whose cancellation was requested meanwhile ends
    ``cancelled`` and creates nothing. Returns the job's status, or None if fenced out.
    """
    row = conn.execute(
        text(
            "SELECT status, project_id, tags, priority, max_attempts, progress FROM job"
            f" WHERE {FENCE} FOR UPDATE"
        ),
        fence.params(),
    ).one_or_none()
    if row is None:
        return None
    if row.status == "cancelling" or not children:
        return finish(
            conn,
            fence,
            "cancelled" if row.status == "cancelling" else "failed",
            error=None
            if row.status == "cancelling"
            else error_dict("internal-error", "Empty fan-out", "the job fanned out no children"),
        )
    insert_children(
        conn,
        fence.job_id,
        children,
        project_id=row.project_id,
        tags=row.tags,
        priority=row.priority,
        max_attempts=row.max_attempts,
    )
    stages = (progress or row.progress or {}).get("stages")
    waiting = waiting_progress({"queued": len(children)}, stages)
    conn.execute(
        text(
            "UPDATE job SET lease_expires_at = NULL, worker_id = NULL, updated_at = now(),"
            f" progress = CAST(:progress AS jsonb) WHERE {FENCE}"
        ),
        {**fence.params(), "progress": _json(waiting)},
    )
    _end_attempt(conn, fence, "fanned-out")
    _clear_current_job(conn, fence)
    return "running"


FAIL_FAST_CHILD_KINDS: dict[str, tuple[str, str]] = {
    "analyze_blocks": ("block-group-failed", "A block group of the fan-out failed"),
}
"""Child kinds whose failure dooms their parent, with the parent's error type and title.

An analysis needs every block group, so one failed ``analyze_blocks`` child fails the parent at
once and cancels the other groups (:func:`fail_parent_fast`); a sweep fits the points that
finished, so its ``sweep_point`` children are not here (a failed point only counts as failed).
"""


def fail_parent_fast(conn: Connection, child_id: uuid.UUID) -> uuid.UUID | None:
    """Fail the waiting parent of a failed child of a :data:`FAIL_FAST_CHILD_KINDS` kind and
    cancel its other children; the parent's id, or None when nothing was to be done.

    Run in its own transaction, after the one that ended the child (the fan-in rule of
    ``curvplan_core.jobs.fanout`` stays the safety net: if this never runs, the parent's
    fan-in fails the same way once every child has ended). Locks as cancelling a parent does:
    the children in id order, then the parent, so it cannot deadlock with a cancel or with a
    sibling's settle (child, then parent). Queued siblings end ``cancelled`` at once, running
    ones become ``cancelling`` (their worker stops them within its cancel grace); their ends
    leave the failed parent alone (:func:`settle_parent` touches only waiting parents).
    """
    child = conn.execute(
        text("SELECT kind, parent_id, status, name, error, request FROM job WHERE id = :id"),
        {"id": child_id},
    ).one_or_none()
    if (
        child is None
        or child.parent_id is None
        or child.status != "failed"
        or child.kind not in FAIL_FAST_CHILD_KINDS
    ):
        return None
    parent_id = child.parent_id
    lock_children(conn, parent_id)
    parent = conn.execute(
        text("SELECT status, lease_expires_at, progress FROM job WHERE id = :p FOR UPDATE"),
        {"p": parent_id},
    ).one()
    if parent.status != "running" or parent.lease_expires_at is not None:
        return None  # cancelling (it ends cancelled), terminal, or its own attempt runs
    cancelled = conn.execute(
        text(
            "UPDATE job SET cancel_requested = true, updated_at = now(),"
            " status = CASE WHEN status = 'queued' THEN 'cancelled' ELSE 'cancelling' END,"
            " finished_at = CASE WHEN status = 'queued' THEN now() ELSE finished_at END"
            " WHERE parent_id = :p AND status IN ('queued', 'running') RETURNING id"
        ),
        {"p": parent_id},
    ).all()
    error_type, title = FAIL_FAST_CHILD_KINDS[child.kind]
    request = child.request or {}
    child_error = child.error or {}
    what = f"blocks {request.get('blocks') or []}"
    if request.get("pairs"):
        what += f", pairs {['|'.join(p) for p in request['pairs']]}"
    detail = (
        f"{child.name or child_id} ({child_id}) failed"
        f"{': ' + str(child_error.get('type')) if child_error.get('type') else ''}"
        f"{' — ' + str(child_error.get('detail')) if child_error.get('detail') else ''}"
        f" — {what}; {len(cancelled)} other child job(s) cancelled"
    )
    stages = (parent.progress or {}).get("stages")
    progress = waiting_progress(children_counts(conn, parent_id), stages)
    conn.execute(
        text(
            "UPDATE job SET status = 'failed', error = CAST(:error AS jsonb),"
            " progress = CAST(:progress AS jsonb), finished_at = now(), updated_at = now()"
            " WHERE id = :p"
        ),
        {
            "p": parent_id,
            "error": _json(error_dict(error_type, title, detail[:2000])),
            "progress": _json(progress),
        },
    )
    return parent_id


def load_children(conn: Connection, job_id: uuid.UUID) -> list[dict[str, Any]] | None:
    """The children of a job with their outcomes (None when it has none: not a fan-in)."""
    children = children_of(conn, job_id)
    return children or None

"""The job state machine: every change of a job's status is a function of this module.

A job's status changes only here (a test greps for any other writer). The allowed
transitions are the table :data:`TRANSITIONS`, each named for what it does; the function that
makes one checks its source status in its SQL, so a transition the table does not allow
matches no row and changes nothing. docs/layout.md draws the picture.

Every statement uses the database clock (``now()``), so workers on machines with skewed
clocks agree on leases. Every write to a job after its claim is *fenced*
(:data:`~curvplan_core.jobs.store.FENCE`): it matches the row only while
``(worker_id, attempt)`` are still the claimer's and the job is ``running`` or
``cancelling``. A write that matches nothing means the lease was lost (the reaper re-queued
the job, or another worker holds it now); the caller must abandon the attempt and never write
its result.

Fan-out and fan-in (the life of a parent, :mod:`curvplan_core.jobs.fanout`): every
transaction that moves a child to a terminal status calls :func:`settle_parents` before it
commits; the one that records the last child's end queues the parent again (fan-in).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from psycopg.types.json import Jsonb
from pydantic import JsonValue
from sqlalchemy import Connection, Row, text

from curvplan.types.jobs import (
    AGENT_QUEUE,
    CREATE_TYPE_OF_KIND,
    QUEUE_OF_KIND,
    TERMINAL_STATUSES,
    JobStatus,
    queue_of,
)
from curvplan_core.jobs.errors import error_dict
from curvplan_core.jobs.fanout import (
    FAN_IN_STAGE,
    children_counts,
    lock_children,
    refresh_parent_eta,
    waiting_from,
    waiting_progress,
)
from curvplan_core.jobs.links import link_artifacts
from curvplan_core.jobs.records import NewChild, QueuedRow
from curvplan_core.jobs.store import (
    ACTIVE,
    FENCE,
    ClaimedJob,
    Fence,
    ReapedJob,
    backoff_seconds,
    json_param,
)

TERMINAL = ("succeeded", "failed", "cancelled")
assert set(TERMINAL) == set(TERMINAL_STATUSES)

NEW = "(new)"
"""The source of a job's first status: the row does not exist yet."""

DELETED = "(deleted)"
"""The target of retention: the row (with its attempts and outputs) is gone."""


@dataclass(frozen=True)
class Transition:
    """One allowed change of a job's status, and the function(s) that make it."""

    name: str
    sources: tuple[str, ...]
    target: str
    by: tuple[str, ...]


TRANSITIONS: tuple[Transition, ...] = (
    Transition(
        "queue_job", (NEW,), "queued", ("queue_job", "insert_children", "wait_for_children")
    ),
    Transition("claim", ("queued",), "running", ("claim", "claim_agent_point")),
    Transition("fan_out_at_submission", ("queued",), "running", ("start_waiting",)),
    Transition("mark_succeeded", ("running",), "succeeded", ("mark_succeeded",)),
    Transition(
        "fail",
        ("running",),
        "failed",
        ("fail", "requeue_for_retry", "requeue_expired", "fail_parent_fast", "settle_parent"),
    ),
    Transition(
        "requeue_for_retry", ("running",), "queued", ("requeue_for_retry", "requeue_expired")
    ),
    Transition("release", ("running",), "queued", ("release",)),
    Transition("wait_for_children", ("running",), "running", ("wait_for_children",)),
    Transition("queue_fan_in", ("running",), "queued", ("settle_parent",)),
    Transition("cancel", ("queued",), "cancelled", ("cancel", "fail_parent_fast")),
    Transition("request_cancel", ("running",), "cancelling", ("cancel", "fail_parent_fast")),
    Transition(
        "mark_cancelled",
        ("running", "cancelling"),
        "cancelled",
        ("mark_cancelled", "requeue_for_retry", "release", "requeue_expired", "settle_parent"),
    ),
    Transition("expire", TERMINAL, DELETED, ("expire",)),
)
"""Every allowed transition. A ``running`` job stays ``running`` while it waits for its
children (no lease, no worker); a ``cancelling`` job only ever ends ``cancelled``; a
terminal job (succeeded, failed, cancelled) only ever goes away, by retention."""

ALLOWED: frozenset[tuple[str, str]] = frozenset(
    (source, t.target) for t in TRANSITIONS for source in t.sources
)
"""The ``(from, to)`` pairs of :data:`TRANSITIONS`."""


def allowed(source: str, target: str) -> bool:
    """Whether a job may go from status ``source`` to ``target``."""
    return (source, target) in ALLOWED


_TERMINAL_SQL = "(" + ", ".join(f"'{s}'" for s in TERMINAL) + ")"


# --------------------------------------------------------------------------- submission
QUEUED_COLUMNS = (
    "id",
    "parent_id",
    "kind",
    "queue",
    "status",
    "name",
    "tags",
    "progress",
    "attempt",
    "max_attempts",
    "cancel_requested",
    "result",
    "error",
    "created_at",
    "updated_at",
    "started_at",
    "finished_at",
)
"""The columns :func:`queue_job` returns (what the API answers)."""

_QUEUE_JOB_SQL = (
    "INSERT INTO job (id, project_id, kind, queue, name, tags, status, request, request_hash, "
    "idempotency_key, max_attempts, created_at, updated_at) "
    "SELECT %s, %s, %s, %s, %s, %s, 'queued', %s, %s, %s, %s, clock.ts, clock.ts "
    "FROM (SELECT clock_timestamp() AS ts) AS clock "
    "ON CONFLICT ON CONSTRAINT uq_job_project_id_idempotency_key DO NOTHING "
    "RETURNING " + ", ".join(QUEUED_COLUMNS)
)


def queue_job(
    conn: Connection,
    *,
    job_id: uuid.UUID,
    project_id: uuid.UUID,
    kind: str,
    name: str | None,
    tags: dict[str, str],
    request: dict[str, JsonValue],
    request_hash: str,
    idempotency_key: str | None,
    max_attempts: int,
) -> QueuedRow | None:
    """``(new) → queued``: insert a submitted job and link the artifacts its request names.

    Returns the new row's :data:`QUEUED_COLUMNS`, or None when ``idempotency_key`` was
    already used in the project (nothing inserted). ``created_at = updated_at =
    clock_timestamp()``, not ``now()``: jobs made in one transaction still get distinct,
    ordered times (the list cursor orders by them). The API's hot path: one prepared
    statement on the connection's own psycopg connection, in the caller's transaction.
    """
    driver = conn.connection.driver_connection
    assert driver is not None
    cursor = driver.execute(
        _QUEUE_JOB_SQL,
        (
            job_id,
            project_id,
            kind,
            QUEUE_OF_KIND[kind],
            name,
            Jsonb(tags),
            Jsonb(request),
            request_hash,
            idempotency_key,
            max_attempts,
        ),
        prepare=True,
    )
    raw = cursor.fetchone()
    if raw is None:
        return None
    link_artifacts(conn, project_id, [(job_id, kind, request)])
    (id_, parent, kind_, queue, status, name_, tags_, progress, attempt, attempts, cancel,
     result, error, created, updated, started, finished) = raw  # fmt: skip
    return QueuedRow(
        id=id_,
        parent_id=parent,
        kind=kind_,
        queue=queue,
        status=status,
        name=name_,
        tags=tags_,
        progress=progress,
        attempt=attempt,
        max_attempts=attempts,
        cancel_requested=cancel,
        result=result,
        error=error,
        created_at=created,
        updated_at=updated,
        started_at=started,
        finished_at=finished,
    )


# --------------------------------------------------------------------------- cancel
_CANCEL_SQL = text(
    "UPDATE job SET cancel_requested = true, updated_at = now(),"
    " status = CASE WHEN status = 'queued' THEN 'cancelled' ELSE 'cancelling' END,"
    " finished_at = CASE WHEN status = 'queued' THEN now() ELSE finished_at END,"
    " lease_expires_at = CASE WHEN status = 'queued' THEN NULL ELSE lease_expires_at END"
    " WHERE id = :id AND project_id = :project_id AND status IN ('queued', 'running')"
    " RETURNING " + ", ".join(QUEUED_COLUMNS) + ", request, request_hash"
)


@dataclass(frozen=True)
class Cancelled:
    """What :func:`cancel` changed: the job's row after it, and whether it has children."""

    row: Row[Any]
    has_children: bool


def cancel(conn: Connection, project_id: uuid.UUID, job_id: uuid.UUID) -> Cancelled | None:
    """``queued → cancelled`` at once; ``running → cancelling`` (its worker stops it).

    None when the job is not queued or running (already cancelling, terminal, missing, or
    another project's): nothing changed. A job with children (a fan-out) cancels them too;
    a cancelled child settles its parent. Children are locked before the parent, the order
    every child's end uses.
    """
    has_children = lock_children(conn, job_id) > 0
    row = conn.execute(_CANCEL_SQL, {"id": job_id, "project_id": project_id}).first()
    if row is None:
        return None
    if has_children:
        _cancel_children(conn, job_id)
        settle_parent(conn, job_id)
    elif row.status == JobStatus.CANCELLED and row.parent_id is not None:
        settle_parents(conn, [job_id])
    return Cancelled(row, has_children)


def _cancel_children(conn: Connection, parent_id: uuid.UUID) -> list[uuid.UUID]:
    """Cancel the queued and running children of ``parent_id`` (locked already, after the
    parent's own update): queued ones end ``cancelled`` at once, running ones become
    ``cancelling`` (their worker stops them). Their ids."""
    rows = conn.execute(
        text(
            "UPDATE job SET cancel_requested = true, updated_at = now(),"
            " status = CASE WHEN status = 'queued' THEN 'cancelled' ELSE 'cancelling' END,"
            " finished_at = CASE WHEN status = 'queued' THEN now() ELSE finished_at END"
            " WHERE parent_id = :p AND status IN ('queued', 'running') RETURNING id"
        ),
        {"p": parent_id},
    ).all()
    return [row.id for row in rows]


# --------------------------------------------------------------------------- retention
def expire(conn: Connection, roots: list[Any], cutoff: datetime, root_sql: str) -> list[uuid.UUID]:
    """``succeeded | failed | cancelled → (deleted)``: delete the jobs of the family
    ``roots`` (``root_sql``: a job's family root over alias ``j``) that finished before
    ``cutoff``; their ids. Re-checked here: a member queued since the roots were chosen
    stays. Attempts and output artifacts go with the row (``ON DELETE CASCADE``)."""
    rows = conn.execute(
        text(
            f"DELETE FROM job AS j WHERE {root_sql} = ANY(:roots) AND j.status IN "
            f"{_TERMINAL_SQL} AND j.finished_at < :cutoff RETURNING j.id"
        ),
        {"roots": roots, "cutoff": cutoff},
    ).all()
    return [row[0] for row in rows]


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


AGENT_CLAIM_SQL = text(
    """
    WITH claimed AS (
        UPDATE job SET
            status = 'running',
            attempt = attempt + 1,
            worker_id = :agent_id,
            lease_expires_at = now() + make_interval(secs => :lease),
            started_at = coalesce(started_at, now()),
            updated_at = now(),
            progress = NULL
        WHERE id = (
            SELECT id FROM job
            WHERE project_id = :project_id AND queue = :queue AND status = 'queued'
              AND run_after <= now()
            ORDER BY priority DESC, created_at
            FOR UPDATE SKIP LOCKED
            LIMIT 1
        )
        RETURNING id, parent_id, name, kind, queue, request, attempt, max_attempts,
                  lease_expires_at
    ),
    attempt_row AS (
        INSERT INTO job_attempt (job_id, attempt, worker_id, claimed_at)
        SELECT id, attempt, :agent_id, now() FROM claimed
    ),
    agent_row AS (
        UPDATE worker SET current_job_id = (SELECT id FROM claimed), last_heartbeat_at = now(),
                          status = 'running'
        WHERE id = :agent_id
    )
    SELECT * FROM claimed
    """
)
"""Claim the oldest runnable point of the project's agent sweeps (``queue = 'agent'``, read
from ``ix_job_project_claim``): the same row changes as :data:`CLAIM_SQL`'s, for one project."""


def claim_agent_point(
    conn: Connection, project_id: uuid.UUID, agent_id: str, lease_seconds: float
) -> Row[Any] | None:
    """``queued → running``: claim the next point of ``project_id``'s agent sweeps for the agent
    ``agent_id`` (one statement, SKIP LOCKED), recording its attempt row; None when none is
    runnable. Later writes are fenced on ``(agent_id, attempt)`` like a worker's."""
    return conn.execute(
        AGENT_CLAIM_SQL,
        {
            "project_id": project_id,
            "agent_id": agent_id,
            "queue": AGENT_QUEUE,
            "lease": float(lease_seconds),
        },
    ).one_or_none()


# --------------------------------------------------------------------------- an attempt's end
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


def _finish(
    conn: Connection,
    fence: Fence,
    outcome: Literal["succeeded", "failed", "cancelled"],
    *,
    result: Mapping[str, object] | None = None,
    error: Mapping[str, object] | None = None,
    progress: Mapping[str, object] | None = None,
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
            "result": json_param(result),
            "error": json_param(error),
            "progress": json_param(progress),
        },
    ).one_or_none()
    if row is None:
        return None
    _end_attempt(conn, fence, "cancelled" if row.status == JobStatus.CANCELLED else outcome)
    _clear_current_job(conn, fence)
    settle_parents(conn, [fence.job_id])
    return row.status


def mark_succeeded(
    conn: Connection,
    fence: Fence,
    *,
    result: Mapping[str, object] | None,
    progress: Mapping[str, object] | None = None,
) -> str | None:
    """``running → succeeded`` with ``result`` (fenced); a ``cancelling`` job ends
    ``cancelled`` instead. The new status, or None if fenced out."""
    return _finish(conn, fence, "succeeded", result=result, progress=progress)


def fail(
    conn: Connection,
    fence: Fence,
    *,
    error: Mapping[str, object] | None,
    progress: Mapping[str, object] | None = None,
) -> str | None:
    """``running → failed`` with ``error`` (fenced, not retried: the error is the request's);
    a ``cancelling`` job ends ``cancelled`` instead. The new status, or None if fenced out."""
    return _finish(conn, fence, "failed", error=error, progress=progress)


def mark_cancelled(
    conn: Connection, fence: Fence, *, progress: Mapping[str, object] | None = None
) -> str | None:
    """``running | cancelling → cancelled``: the attempt stopped on a cancel (fenced).
    The new status, or None if fenced out."""
    return _finish(conn, fence, "cancelled", progress=progress)


def requeue_for_retry(
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
    if row.status == JobStatus.CANCELLING:
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
        {**fence.params(), "status": status, "error": json_param(error), "delay": run_after_delay},
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


def requeue_expired(
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
    settle_parents(conn, [job.job_id for job in reaped if job.status != JobStatus.QUEUED])
    settle_orphaned_waits(conn)
    return reaped


# --------------------------------------------------------------------------- fan-out and fan-in
def wait_for_children(
    conn: Connection,
    fence: Fence,
    children: list[NewChild],
    *,
    progress: Mapping[str, object] | None = None,
) -> str | None:
    """End a fan-out attempt: insert ``children`` and leave the job waiting for them (fenced).

    ``children`` are ``{"kind", "request", "name"}`` objects (requests already validated by
    the contract). In one transaction: the children are inserted (``queued``, same project,
    tags and priority as the parent, ``parent_id`` set), the parent keeps status ``running`` but
    loses its lease and worker (stage ``waiting for children``), and the attempt ends with
    outcome ``fanned-out``. A job whose cancellation was requested meanwhile ends
    ``cancelled`` and creates nothing. Returns the job's status, or None if fenced out.

    A fan-in attempt may fan out again (a data sweep's next round): the new children join the
    earlier ones, the parent waits for them the same way, and its next fan-in sees them all.
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
    if row.status == JobStatus.CANCELLING or not children:
        return _finish(
            conn,
            fence,
            "cancelled" if row.status == JobStatus.CANCELLING else "failed",
            error=None
            if row.status == JobStatus.CANCELLING
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
    previous: Mapping[str, Any] = progress or row.progress or {}
    # a later round (a fan-in that fans out again) counts the earlier rounds' children too
    waiting = waiting_progress(children_counts(conn, fence.job_id), previous.get("stages"))
    conn.execute(
        text(
            "UPDATE job SET lease_expires_at = NULL, worker_id = NULL, updated_at = now(),"
            f" progress = CAST(:progress AS jsonb) WHERE {FENCE}"
        ),
        {**fence.params(), "progress": json_param(waiting)},
    )
    _end_attempt(conn, fence, "fanned-out")
    _clear_current_job(conn, fence)
    return JobStatus.RUNNING


def insert_children(
    conn: Connection,
    parent_id: uuid.UUID,
    children: list[NewChild],
    *,
    project_id: uuid.UUID,
    tags: dict[str, str] | None,
    priority: int,
    max_attempts: int,
) -> list[uuid.UUID]:
    """Insert the children of ``parent_id`` (``{"kind", "request", "name"[, "max_attempts",
    "eta_seconds"]}``, requests valid create bodies): ``queued``, same project, tags and
    priority as the parent; their artifacts linked (kept from deletion) in the same
    transaction. A child's ``eta_seconds`` is its prior estimate, its progress until it runs."""
    child_ids = [uuid.uuid4() for _ in children]
    conn.execute(
        text(
            "INSERT INTO job (id, project_id, parent_id, kind, queue, name, tags, status,"
            " request, priority, max_attempts, progress, created_at, updated_at)"
            " VALUES (:id, :project_id, :parent_id, :kind, :queue, :name, CAST(:tags AS jsonb),"
            " 'queued', CAST(:request AS jsonb), :priority, :max_attempts,"
            " CAST(:progress AS jsonb), clock_timestamp(), clock_timestamp())"
        ),
        [
            {
                "id": child_id,
                "project_id": project_id,
                "parent_id": parent_id,
                "kind": child["kind"],
                "queue": queue_of(child["kind"], child["request"]),
                "name": child.get("name"),
                "tags": json_param(tags or {}),
                "request": json_param(child["request"]),
                "priority": priority,
                "max_attempts": int(child.get("max_attempts") or max_attempts),
                "progress": None
                if child.get("eta_seconds") is None
                else json_param(
                    {"fraction": 0.0, "stage": "queued", "eta_seconds": child["eta_seconds"]}
                ),
            }
            for child_id, child in zip(child_ids, children, strict=True)
        ],
    )
    link_artifacts(
        conn,
        project_id,
        [(i, c["kind"], c["request"]) for i, c in zip(child_ids, children, strict=True)],
    )
    return child_ids


def start_waiting(
    conn: Connection,
    parent_id: uuid.UUID,
    children: list[NewChild],
    *,
    fan_in_seconds: float,
) -> list[uuid.UUID]:
    """Fan a just-submitted (``queued``, never claimed) job out at submission: insert its
    children and leave it ``running`` without a lease, waiting for them; nothing is loaded or
    run for it until its fan-in. Its ETA is its children's (:func:`refresh_parent_eta`)."""
    row = conn.execute(
        text(
            "SELECT project_id, tags, priority, max_attempts FROM job"
            " WHERE id = :p AND status = 'queued' AND attempt = 0 FOR UPDATE"
        ),
        {"p": parent_id},
    ).one()
    child_ids = insert_children(
        conn,
        parent_id,
        children,
        project_id=row.project_id,
        tags=row.tags,
        priority=row.priority,
        max_attempts=row.max_attempts,
    )
    progress = waiting_progress({"queued": len(children)}, None, fan_in_seconds=fan_in_seconds)
    conn.execute(
        text(
            "UPDATE job SET status = 'running', started_at = now(), updated_at = now(),"
            " progress = CAST(:progress AS jsonb) WHERE id = :p"
        ),
        {"p": parent_id, "progress": json_param(progress)},
    )
    refresh_parent_eta(conn, parent_id)
    return child_ids


def fail_parent_fast(conn: Connection, child_id: uuid.UUID) -> uuid.UUID | None:
    """Fail the waiting parent of a failed child of a kind that declares
    :attr:`~curvplan.types.jobs.FailFast` (an analysis needs every block group, so one failed
    ``analyze_blocks`` fails it at once; a sweep fits the points that finished, so a failed
    ``sweep_point`` only counts as failed) and cancel its other children; the parent's id,
    or None when nothing was to be done.

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
    create_type = None if child is None else CREATE_TYPE_OF_KIND.get(child.kind)
    fail_fast = None if create_type is None else create_type.fail_fast
    if (
        child is None
        or child.parent_id is None
        or child.status != JobStatus.FAILED
        or fail_fast is None
    ):
        return None
    parent_id = child.parent_id
    lock_children(conn, parent_id)
    parent = conn.execute(
        text("SELECT status, lease_expires_at, progress FROM job WHERE id = :p FOR UPDATE"),
        {"p": parent_id},
    ).one()
    if parent.status != JobStatus.RUNNING or parent.lease_expires_at is not None:
        return None  # cancelling (it ends cancelled), terminal, or its own attempt runs
    cancelled = _cancel_children(conn, parent_id)
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
            "error": json_param(error_dict(fail_fast.error_type, fail_fast.title, detail[:2000])),
            "progress": json_param(progress),
        },
    )
    return parent_id


def settle_parent(conn: Connection, parent_id: uuid.UUID) -> str | None:
    """Update a waiting parent after one of its children ended; its status, or None.

    Must run in the transaction that wrote the child's terminal status, after that write.
    A parent that is not waiting (it holds a lease, or is already terminal) is left alone.
    """
    row = conn.execute(
        text("SELECT status, lease_expires_at, progress FROM job WHERE id = :p FOR UPDATE"),
        {"p": parent_id},
    ).one_or_none()
    if row is None or row.status not in (JobStatus.RUNNING, JobStatus.CANCELLING):
        return None
    if row.lease_expires_at is not None:
        return None  # an attempt holds it (fan-out not finished yet, or fan-in running)
    counts = children_counts(conn, parent_id)
    total = sum(counts.values())
    if total == 0:
        return None
    done = sum(n for status, n in counts.items() if status in TERMINAL_STATUSES)
    if done < total:
        conn.execute(
            text(
                "UPDATE job SET progress = CAST(:progress AS jsonb), updated_at = now()"
                " WHERE id = :p"
            ),
            {"p": parent_id, "progress": json_param(waiting_from(counts, row.progress))},
        )
        refresh_parent_eta(conn, parent_id)
        return str(row.status)
    if row.status == JobStatus.CANCELLING:
        conn.execute(
            text(
                "UPDATE job SET status = 'cancelled', finished_at = now(), updated_at = now(),"
                " progress = CAST(:progress AS jsonb) WHERE id = :p"
            ),
            {"p": parent_id, "progress": json_param(waiting_from(counts, row.progress))},
        )
        return JobStatus.CANCELLED
    fan_in = waiting_from(counts, row.progress, FAN_IN_STAGE)
    if fan_in.get("fan_in_seconds") is not None:
        fan_in["eta_seconds"] = fan_in["fan_in_seconds"]
    # one more attempt only where a fan-out attempt ran (it was not a failure); a parent
    # fanned out at submission has run none, and its fan-in is its first attempt
    conn.execute(
        text(
            "UPDATE job SET status = 'queued', run_after = now(), worker_id = NULL,"
            " max_attempts = max_attempts + CASE WHEN attempt > 0 THEN 1 ELSE 0 END,"
            " updated_at = now(), progress = CAST(:progress AS jsonb) WHERE id = :p"
        ),
        {"p": parent_id, "progress": json_param(fan_in)},
    )
    return "queued"


def settle_parents(conn: Connection, child_ids: Iterable[uuid.UUID]) -> None:
    """:func:`settle_parent` for the parents of ``child_ids`` that ended (a no-op for jobs
    without a parent). Parents are locked in id order."""
    ids = list(child_ids)
    if not ids:
        return
    parents = conn.execute(
        text(
            "SELECT DISTINCT parent_id FROM job WHERE id = ANY(:ids) AND parent_id IS NOT NULL"
            f" AND status IN {_TERMINAL_SQL} ORDER BY parent_id"
        ),
        {"ids": ids},
    ).scalars()
    for parent_id in list(parents):
        settle_parent(conn, parent_id)


def settle_orphaned_waits(conn: Connection) -> list[uuid.UUID]:
    """Queue (or finish cancelling) waiting parents whose children have all ended.

    A safety net run by the reaper: every path that ends a child settles its parent in the
    same transaction, so this finds nothing unless a child row was ended or removed by
    hand (or by a path added later that forgot to settle).
    """
    rows = conn.execute(
        text(
            "SELECT p.id FROM job p WHERE p.status IN ('running', 'cancelling')"
            " AND p.lease_expires_at IS NULL"
            " AND EXISTS (SELECT 1 FROM job c WHERE c.parent_id = p.id)"
            " AND NOT EXISTS (SELECT 1 FROM job c WHERE c.parent_id = p.id"
            f"   AND c.status NOT IN {_TERMINAL_SQL})"
            " ORDER BY p.id LIMIT 100"
        )
    ).scalars()
    settled = []
    for parent_id in list(rows):
        if settle_parent(conn, parent_id) in (JobStatus.QUEUED, JobStatus.CANCELLED):
            settled.append(parent_id)
    return settled

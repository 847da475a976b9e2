"""The queue's rows without a status change: worker rows, the fenced heartbeat, the fence.

A job's status changes only in :mod:`curvplan_core.jobs.lifecycle` (the state machine):
claim, an attempt's end, the reaper, fan-out and fan-in, cancel, retention. This module holds
what those transitions share (:class:`Fence`, :data:`FENCE`, the claimed and reaped job) and
the writes that never touch a status: the worker's own row, the lease renewal with progress,
and the reads an idle or fan-in attempt needs.

Every statement uses the database clock (``now()``), so workers on machines with skewed
clocks agree on leases. A fenced write matches the row only while ``(worker_id, attempt)``
are still the claimer's and the job is ``running`` or ``cancelling``; one that matches
nothing means the lease was lost.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from pydantic import JsonValue
from sqlalchemy import Connection, text

from curvplan_core.credentials.service_keys import revoke_worker_keys
from curvplan_core.jobs.fanout import children_of, refresh_parent_eta
from curvplan_core.jobs.records import ChildRecord

ACTIVE = "('running', 'cancelling')"
FENCE = f"id = :job_id AND worker_id = :worker_id AND attempt = :attempt AND status IN {ACTIVE}"


@dataclass(frozen=True)
class Fence:
    """The claim a worker holds on a job: every later write must match it."""

    job_id: uuid.UUID
    worker_id: str
    attempt: int

    def params(self) -> dict[str, uuid.UUID | str | int]:
        return {"job_id": self.job_id, "worker_id": self.worker_id, "attempt": self.attempt}


@dataclass(frozen=True)
class ClaimedJob:
    """A job this worker has just claimed (status ``running``)."""

    fence: Fence
    kind: str
    queue: str
    request: dict[str, JsonValue]
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


def json_param(value: object) -> str | None:
    """``value`` as a JSON text bind parameter (None stays NULL; NaN is refused)."""
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


# --------------------------------------------------------------------------- idle and fenced
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
    progress: Mapping[str, object] | None,
) -> Heartbeat | None:
    """Renew the lease and write progress (fenced); None means the lease was lost."""
    row = conn.execute(
        text(
            "UPDATE job SET lease_expires_at = now() + make_interval(secs => :lease),"
            " progress = coalesce(CAST(:progress AS jsonb), progress), updated_at = now()"
            f" WHERE {FENCE} RETURNING status, cancel_requested, parent_id"
        ),
        {**fence.params(), "lease": float(lease_seconds), "progress": json_param(progress)},
    ).one_or_none()
    if row is None:
        return None
    if progress is not None and row.parent_id is not None:
        refresh_parent_eta(conn, row.parent_id)  # a waiting parent's ETA is its children's
    return Heartbeat(status=row.status, cancel_requested=row.cancel_requested)


def load_children(conn: Connection, job_id: uuid.UUID) -> list[ChildRecord] | None:
    """The children of a job with their outcomes (None when it has none: not a fan-in)."""
    children = children_of(conn, job_id)
    return children or None

"""Fan-out as a queue facility: a job runs child jobs and resumes when they have all ended.

This module reads a parent's children; the status changes of the life below are
:mod:`curvplan_core.jobs.lifecycle`'s.

The life of a parent job (any kind may do this; the sweep kind is the first user):

1. **Fan-out.** Either at submission (an ``analyze`` the API's cost model fans out,
   ``lifecycle.start_waiting``: the parent never runs an attempt before its fan-in) or by a
   fan-out attempt (the kind returns children instead of a result; the sweep kind): in one
   transaction the children are inserted (``lifecycle.insert_children``: ``parent_id`` = the
   parent, status ``queued``) and the parent is left ``running`` *without a lease* and
   without a worker, at stage ``waiting for children``; a fan-out attempt's outcome is
   ``fanned-out``. The reaper only looks at expired leases, so it never touches a waiting
   parent. While it waits, its ``eta_seconds`` is the slowest unfinished child's plus its
   fan-in's own estimate (:func:`refresh_parent_eta`, on every child's progress).
2. **Children run** as ordinary jobs, on any worker. Every transaction that moves a child
   to a terminal status (finish, crash, reaper, release, cancel) calls
   ``lifecycle.settle_parents`` before it commits: it locks the parent row, counts the children
   and records ``points done / total`` in the parent's progress. The transaction that
   records the *last* child's end queues the parent again (``run_after`` now; one more
   attempt allowed when a fan-out attempt ran, since it was not a failure).
3. **Fan-in attempt.** A worker claims the parent like any job (leased, fenced, retried on
   a crash); the kind sees its children's outcomes and computes the result. A failing
   fan-in never touches a child; a crash during it re-queues the parent with its children
   intact, so the fan-in cannot be lost.
4. **Rounds.** A fan-in may fan out again (the sweep kind's data sweep, when its measured
   sizes do not bracket the target): in the one transaction that ends that attempt the next
   round's children are inserted beside the earlier ones and the parent waits again (step 1
   to 3); its next fan-in sees every round's children. The decision is a function of the
   children's stored results, so a fan-in that crashes before its transaction commits makes
   the same decision when it runs again, and a round is never queued twice.

Locking: a child's terminal update locks the child row first and the parent row second;
cancelling a parent locks the children (in id order) before the parent. Under READ
COMMITTED the count taken after the parent lock sees every sibling that committed before,
so of two children ending at once exactly one (the later) queues the parent.

Cancelling a parent cancels its queued children at once and asks its running ones to stop;
the parent becomes ``cancelled`` when its last child has ended.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, text

from curvplan.types.jobs import TERMINAL_STATUSES, JobStatus
from curvplan_core.jobs.records import ChildRecord, ProgressRecord, StageRecord

WAITING_STAGE = "waiting for children"
FAN_IN_STAGE = "fan-in queued"


def _json(value: Any) -> str:
    return json.dumps(value, allow_nan=False)


def children_counts(conn: Connection, parent_id: uuid.UUID) -> dict[str, int]:
    """Number of children of ``parent_id`` per status."""
    rows = conn.execute(
        text("SELECT status, count(*) AS n FROM job WHERE parent_id = :p GROUP BY status"),
        {"p": parent_id},
    )
    return {row.status: int(row.n) for row in rows}


def waiting_progress(
    counts: dict[str, int],
    stages: list[StageRecord] | None,
    stage: str = WAITING_STAGE,
    fan_in_seconds: float | None = None,
) -> ProgressRecord:
    """The parent's progress while it waits: points done / total, the stage history, and the
    fan-in's own estimate (``fan_in_seconds``, kept for :func:`refresh_parent_eta`)."""
    total = sum(counts.values())
    done = sum(n for status, n in counts.items() if status in TERMINAL_STATUSES)
    failed = counts.get(JobStatus.FAILED, 0)
    cancelled = counts.get(JobStatus.CANCELLED, 0)
    extra = []
    if failed:
        extra.append(f"{failed} failed")
    if cancelled:
        extra.append(f"{cancelled} cancelled")
    message = f"{done} of {total} points done" + (f" ({', '.join(extra)})" if extra else "")
    history = list(stages or [])
    if not history or history[-1].get("stage") != stage:
        history.append({"stage": stage, "started_at": datetime.now(UTC).isoformat()})
    out: ProgressRecord = {
        "fraction": done / total if total else 0.0,
        "stage": stage,
        "message": message,
        "stages": history,
        "points_done": done,
        "points_total": total,
        "points_failed": failed,
    }
    if fan_in_seconds is not None:
        out["fan_in_seconds"] = fan_in_seconds
    return out


def waiting_from(
    counts: dict[str, int], previous: ProgressRecord | None, stage: str = WAITING_STAGE
) -> ProgressRecord:
    previous = previous or {}
    return waiting_progress(counts, previous.get("stages"), stage, previous.get("fan_in_seconds"))


_ETA_SQL = (
    "UPDATE job p SET progress = jsonb_set(p.progress, '{eta_seconds}', to_jsonb("
    " coalesce((p.progress ->> 'fan_in_seconds')::float8, 0)"
    " + coalesce((SELECT max((c.progress ->> 'eta_seconds')::float8) FROM job c"
    "   WHERE c.parent_id = p.id AND c.status IN ('queued', 'running', 'cancelling')), 0)))"
    " WHERE p.id = :p AND p.status = 'running' AND p.lease_expires_at IS NULL"
    " AND p.progress IS NOT NULL"
)


def refresh_parent_eta(conn: Connection, parent_id: uuid.UUID) -> None:
    """A waiting parent's ``eta_seconds``: the largest ETA of its unfinished children (they
    run in parallel; a queued child's is its prior estimate) plus its fan-in's estimate."""
    conn.execute(text(_ETA_SQL), {"p": parent_id})


def lock_children(conn: Connection, parent_id: uuid.UUID) -> int:
    """Lock the children rows of ``parent_id`` (id order); their number."""
    rows = conn.execute(
        text("SELECT id FROM job WHERE parent_id = :p ORDER BY id FOR UPDATE"), {"p": parent_id}
    ).all()
    return len(rows)


def children_of(conn: Connection, parent_id: uuid.UUID) -> list[ChildRecord]:
    """The children of ``parent_id`` with their outcomes, oldest first (what a fan-in sees)."""
    rows = conn.execute(
        text(
            "SELECT id, kind, name, status, request, result, error, attempt FROM job"
            " WHERE parent_id = :p ORDER BY created_at, id"
        ),
        {"p": parent_id},
    )
    return [
        ChildRecord(
            id=str(row.id),
            kind=row.kind,
            name=row.name,
            status=row.status,
            request=row.request,
            result=row.result,
            error=row.error,
            attempt=row.attempt,
        )
        for row in rows
    ]

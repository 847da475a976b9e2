"""Fan-out as a queue facility: a job runs child jobs and resumes when they have all ended.

The life of a parent job (any kind may do this; the sweep kind is the first user):

1. **Fan-out.** Either at submission (an ``analyze`` the API's cost model fans out,
   :func:`start_waiting`: the parent never runs an attempt before its fan-in) or by a
   fan-out attempt (the kind returns children instead of a result; the sweep kind): in one
   transaction the children are inserted (:func:`insert_children`: ``parent_id`` = the
   parent, status ``queued``) and the parent is left ``running`` *without a lease* and
   without a worker, at stage ``waiting for children``; a fan-out attempt's outcome is
   ``fanned-out``. The reaper only looks at expired leases, so it never touches a waiting
   parent. While it waits, its ``eta_seconds`` is the slowest unfinished child's plus its
   fan-in's own estimate (:func:`refresh_parent_eta`, on every child's progress).
2. **Children run** as ordinary jobs, on any worker. Every transaction that moves a child
   to a terminal status (finish, crash, reaper, release, cancel) calls
   :func:`settle_parents` before it commits: it locks the parent row, counts the children
   and records ``points done / total`` in the parent's progress. The transaction that
   records the *last* child's end queues the parent again (``run_after`` now; one more
   attempt allowed when a fan-out attempt ran, since it was not a failure).
3. **Fan-in attempt.** A worker claims the parent like any job (leased, fenced, retried on
   a crash); the kind sees its children's outcomes and computes the result. A failing
   fan-in never touches a child; a crash during it re-queues the parent with its children
   intact, so the fan-in cannot be lost.

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
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, text

from curvplan.types.jobs import QUEUE_OF_KIND, TERMINAL_STATUSES
from curvplan_core.jobs.links import link_artifacts

WAITING_STAGE = "waiting for children"
FAN_IN_STAGE = "fan-in queued"

_TERMINAL_SQL = "('succeeded', 'failed', 'cancelled')"
assert set(TERMINAL_STATUSES) == {"succeeded", "failed", "cancelled"}


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
    stages: list[dict[str, str]] | None,
    stage: str = WAITING_STAGE,
    fan_in_seconds: float | None = None,
) -> dict[str, Any]:
    """The parent's progress while it waits: points done / total, the stage history, and the
    fan-in's own estimate (``fan_in_seconds``, kept for :func:`refresh_parent_eta`)."""
    total = sum(counts.values())
    done = sum(n for status, n in counts.items() if status in TERMINAL_STATUSES)
    failed = counts.get("failed", 0)
    cancelled = counts.get("cancelled", 0)
    extra = []
    if failed:
        extra.append(f"{failed} failed")
    if cancelled:
        extra.append(f"{cancelled} cancelled")
    message = f"{done} of {total} points done" + (f" ({', '.join(extra)})" if extra else "")
    history = list(stages or [])
    if not history or history[-1].get("stage") != stage:
        history.append({"stage": stage, "started_at": datetime.now(UTC).isoformat()})
    out: dict[str, Any] = {
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


def _waiting(
    counts: dict[str, int], previous: dict[str, Any] | None, stage: str = WAITING_STAGE
) -> dict[str, Any]:
    previous = previous or {}
    return waiting_progress(counts, previous.get("stages"), stage, previous.get("fan_in_seconds"))


def insert_children(
    conn: Connection,
    parent_id: uuid.UUID,
    children: list[dict[str, Any]],
    *,
    project_id: uuid.UUID,
    tags: dict[str, Any] | None,
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
                "queue": QUEUE_OF_KIND[child["kind"]],
                "name": child.get("name"),
                "tags": _json(tags or {}),
                "request": _json(child["request"]),
                "priority": priority,
                "max_attempts": int(child.get("max_attempts") or max_attempts),
                "progress": None
                if child.get("eta_seconds") is None
                else _json(
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
    children: list[dict[str, Any]],
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
        {"p": parent_id, "progress": _json(progress)},
    )
    refresh_parent_eta(conn, parent_id)
    return child_ids


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


def settle_parent(conn: Connection, parent_id: uuid.UUID) -> str | None:
    """Update a waiting parent after one of its children ended; its status, or None.

    Must run in the transaction that wrote the child's terminal status, after that write.
    A parent that is not waiting (it holds a lease, or is already terminal) is left alone.
    """
    row = conn.execute(
        text("SELECT status, lease_expires_at, progress FROM job WHERE id = :p FOR UPDATE"),
        {"p": parent_id},
    ).one_or_none()
    if row is None or row.status not in ("running", "cancelling"):
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
            {"p": parent_id, "progress": _json(_waiting(counts, row.progress))},
        )
        refresh_parent_eta(conn, parent_id)
        return str(row.status)
    if row.status == "cancelling":
        conn.execute(
            text(
                "UPDATE job SET status = 'cancelled', finished_at = now(), updated_at = now(),"
                " progress = CAST(:progress AS jsonb) WHERE id = :p"
            ),
            {"p": parent_id, "progress": _json(_waiting(counts, row.progress))},
        )
        return "cancelled"
    fan_in = _waiting(counts, row.progress, FAN_IN_STAGE)
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
        {"p": parent_id, "progress": _json(fan_in)},
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
        if settle_parent(conn, parent_id) in ("queued", "cancelled"):
            settled.append(parent_id)
    return settled


def cancel_children(conn: Connection, parent_id: uuid.UUID) -> None:
    """Cancel the children of a parent whose cancellation was just requested.

    Call with the children already locked (:func:`lock_children`) and after the parent's
    own update. Queued children end ``cancelled`` at once; running ones become
    ``cancelling`` (their worker stops them). Then the parent is settled: it becomes
    ``cancelled`` if no child is still running.
    """
    conn.execute(
        text(
            "UPDATE job SET cancel_requested = true, updated_at = now(),"
            " status = CASE WHEN status = 'queued' THEN 'cancelled' ELSE 'cancelling' END,"
            " finished_at = CASE WHEN status = 'queued' THEN now() ELSE finished_at END"
            " WHERE parent_id = :p AND status IN ('queued', 'running')"
        ),
        {"p": parent_id},
    )
    settle_parent(conn, parent_id)


def lock_children(conn: Connection, parent_id: uuid.UUID) -> int:
    """Lock the children rows of ``parent_id`` (id order); their number."""
    rows = conn.execute(
        text("SELECT id FROM job WHERE parent_id = :p ORDER BY id FOR UPDATE"), {"p": parent_id}
    ).all()
    return len(rows)


def children_of(conn: Connection, parent_id: uuid.UUID) -> list[dict[str, Any]]:
    """The children of ``parent_id`` with their outcomes, oldest first (what a fan-in sees)."""
    rows = conn.execute(
        text(
            "SELECT id, kind, name, status, request, result, error, attempt FROM job"
            " WHERE parent_id = :p ORDER BY created_at, id"
        ),
        {"p": parent_id},
    )
    return [
        {
            "id": str(row.id),
            "kind": row.kind,
            "name": row.name,
            "status": row.status,
            "request": row.request,
            "result": row.result,
            "error": row.error,
            "attempt": row.attempt,
        }
        for row in rows
    ]

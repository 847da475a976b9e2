"""The job state machine (``curvplan_core.jobs.lifecycle``) on the real queue SQL.

Every transition of :data:`~curvplan_core.jobs.lifecycle.TRANSITIONS` is made once by the
function that makes it, and the status before and after is one of the table's pairs; a change
the table does not allow matches no row and leaves the row as it was. A last check reads the
source: no module but the state machine writes a job's status.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from queue_helpers import insert_jobs, job_row, plan_request
from sqlalchemy import Engine, text

from curvplan.types.jobs import TERMINAL_STATUSES
from curvplan_core.jobs import lifecycle, store

W = "w-states"
ROOT = Path(__file__).resolve().parents[2]


def _status(db: Engine, job_id: uuid.UUID) -> str | None:
    with db.connect() as conn:
        return conn.execute(
            text("SELECT status FROM job WHERE id = :id"), {"id": job_id}
        ).scalar_one_or_none()


def _queued(db: Engine, project_id: uuid.UUID, max_attempts: int = 3) -> uuid.UUID:
    (job_id,) = insert_jobs(db, project_id, [plan_request()], max_attempts=max_attempts)
    return job_id


def _running(db: Engine, project_id: uuid.UUID, max_attempts: int = 3) -> store.Fence:
    job_id = _queued(db, project_id, max_attempts)
    with db.begin() as conn:
        claimed = lifecycle.claim(conn, W, ["cpu"], 30.0)
    assert claimed is not None and claimed.fence.job_id == job_id
    return claimed.fence


def _fenced(db: Engine, write: Callable[[Any], str | None]) -> str | None:
    with db.begin() as conn:
        return write(conn)


def _set(db: Engine, job_id: uuid.UUID, sql: str) -> None:
    with db.begin() as conn:
        conn.execute(text(f"UPDATE job SET {sql} WHERE id = :id"), {"id": job_id})


def _waiting_parent(db: Engine, project_id: uuid.UUID) -> tuple[uuid.UUID, list[uuid.UUID]]:
    fence = _running(db, project_id)
    child = {"kind": "plan", "request": {"kind": "plan", **plan_request()}, "name": "c"}
    assert _fenced(db, lambda c: lifecycle.wait_for_children(c, fence, [child])) == "running"
    with db.connect() as conn:
        ids = list(
            conn.execute(
                text("SELECT id FROM job WHERE parent_id = :p"), {"p": fence.job_id}
            ).scalars()
        )
    return fence.job_id, ids


def _claim_child(db: Engine, child_id: uuid.UUID) -> store.Fence:
    _set(db, child_id, "created_at = now() - interval '1 hour'")  # the oldest: claimed first
    with db.begin() as conn:
        claimed = lifecycle.claim(conn, W, ["cpu"], 30.0)
    assert claimed is not None and claimed.fence.job_id == child_id
    return claimed.fence


Seen = tuple[str | None, str | None]


# --------------------------------------------------------------------------- every transition
def drive_queue_job(db: Engine, project_id: uuid.UUID) -> Seen:
    job_id = uuid.uuid4()
    with db.begin() as conn:
        row = lifecycle.queue_job(
            conn,
            job_id=job_id,
            project_id=project_id,
            kind="plan",
            name=None,
            tags={},
            request={"kind": "plan", **plan_request()},
            request_hash="h",
            idempotency_key="k",
            max_attempts=3,
        )
    assert row is not None and row["id"] == job_id and row["attempt"] == 0
    return lifecycle.NEW, _status(db, job_id)


def drive_claim(db: Engine, project_id: uuid.UUID) -> Seen:
    job_id = _queued(db, project_id)
    before = _status(db, job_id)
    with db.begin() as conn:
        assert lifecycle.claim(conn, W, ["cpu"], 30.0) is not None
    return before, _status(db, job_id)


def drive_mark_succeeded(db: Engine, project_id: uuid.UUID) -> Seen:
    fence = _running(db, project_id)
    _fenced(db, lambda c: lifecycle.mark_succeeded(c, fence, result={"ok": 1}))
    assert job_row(db, fence.job_id).result == {"ok": 1}
    return "running", _status(db, fence.job_id)


def drive_fail(db: Engine, project_id: uuid.UUID) -> Seen:
    fence = _running(db, project_id)
    _fenced(db, lambda c: lifecycle.fail(c, fence, error={"type": "x"}))
    return "running", _status(db, fence.job_id)


def drive_requeue_for_retry(db: Engine, project_id: uuid.UUID) -> Seen:
    fence = _running(db, project_id, max_attempts=2)
    _fenced(
        db,
        lambda c: lifecycle.requeue_for_retry(
            c, fence, detail="crash", backoff_base=0, backoff_max=0
        ),
    )
    return "running", _status(db, fence.job_id)


def drive_release(db: Engine, project_id: uuid.UUID) -> Seen:
    fence = _running(db, project_id)
    _fenced(db, lambda c: lifecycle.release(c, fence))
    assert job_row(db, fence.job_id).max_attempts == 4  # a release is not counted
    return "running", _status(db, fence.job_id)


def drive_wait_for_children(db: Engine, project_id: uuid.UUID) -> Seen:
    parent, children = _waiting_parent(db, project_id)
    row = job_row(db, parent)
    assert (row.lease_expires_at, row.worker_id, len(children)) == (None, None, 1)
    return "running", row.status


def drive_fan_out_at_submission(db: Engine, project_id: uuid.UUID) -> Seen:
    job_id = _queued(db, project_id)
    before = _status(db, job_id)
    child = {"kind": "plan", "request": {"kind": "plan", **plan_request()}, "name": "c"}
    with db.begin() as conn:
        (child_id,) = lifecycle.start_waiting(conn, job_id, [child], fan_in_seconds=3.0)
    row = job_row(db, job_id)
    assert (row.lease_expires_at, row.worker_id, row.attempt) == (None, None, 0)
    assert job_row(db, child_id).status == "queued"
    return before, row.status


def drive_queue_fan_in(db: Engine, project_id: uuid.UUID) -> Seen:
    parent, (child,) = _waiting_parent(db, project_id)
    fence = _claim_child(db, child)
    _fenced(db, lambda c: lifecycle.mark_succeeded(c, fence, result={}))  # settles the parent
    return "running", _status(db, parent)


def drive_cancel(db: Engine, project_id: uuid.UUID) -> Seen:
    job_id = _queued(db, project_id)
    with db.begin() as conn:
        assert lifecycle.cancel(conn, project_id, job_id) is not None
    return "queued", _status(db, job_id)


def drive_request_cancel(db: Engine, project_id: uuid.UUID) -> Seen:
    fence = _running(db, project_id)
    with db.begin() as conn:
        assert lifecycle.cancel(conn, project_id, fence.job_id) is not None
    assert job_row(db, fence.job_id).cancel_requested
    return "running", _status(db, fence.job_id)


def drive_mark_cancelled(db: Engine, project_id: uuid.UUID) -> Seen:
    fence = _running(db, project_id)
    with db.begin() as conn:
        lifecycle.cancel(conn, project_id, fence.job_id)
    before = _status(db, fence.job_id)
    # The attempt's late result is dropped: a cancelling job only ends cancelled.
    _fenced(db, lambda c: lifecycle.mark_succeeded(c, fence, result={"late": 1}))
    assert job_row(db, fence.job_id).result is None
    return before, _status(db, fence.job_id)


def drive_expire(db: Engine, project_id: uuid.UUID) -> Seen:
    fence = _running(db, project_id)
    _fenced(db, lambda c: lifecycle.fail(c, fence, error={"type": "x"}))
    before = _status(db, fence.job_id)
    with db.begin() as conn:
        later = datetime.now(UTC) + timedelta(days=1)
        assert lifecycle.expire(conn, [fence.job_id], later, "j.id") == [fence.job_id]
    return before, _status(db, fence.job_id) or lifecycle.DELETED


DRIVERS: dict[str, Callable[[Engine, uuid.UUID], Seen]] = {
    "queue_job": drive_queue_job,
    "claim": drive_claim,
    "mark_succeeded": drive_mark_succeeded,
    "fail": drive_fail,
    "requeue_for_retry": drive_requeue_for_retry,
    "release": drive_release,
    "wait_for_children": drive_wait_for_children,
    "fan_out_at_submission": drive_fan_out_at_submission,
    "queue_fan_in": drive_queue_fan_in,
    "cancel": drive_cancel,
    "request_cancel": drive_request_cancel,
    "mark_cancelled": drive_mark_cancelled,
    "expire": drive_expire,
}


def test_every_transition_of_the_table_is_driven_here() -> None:
    assert set(DRIVERS) == {t.name for t in lifecycle.TRANSITIONS}
    names = [t.name for t in lifecycle.TRANSITIONS]
    assert len(names) == len(set(names))
    functions = {f for t in lifecycle.TRANSITIONS for f in t.by}
    assert all(callable(getattr(lifecycle, f, None)) for f in functions), functions


@pytest.mark.parametrize("name", [t.name for t in lifecycle.TRANSITIONS])
def test_each_transition_moves_a_job_as_the_table_says(
    name: str, db: Engine, project_id: uuid.UUID
) -> None:
    (transition,) = [t for t in lifecycle.TRANSITIONS if t.name == name]
    before, after = DRIVERS[name](db, project_id)
    assert before in transition.sources and after == transition.target, (before, after)
    assert lifecycle.allowed(before, after)


def test_the_table_ends_terminal_jobs_only_by_retention_and_cancelling_only_cancelled() -> None:
    for source, target in lifecycle.ALLOWED:
        if source in TERMINAL_STATUSES:
            assert target == lifecycle.DELETED
        if source == "cancelling":
            assert target == "cancelled"
    assert not lifecycle.allowed("succeeded", "queued")
    assert not lifecycle.allowed("queued", "succeeded")


# --------------------------------------------------------------------------- forbidden ones
FENCED: dict[str, Callable[[Any, store.Fence], str | None]] = {
    "mark_succeeded": lambda c, f: lifecycle.mark_succeeded(c, f, result={"x": 1}),
    "fail": lambda c, f: lifecycle.fail(c, f, error={"type": "x"}),
    "mark_cancelled": lambda c, f: lifecycle.mark_cancelled(c, f),
    "requeue_for_retry": lambda c, f: lifecycle.requeue_for_retry(
        c, f, detail="x", backoff_base=0, backoff_max=0
    ),
    "release": lambda c, f: lifecycle.release(c, f),
    "wait_for_children": lambda c, f: lifecycle.wait_for_children(
        c, f, [{"kind": "plan", "request": {"kind": "plan", **plan_request()}}]
    ),
}


@pytest.mark.parametrize("write", sorted(FENCED))
def test_a_finished_job_refuses_every_attempt_transition(
    write: str, db: Engine, project_id: uuid.UUID
) -> None:
    fence = _running(db, project_id)
    assert _fenced(db, lambda c: lifecycle.mark_succeeded(c, fence, result={"ok": 1}))
    before = job_row(db, fence.job_id)
    assert _fenced(db, lambda c: FENCED[write](c, fence)) is None  # same fence, terminal job
    assert job_row(db, fence.job_id) == before
    with db.connect() as conn:
        n = conn.execute(
            text("SELECT count(*) FROM job WHERE parent_id = :p"), {"p": fence.job_id}
        ).scalar_one()
    assert n == 0


def test_a_claim_a_cancel_and_an_expiry_leave_jobs_outside_their_sources_alone(
    db: Engine, project_id: uuid.UUID
) -> None:
    fence = _running(db, project_id)
    with db.begin() as conn:
        assert lifecycle.claim(conn, "w-other", ["cpu"], 30.0) is None  # running: not again
        # a running job is not expired, however old the cutoff
        assert lifecycle.expire(conn, [fence.job_id], datetime.now(UTC), "j.id") == []
    _fenced(db, lambda c: lifecycle.mark_succeeded(c, fence, result={"ok": 1}))
    with db.begin() as conn:  # succeeded: nothing to cancel
        assert lifecycle.cancel(conn, project_id, fence.job_id) is None
    assert _status(db, fence.job_id) == "succeeded"


def test_a_fan_in_waits_for_the_last_child(db: Engine, project_id: uuid.UUID) -> None:
    fence = _running(db, project_id)
    children = [{"kind": "plan", "request": {"kind": "plan", **plan_request()}}] * 2
    _fenced(db, lambda c: lifecycle.wait_for_children(c, fence, children))
    with db.connect() as conn:
        first = conn.execute(
            text("SELECT id FROM job WHERE parent_id = :p LIMIT 1"), {"p": fence.job_id}
        ).scalar_one()
    child = _claim_child(db, first)
    _fenced(db, lambda c: lifecycle.mark_succeeded(c, child, result={}))
    assert _status(db, fence.job_id) == "running"  # one child still queued


# --------------------------------------------------------------------------- one writer
_WRITES = [
    re.compile(r"UPDATE\s+job\b(?:\s+AS\s+\w+)?\s+SET\b(?P<set>.*?)(?:WHERE|FROM|$)", re.S | re.I),
    re.compile(r"INSERT\s+INTO\s+job\s*\((?P<set>[^)]*)\)", re.I),
    re.compile(r"DELETE\s+FROM\s+job\b(?P<set>)", re.I),
    re.compile(r"\bupdate\(\s*(?:JOB|Job)\b(?P<set>.{0,600})", re.S),
]


def _sql_text(source: str) -> str:
    """The file's string literals joined (implicitly concatenated SQL reads as one text)."""
    parts = re.findall(r'[rf]{0,2}"((?:[^"\\\n]|\\.)*)"', source)
    return " ".join(parts) + "\n" + source


def test_only_the_state_machine_writes_a_jobs_status() -> None:
    offenders = []
    for folder in ("app", "workers"):
        for path in (ROOT / folder).rglob("*.py"):
            if path == ROOT / "app/curvplan_core/jobs/lifecycle.py":
                continue
            text_ = _sql_text(path.read_text())
            for pattern in _WRITES:
                for match in pattern.finditer(text_):
                    written = match.group("set")
                    if match.re.pattern.startswith("DELETE") or re.search(r"\bstatus\b", written):
                        offenders.append(f"{path.relative_to(ROOT)}: {match.group(0)[:80]!r}")
    assert not offenders, "\n".join(offenders)

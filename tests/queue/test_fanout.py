"""Fan-out on the real queue SQL: a parent waits for its children without a lease, the last
child's end queues it for a fan-in attempt, cancel reaches the children, the reaper skips it."""

from __future__ import annotations

import threading
import time
import uuid

from queue_helpers import attempt_rows, insert_jobs, job_row, plan_request
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from curvplan_core.jobs import lifecycle, store
from curvplan_server.jobs import service

W = "test-worker"


def _claim(db: Engine, job_id: uuid.UUID, worker: str = W, lease: float = 30.0) -> store.Fence:
    """Claim ``job_id`` (the only runnable job of its queue is made the oldest)."""
    with db.begin() as conn:
        conn.execute(
            text("UPDATE job SET created_at = now() - interval '1 hour' WHERE id = :id"),
            {"id": job_id},
        )
        claimed = lifecycle.claim(conn, worker, ["cpu"], lease)
    assert claimed is not None and claimed.fence.job_id == job_id
    return claimed.fence


def _children(db: Engine, parent: uuid.UUID) -> list:
    with db.connect() as conn:
        return list(
            conn.execute(
                text("SELECT * FROM job WHERE parent_id = :p ORDER BY created_at, id"),
                {"p": parent},
            )
        )


def _fanned_parent(
    db: Engine, project_id: uuid.UUID, n: int = 3, priority: int = 0
) -> tuple[uuid.UUID, list]:
    (parent,) = insert_jobs(db, project_id, [plan_request()])
    with db.begin() as conn:
        conn.execute(
            text("UPDATE job SET priority = :p WHERE id = :id"), {"p": priority, "id": parent}
        )
    fence = _claim(db, parent)
    children = [
        {"kind": "plan", "request": {"kind": "plan", **plan_request()}, "name": f"point {i}"}
        for i in range(n)
    ]
    with db.begin() as conn:
        assert lifecycle.wait_for_children(conn, fence, children) == "running"
    return parent, _children(db, parent)


def _finish_child(db: Engine, child_id: uuid.UUID, outcome: str = "succeeded") -> None:
    fence = _claim(db, child_id)
    with db.begin() as conn:
        if outcome == "succeeded":
            status = lifecycle.mark_succeeded(conn, fence, result={"ok": 1})
        elif outcome == "failed":
            status = lifecycle.fail(conn, fence, error={"type": "x", "title": "x", "detail": "x"})
        else:
            status = lifecycle.mark_cancelled(conn, fence)
    assert status == outcome


def test_parent_waits_without_lease_and_the_last_child_queues_it(db, project_id):
    parent, children = _fanned_parent(db, project_id, n=3, priority=5)
    row = job_row(db, parent)
    assert row.status == "running" and row.lease_expires_at is None and row.worker_id is None
    assert row.progress["stage"] == "waiting for children"
    assert row.progress["points_total"] == 3 and row.progress["points_done"] == 0
    assert [a.outcome for a in attempt_rows(db, parent)] == ["fanned-out"]
    assert {c.status for c in children} == {"queued"}
    assert {c.project_id for c in children} == {project_id}
    assert {c.priority for c in children} == {5}  # a prioritised job's children keep its place
    # The reaper, even with every lease long expired, leaves the waiting parent alone.
    with db.begin() as conn:
        assert lifecycle.requeue_expired(conn, backoff_base=0.1, backoff_max=0.1) == []
    assert job_row(db, parent).status == "running"

    _finish_child(db, children[0].id)
    _finish_child(db, children[1].id, "failed")
    row = job_row(db, parent)
    assert row.status == "running" and row.progress["points_done"] == 2
    assert row.progress["points_failed"] == 1
    assert row.progress["message"] == "2 of 3 points done (1 failed)"
    _finish_child(db, children[2].id)
    row = job_row(db, parent)
    assert row.status == "queued" and row.max_attempts == 4  # the fan-out attempt is not counted
    assert row.progress["points_done"] == 3
    # The fan-in attempt is a normal leased attempt that sees the children.
    fence = _claim(db, parent)
    assert fence.attempt == 2
    with db.begin() as conn:
        seen = store.load_children(conn, parent)
    assert seen is not None
    assert [c["status"] for c in seen] == ["succeeded", "failed", "succeeded"]
    assert seen[0]["result"] == {"ok": 1}


def test_children_ending_at_once_queue_the_parent_exactly_once(db, project_id):
    parent, children = _fanned_parent(db, project_id, n=2)
    fences = [_claim(db, c.id, worker=f"w{i}") for i, c in enumerate(children)]
    outcomes: dict[int, str | None] = {}
    conn_a = db.connect()
    tx_a = conn_a.begin()
    assert lifecycle.mark_succeeded(conn_a, fences[0], result={}) == "succeeded"  # holds parent

    def finish_b() -> None:
        with db.begin() as conn:
            outcomes[1] = lifecycle.mark_succeeded(conn, fences[1], result={})

    thread = threading.Thread(target=finish_b)
    thread.start()
    time.sleep(0.3)
    assert thread.is_alive()  # blocked on the parent row that A's transaction locked
    tx_a.commit()
    conn_a.close()
    thread.join(timeout=10)
    assert outcomes[1] == "succeeded"
    row = job_row(db, parent)
    assert row.status == "queued" and row.max_attempts == 4


def test_reaped_child_that_runs_out_of_attempts_settles_the_parent(db, project_id):
    parent, children = _fanned_parent(db, project_id, n=1)
    with db.begin() as conn:
        conn.execute(text("UPDATE job SET max_attempts = 1 WHERE id = :id"), {"id": children[0].id})
    _claim(db, children[0].id, lease=0.01)
    time.sleep(0.05)
    with db.begin() as conn:
        reaped = lifecycle.requeue_expired(conn, backoff_base=0.1, backoff_max=0.1)
    assert [r.status for r in reaped] == ["failed"]
    assert job_row(db, parent).status == "queued"


def test_cancelling_the_parent_cancels_children_and_ends_when_the_last_stops(db, project_id):
    parent, children = _fanned_parent(db, project_id, n=3)
    running = _claim(db, children[0].id)
    with Session(db) as session, session.begin():
        out = service.cancel_job(session, project_id, parent)
    assert out.status == "cancelling" and out.children is not None
    assert [c.status for c in out.children] == ["cancelling", "cancelled", "cancelled"]
    with db.begin() as conn:
        assert lifecycle.mark_succeeded(conn, running, result={}) == "cancelled"
    row = job_row(db, parent)
    assert row.status == "cancelled" and row.finished_at is not None
    assert all(c.status == "cancelled" for c in _children(db, parent))


def test_cancelling_a_parent_whose_children_are_all_queued_ends_it_at_once(db, project_id):
    parent, _ = _fanned_parent(db, project_id, n=2)
    with Session(db) as session, session.begin():
        out = service.cancel_job(session, project_id, parent)
    assert out.status == "cancelled"
    assert out.parent_id is None and out.children is not None and len(out.children) == 2


def test_cancelling_the_last_queued_child_queues_the_parent(db, project_id):
    parent, children = _fanned_parent(db, project_id, n=2)
    _finish_child(db, children[0].id)
    with Session(db) as session, session.begin():
        out = service.cancel_job(session, project_id, children[1].id)
    assert out.status == "cancelled" and out.parent_id == parent
    assert job_row(db, parent).status == "queued"


def test_fan_out_of_a_job_cancelled_meanwhile_creates_nothing(db, project_id):
    (parent,) = insert_jobs(db, project_id, [plan_request()])
    fence = _claim(db, parent)
    with Session(db) as session, session.begin():
        assert service.cancel_job(session, project_id, parent).status == "cancelling"
    child = {"kind": "plan", "request": {"kind": "plan", **plan_request()}, "name": "p"}
    with db.begin() as conn:
        assert lifecycle.wait_for_children(conn, fence, [child]) == "cancelled"
    assert _children(db, parent) == []


def test_safety_net_queues_a_parent_whose_children_ended_behind_its_back(db, project_id):
    parent, children = _fanned_parent(db, project_id, n=1)
    with db.begin() as conn:  # e.g. an operator's manual UPDATE, which settles nothing
        conn.execute(
            text("UPDATE job SET status = 'failed' WHERE id = :id"), {"id": children[0].id}
        )
    with db.begin() as conn:
        lifecycle.requeue_expired(conn, backoff_base=0.1, backoff_max=0.1)
    assert job_row(db, parent).status == "queued"


def test_children_are_linked_to_their_artifacts_in_the_fan_out_transaction(db, project_id):
    """A fan-out's children keep their artifacts from deletion like a client's job: their
    ``job_artifact`` rows are written with them (and an empty fan-out writes none)."""
    train, evaluation = uuid.uuid4(), uuid.uuid4()
    with db.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO artifact (id, project_id, kind, storage, sha256, size_bytes)"
                " VALUES (:id, :p, 'dataset', 'blob', :sha, 1)"
            ),
            [{"id": a, "p": project_id, "sha": a.hex * 2} for a in (train, evaluation)],
        )
    (parent,) = insert_jobs(db, project_id, [plan_request()])
    fence = _claim(db, parent)
    point = {"kind": "sweep_point", "train_data": str(train), "eval_data": str(evaluation)}
    children = [
        {"kind": "sweep_point", "request": {**point, "checkpoint": None}, "name": "B=2"},
        {"kind": "plan", "request": {"kind": "plan", **plan_request()}, "name": "plan"},
    ]
    with db.begin() as conn:
        assert lifecycle.wait_for_children(conn, fence, children) == "running"
    point_child, plan_child = _children(db, parent)
    with db.connect() as conn:
        links = set(conn.execute(text("SELECT job_id, field, artifact_id FROM job_artifact")))
    assert links == {
        (point_child.id, "train_data", train),
        (point_child.id, "eval_data", evaluation),
    }
    assert plan_child.kind == "plan"


def test_a_parent_fanned_out_at_submission_waits_with_its_childrens_eta(db, project_id) -> None:
    """``start_waiting`` (the API's fan-out at submission): the never-claimed parent waits
    with its children inserted; its ETA is the slowest unfinished child's plus its fan-in's,
    refreshed on every child's progress; its fan-in is its first attempt (no extra one)."""

    (parent,) = insert_jobs(db, project_id, [plan_request()])
    children = [
        {
            "kind": "plan",
            "request": {"kind": "plan", **plan_request()},
            "name": f"group {i}",
            "eta_seconds": eta,
        }
        for i, eta in enumerate((30.0, 50.0))
    ]
    with db.begin() as conn:
        lifecycle.start_waiting(conn, parent, children, fan_in_seconds=7.0)
    row = job_row(db, parent)
    assert row.status == "running" and row.attempt == 0 and row.lease_expires_at is None
    assert row.progress["stage"] == "waiting for children"
    assert row.progress["eta_seconds"] == 57.0
    first, second = _children(db, parent)
    assert [c.progress["eta_seconds"] for c in (first, second)] == [30.0, 50.0]
    # the slow child runs and reports a shorter ETA: the parent's follows
    fence = _claim(db, second.id)
    with db.begin() as conn:
        store.heartbeat(conn, fence, 30.0, {"fraction": 0.5, "stage": "x", "eta_seconds": 10.0})
    assert job_row(db, parent).progress["eta_seconds"] == 37.0  # now the other child's 30
    with db.begin() as conn:
        lifecycle.mark_succeeded(conn, fence, result={"ok": 1})
    assert job_row(db, parent).progress["eta_seconds"] == 37.0
    _finish_child(db, first.id)
    queued = job_row(db, parent)
    assert queued.status == "queued" and queued.progress["eta_seconds"] == 7.0
    assert queued.max_attempts == row.max_attempts  # the fan-in is its first attempt
    assert attempt_rows(db, parent) == []

"""A failed child whose parent needs every child (``analyze_blocks``) fails the parent at once
and cancels its siblings; a sweep's failed point does not (the sweep fits the others)."""

from __future__ import annotations

import uuid

from queue_helpers import insert_jobs, job_row, plan_request
from sqlalchemy import Engine, text

from curvplan_core.jobs import lifecycle, store

W = "test-worker"


def _claim(db: Engine, job_id: uuid.UUID, queue: str, worker: str = W) -> store.Fence:
    with db.begin() as conn:
        conn.execute(
            text("UPDATE job SET created_at = now() - interval '1 hour' WHERE id = :id"),
            {"id": job_id},
        )
        claimed = lifecycle.claim(conn, worker, [queue], 30.0)
    assert claimed is not None and claimed.fence.job_id == job_id
    return claimed.fence


def _fanned(db: Engine, project_id: uuid.UUID, kind: str, n: int) -> tuple[uuid.UUID, list]:
    (parent,) = insert_jobs(db, project_id, [plan_request()])
    fence = _claim(db, parent, "cpu")
    children = [
        {
            "kind": kind,
            "request": {"kind": kind, "blocks": [f"layers.{i}.q"], "pairs": [["a", "b"]]},
            "name": f"blocks {i + 1}/{n}",
        }
        for i in range(n)
    ]
    with db.begin() as conn:
        assert lifecycle.wait_for_children(conn, fence, children) == "running"
    with db.connect() as conn:
        rows = list(
            conn.execute(
                text("SELECT * FROM job WHERE parent_id = :p ORDER BY created_at, id"),
                {"p": parent},
            )
        )
    return parent, rows


def _fail(db: Engine, child_id: uuid.UUID, queue: str) -> None:
    fence = _claim(db, child_id, queue)
    with db.begin() as conn:
        error = {"type": "invalid-options", "title": "x", "detail": "blocks: unknown"}
        assert lifecycle.fail(conn, fence, error=error) == "failed"


def test_a_failed_block_group_fails_its_parent_and_cancels_the_siblings(db, project_id):
    parent, (first, running, queued) = _fanned(db, project_id, "analyze_blocks", 3)
    sibling_fence = _claim(db, running.id, "gpu", worker="other-worker")
    _fail(db, first.id, "gpu")
    with db.begin() as conn:
        assert lifecycle.fail_parent_fast(conn, first.id) == parent
    row = job_row(db, parent)
    assert row.status == "failed" and row.finished_at is not None
    assert row.error["type"] == "block-group-failed"
    detail = row.error["detail"]
    assert str(first.id) in detail and "invalid-options" in detail and "layers.0.q" in detail
    assert "2 other child job(s) cancelled" in detail
    assert row.progress["points_done"] == 2 and row.progress["points_failed"] == 1
    # The queued sibling ended at once; the running one is asked to stop by its worker.
    assert job_row(db, queued.id).status == "cancelled"
    busy = job_row(db, running.id)
    assert busy.status == "cancelling" and busy.cancel_requested
    # Its end (whatever it brings) leaves the failed parent alone: no fan-in is queued.
    with db.begin() as conn:
        assert lifecycle.mark_succeeded(conn, sibling_fence, result={"ok": 1}) == "cancelled"
    after = job_row(db, parent)
    assert after.status == "failed" and after.error == row.error
    # A second call finds nothing to do.
    with db.begin() as conn:
        assert lifecycle.fail_parent_fast(conn, first.id) is None


def test_a_failed_sweep_point_leaves_the_sweep_waiting_for_the_others(db, project_id):
    parent, (first, second) = _fanned(db, project_id, "sweep_point", 2)
    _fail(db, first.id, "gpu")
    with db.begin() as conn:
        assert lifecycle.fail_parent_fast(conn, first.id) is None
    assert job_row(db, parent).status == "running"
    assert job_row(db, second.id).status == "queued"

"""The heartbeat and the reaper, one beat at a time against the queue database: the fenced
lease renewal, progress written only when it changed, the cancel flag read, a moved fence
noticed, and expired leases and silent workers recovered."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from queue_helpers import insert_jobs, job_row
from slot_helpers import claim_test_job, slot_options
from sqlalchemy import Engine, text

from curvplan_core.jobs import lifecycle, store
from curvplan_worker.attempt import Progress
from curvplan_worker.attempt_state import CurrentAttempt, SlotState
from curvplan_worker.heartbeat import Heartbeat

WORKER = "w-beating"


@pytest.fixture
def beat(db: Engine, queue_db_url: str, tmp_path: Path) -> Heartbeat:
    with db.begin() as conn:
        store.register_worker(conn, WORKER, "host", 1, ["cpu"])
    options = slot_options(queue_db_url, tmp_path)
    return Heartbeat(options, db, WORKER, SlotState(), threading.Event())


def _running(beat: Heartbeat, db: Engine, project_id: uuid.UUID) -> CurrentAttempt:
    job = claim_test_job(db, project_id, WORKER, {}, lease_seconds=1.0)
    beat.state.current = CurrentAttempt(fence=job.fence)
    return beat.state.current


def _worker_row(db: Engine) -> Any:
    with db.connect() as conn:
        return conn.execute(text("SELECT * FROM worker WHERE id = :id"), {"id": WORKER}).one()


def test_a_beat_renews_the_lease_and_writes_progress_only_when_it_changed(
    beat: Heartbeat, db: Engine, project_id: uuid.UUID
) -> None:
    current = _running(beat, db, project_id)
    before = job_row(db, current.fence.job_id).lease_expires_at
    current.record(Progress(0.25, "loading", "model"))
    beat.beat()
    row = job_row(db, current.fence.job_id)
    assert (row.lease_expires_at - before).total_seconds() > 3  # 1 s claim → 5 s lease
    assert row.progress["stage"] == "loading"
    assert [s["stage"] for s in row.progress["stages"]] == ["loading"]
    with db.begin() as conn:  # a mark the next beat must leave alone: nothing new to write
        conn.execute(
            text("UPDATE job SET progress = '{\"mark\": 1}' WHERE id = :id"),
            {"id": current.fence.job_id},
        )
    beat.beat()
    assert job_row(db, current.fence.job_id).progress == {"mark": 1}
    worker = _worker_row(db)
    assert (worker.status, worker.current_job_id) == ("running", current.fence.job_id)


def test_a_beat_hands_the_cancel_flag_to_the_attempt(
    beat: Heartbeat, db: Engine, project_id: uuid.UUID
) -> None:
    current = _running(beat, db, project_id)
    beat.beat()
    assert not current.cancel_requested
    with db.begin() as conn:
        conn.execute(
            text("UPDATE job SET status = 'cancelling', cancel_requested = true WHERE id = :id"),
            {"id": current.fence.job_id},
        )
    beat.beat()
    assert current.cancel_requested and not current.lease_lost


def test_a_beat_whose_fence_moved_marks_the_lease_lost_and_stops_renewing(
    beat: Heartbeat, db: Engine, project_id: uuid.UUID
) -> None:
    current = _running(beat, db, project_id)
    with db.begin() as conn:
        conn.execute(
            text("UPDATE job SET attempt = 2, worker_id = 'w-other' WHERE id = :id"),
            {"id": current.fence.job_id},
        )
    lease = job_row(db, current.fence.job_id).lease_expires_at
    beat.beat()
    assert current.lease_lost
    beat.stop.set()  # the next beat only touches the worker row, as "stopping"
    beat.beat()
    assert job_row(db, current.fence.job_id).lease_expires_at == lease
    assert _worker_row(db).status == "stopping"


def test_the_reaper_queues_an_expired_lease_again_and_stops_a_silent_worker(
    beat: Heartbeat, db: Engine, project_id: uuid.UUID
) -> None:
    (expired,) = insert_jobs(db, project_id, [{}], kind="test")
    with db.begin() as conn:
        assert lifecycle.claim(conn, "w-gone", ["cpu"], 5.0) is not None
        conn.execute(
            text("UPDATE job SET lease_expires_at = now() - interval '1 second' WHERE id = :id"),
            {"id": expired},
        )
        store.register_worker(conn, "w-gone", "host", 2, ["cpu"])
        conn.execute(
            text("UPDATE worker SET last_heartbeat_at = now() - interval '1 hour' WHERE id = :id"),
            {"id": "w-gone"},
        )
    assert beat.reap() == [expired]
    row = job_row(db, expired)
    assert (row.status, row.worker_id, row.lease_expires_at) == ("queued", None, None)
    with db.connect() as conn:
        statuses = dict(conn.execute(text("SELECT id, status FROM worker")).all())
    assert statuses == {"w-gone": "stopped", WORKER: "running"}

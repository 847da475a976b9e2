"""The claim loop of one slot, in process: it registers its ``worker`` row, claims what is
queued (also what arrives while it idles), runs each job to its end, and at the stop marks
its row stopped."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest
from attempt_test_kinds import AttemptRequest, AttemptResult
from queue_helpers import attempt_rows, insert_jobs, job_row, wait_for
from slot_helpers import FORK, slot_options
from sqlalchemy import Engine, text

from curvplan_worker.claim_loop import WorkerSlot
from curvplan_worker.kinds import KINDS, KindSpec


@pytest.fixture(autouse=True)
def test_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(
        KINDS,
        "test",
        KindSpec(
            name="test",
            queue="cpu",
            module="attempt_test_kinds",
            request_type=AttemptRequest,
            result_type=AttemptResult,
        ),
    )


def test_a_slot_claims_each_job_once_idles_between_and_stops_its_row(
    db: Engine, queue_db_url: str, project_id: uuid.UUID, tmp_path: Path
) -> None:
    stop = threading.Event()
    slot = WorkerSlot(slot_options(queue_db_url, tmp_path), db, FORK, stop, threading.Event())
    first = insert_jobs(db, project_id, [{"behaviour": "progress"}] * 2, kind="test")
    thread = threading.Thread(target=slot.run, daemon=True)
    thread.start()
    try:
        done = lambda ids: all(job_row(db, i).status == "succeeded" for i in ids)  # noqa: E731
        wait_for(lambda: done(first), 60, "the queued jobs to succeed")
        with db.connect() as conn:
            worker = conn.execute(
                text("SELECT status, queues FROM worker WHERE id = :id"), {"id": slot.worker_id}
            ).one()
        assert (worker.status, worker.queues) == ("running", ["cpu"])
        # Idle now (nothing queued): a job queued meanwhile is found at the next poll.
        later = insert_jobs(db, project_id, [{"behaviour": "progress"}], kind="test")
        wait_for(lambda: done(later), 60, "the job queued while the slot idled to succeed")
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()
    for job_id in first + later:
        assert [(a.worker_id, a.outcome) for a in attempt_rows(db, job_id)] == [
            (slot.worker_id, "succeeded")
        ]
    with db.connect() as conn:
        worker = conn.execute(
            text("SELECT status, current_job_id FROM worker WHERE id = :id"),
            {"id": slot.worker_id},
        ).one()
    assert (worker.status, worker.current_job_id) == ("stopped", None)

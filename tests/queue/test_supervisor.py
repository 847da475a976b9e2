"""The attempt supervisor, in process against the queue database: each way an attempt ends
is written once, fenced by its claim, and a lost lease writes nothing.

The cancel and lease tests run the slot's real heartbeat thread beside the supervisor: it is
what reads the cancel flag and notices a fence that moved.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from attempt_test_kinds import AttemptRequest, AttemptResult
from queue_helpers import attempt_rows, job_row
from slot_helpers import FORK, claim_test_job, slot_options
from sqlalchemy import Engine, text

from curvplan_worker.attempt_state import SlotState
from curvplan_worker.heartbeat import Heartbeat
from curvplan_worker.kinds import KINDS, KindSpec
from curvplan_worker.supervisor import AttemptSupervisor

WORKER = "w-supervised"


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


class Slot:
    """A supervisor and (started on demand) a heartbeat sharing one slot state."""

    def __init__(self, db: Engine, options: Any) -> None:
        self.state = SlotState()
        self.stop = threading.Event()
        self.hurry = threading.Event()
        self.supervisor = AttemptSupervisor(
            options,
            db,
            FORK,
            self.state,
            self.stop,
            self.hurry,
            WORKER,
            lambda: "unused-key",
        )
        self.heartbeat = Heartbeat(options, db, WORKER, self.state, self.stop)


@pytest.fixture
def slot(db: Engine, queue_db_url: str, tmp_path: Path) -> Iterator[Slot]:
    made = Slot(db, slot_options(queue_db_url, tmp_path))
    yield made
    made.heartbeat.finish(timeout=5)


def test_a_result_is_written_with_the_stages_the_attempt_went_through(
    slot: Slot, db: Engine, project_id: Any
) -> None:
    job = claim_test_job(db, project_id, WORKER, {"behaviour": "progress"})
    slot.supervisor.run(job)
    row = job_row(db, job.fence.job_id)
    assert row.status == "succeeded"
    assert row.result["job_id"] == str(job.fence.job_id) and row.result["attempt"] == 1
    assert [s["stage"] for s in row.progress["stages"]] == ["stage-0", "stage-1", "stage-2"]
    assert row.progress["stage"] == "stage-2" and row.lease_expires_at is None
    assert [a.outcome for a in attempt_rows(db, job.fence.job_id)] == ["succeeded"]
    assert slot.supervisor.outcome == "succeeded"
    assert slot.state.current is None


def test_a_job_error_fails_at_once_though_attempts_remain(
    slot: Slot, db: Engine, project_id: Any
) -> None:
    job = claim_test_job(db, project_id, WORKER, {"behaviour": "job-error"}, max_attempts=3)
    slot.supervisor.run(job)
    row = job_row(db, job.fence.job_id)
    assert (row.status, row.error["type"], row.attempt) == ("failed", "invalid-request", 1)
    assert slot.supervisor.outcome == "failed"


def test_a_crashed_child_queues_the_job_again_after_a_backoff(
    slot: Slot, db: Engine, project_id: Any
) -> None:
    job = claim_test_job(db, project_id, WORKER, {"behaviour": "exit"}, max_attempts=2)
    slot.supervisor.run(job)
    row = job_row(db, job.fence.job_id)
    assert (row.status, row.worker_id, row.error) == ("queued", None, None)
    with db.connect() as conn:
        assert conn.execute(text("SELECT :t > now()"), {"t": row.run_after}).scalar_one()
    assert [a.outcome for a in attempt_rows(db, job.fence.job_id)] == ["crashed"]
    assert slot.supervisor.outcome == "crashed"


def test_a_job_of_a_kind_this_worker_does_not_run_fails_without_a_child(
    slot: Slot, db: Engine, project_id: Any
) -> None:
    job = claim_test_job(db, project_id, WORKER, {}, kind="no-such-kind")
    slot.supervisor.run(job)
    row = job_row(db, job.fence.job_id)
    assert (row.status, row.error["type"]) == ("failed", "unknown-kind")
    assert "no-such-kind" in row.error["detail"]


def test_a_cancel_read_by_the_heartbeat_stops_the_attempt(
    slot: Slot, db: Engine, project_id: Any
) -> None:
    job = claim_test_job(db, project_id, WORKER, {"behaviour": "cooperative", "seconds": 60})
    with db.begin() as conn:  # what the API's cancel writes for a running job
        conn.execute(
            text("UPDATE job SET status = 'cancelling', cancel_requested = true WHERE id = :id"),
            {"id": job.fence.job_id},
        )
    slot.heartbeat.start()
    started = time.monotonic()
    slot.supervisor.run(job)
    assert time.monotonic() - started < 30  # not the 60 s the attempt would run
    row = job_row(db, job.fence.job_id)
    assert (row.status, row.result) == ("cancelled", None)
    assert [a.outcome for a in attempt_rows(db, job.fence.job_id)] == ["cancelled"]


def test_a_lost_lease_abandons_the_attempt_and_writes_nothing(
    slot: Slot, db: Engine, project_id: Any
) -> None:
    job = claim_test_job(db, project_id, WORKER, {"behaviour": "cooperative", "seconds": 60})
    with db.begin() as conn:  # the job moved on: another claim holds attempt 2 now
        conn.execute(
            text("UPDATE job SET attempt = 2, worker_id = 'w-other' WHERE id = :id"),
            {"id": job.fence.job_id},
        )
    slot.heartbeat.start()
    slot.supervisor.run(job)
    row = job_row(db, job.fence.job_id)
    assert (row.status, row.worker_id, row.attempt, row.result) == ("running", "w-other", 2, None)
    assert [a.outcome for a in attempt_rows(db, job.fence.job_id)] == [None]
    assert slot.supervisor.outcome == "lease-lost"


def test_a_second_signal_releases_the_job_without_counting_the_attempt(
    slot: Slot, db: Engine, project_id: Any
) -> None:
    job = claim_test_job(
        db, project_id, WORKER, {"behaviour": "cooperative", "seconds": 60}, max_attempts=3
    )
    slot.stop.set()
    slot.hurry.set()
    slot.supervisor.run(job)
    row = job_row(db, job.fence.job_id)
    assert (row.status, row.max_attempts, row.worker_id) == ("queued", 4, None)
    assert [a.outcome for a in attempt_rows(db, job.fence.job_id)] == ["released"]
    assert slot.supervisor.outcome == "released"

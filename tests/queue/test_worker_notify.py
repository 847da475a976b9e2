"""An idle worker is woken by NOTIFY when a job is queued: with its database polling pushed
out to 60 s, a new job still starts within seconds."""

from __future__ import annotations

import time

import pytest
from queue_helpers import attempt_rows, insert_jobs, job_row, plan_request, wait_for

pytestmark = pytest.mark.e2e


def test_idle_worker_claims_a_new_job_on_notify(db, project_id, start_worker, monkeypatch):
    monkeypatch.setenv("CURVPLAN_NOTIFY_FALLBACK_SECONDS", "60")
    worker = start_worker("--poll-interval", "60")
    # Idle first: registered, and past its first (empty) claim.
    wait_for(
        lambda: any("worker started" in r.get("message", "") for r in worker.log_records()),
        30,
        "the worker to start",
    )
    time.sleep(1.0)
    (job_id,) = insert_jobs(db, project_id, [plan_request()])
    began = time.monotonic()
    wait_for(lambda: attempt_rows(db, job_id), 15, "the job to be claimed")
    assert time.monotonic() - began < 10
    wait_for(lambda: job_row(db, job_id).status == "succeeded", 30, "the job to finish")

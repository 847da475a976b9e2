"""A per-kind time limit: an attempt that runs past it is killed and fails with ``timeout``."""

from __future__ import annotations

import json
import time

import pytest
from queue_helpers import FAST, attempt_rows, insert_jobs, job_row, plan_request, wait_for

pytestmark = pytest.mark.e2e

SLOW = plan_request(4000, orderings=4000, bootstrap=3000)  # well over a second of CPU


def test_an_attempt_past_its_kinds_time_limit_fails_with_timeout(
    db, project_id, start_worker, monkeypatch
):
    monkeypatch.setenv("CURVPLAN_JOB_TIME_LIMITS", json.dumps({"plan": 0.5}))
    (job_id,) = insert_jobs(db, project_id, [SLOW], max_attempts=3)
    worker = start_worker(*FAST)
    began = time.monotonic()
    wait_for(lambda: job_row(db, job_id).status == "failed", 30, "the job to time out")
    row = job_row(db, job_id)
    assert row.error["type"] == "timeout"
    assert "0.5" in row.error["detail"] and "plan" in row.error["detail"]
    # A deterministic limit: not retried.
    assert [a.outcome for a in attempt_rows(db, job_id)] == ["failed"]
    assert time.monotonic() - began < 25
    assert worker.proc.poll() is None

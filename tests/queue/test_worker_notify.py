"""An idle worker is woken by NOTIFY when a job is queued: with its database polling pushed
out to 60 s, a new job still starts within seconds. The same worker serves its own
/metrics and /healthz, which count that attempt."""

from __future__ import annotations

import re
import socket
import time

import httpx
import pytest
from queue_helpers import attempt_rows, insert_jobs, job_row, plan_request, wait_for

pytestmark = pytest.mark.e2e


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_idle_worker_claims_a_new_job_on_notify(db, project_id, start_worker, monkeypatch):
    monkeypatch.setenv("CURVPLAN_NOTIFY_FALLBACK_SECONDS", "60")
    port = _free_port()
    worker = start_worker("--poll-interval", "60", "--metrics-port", str(port))
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

    base = f"http://127.0.0.1:{port}"
    health = httpx.get(f"{base}/healthz", timeout=5)
    assert health.status_code == 200, health.text
    assert len(health.json()["slots"]) == 1
    text = httpx.get(f"{base}/metrics", timeout=5).text
    assert 'curvplan_worker_attempts_total{kind="plan",outcome="succeeded"} 1.0' in text
    assert "curvplan_worker_lease_lost_total 0.0" in text
    assert "curvplan_worker_busy_slots 0.0" in text
    stages = re.findall(
        r'curvplan_worker_stage_duration_seconds_count\{kind="plan",stage="([^"]+)"\}', text
    )
    assert stages, text[-2000:]

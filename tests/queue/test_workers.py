"""Real ``curvplan worker`` processes on a real PostgreSQL running real plan jobs.

Timings are short (lease 1.5 s, heartbeat 0.2 s, backoff 0.2 s) so lease expiry,
re-queueing and cancel happen within seconds. A "slow" job is a real plan with
4000 per-sample losses and thousands of orderings/bootstrap resamples (1–3 s).
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from typing import Any

import pytest
from queue_helpers import (
    FAST,
    WorkerProcess,
    attempt_rows,
    insert_jobs,
    job_row,
    plan_request,
    wait_for,
)
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from curvplan_core.planner import Measurements, Recommendation, Targets, make_plan
from curvplan_server.jobs.service import cancel_job
from curvplan_worker.kinds.plan import seed_for_job

pytestmark = pytest.mark.e2e

SLOW = plan_request(4000, orderings=2000, bootstrap=1500)


def status_of(db: Engine, job_id: uuid.UUID) -> str:
    return job_row(db, job_id).status


def child_pid(worker: WorkerProcess, job_id: uuid.UUID, attempt: int) -> int | None:
    """The pid of the child running (job, attempt), from the worker's JSON log."""
    for record in worker.log_records():
        if (
            record.get("message") == "attempt started"
            and record.get("job_id") == str(job_id)
            and record.get("attempt") == attempt
        ):
            return int(record["child_pid"])
    return None


def process_gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie awaiting its parent's wait counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def logged(worker: WorkerProcess, message_part: str) -> list[dict[str, Any]]:
    return [r for r in worker.log_records() if message_part in r.get("message", "")]


def worker_rows(db: Engine) -> dict[str, Any]:
    with db.connect() as conn:
        return {row.id: row for row in conn.execute(text("SELECT * FROM worker"))}


JOBS = 160


@pytest.mark.slow
def test_four_workers_run_160_jobs_exactly_once(db, project_id, start_worker):
    # 40 a worker: enough contention on the claim for a double claim to show (it was 400,
    # a minute and a half of the suite's 2 cores for no stronger check)
    ids = insert_jobs(db, project_id, [plan_request(30 + i % 20) for i in range(JOBS)])
    # Nothing expires here: a longer lease and heartbeat keep the database chatter low.
    workers = [
        start_worker("--lease-seconds", "10", "--heartbeat-seconds", "1", "--poll-interval", "0.05")
        for _ in range(4)
    ]

    def all_done() -> bool:
        with db.connect() as conn:
            return not conn.execute(
                text("SELECT 1 FROM job WHERE status <> 'succeeded' LIMIT 1")
            ).first()

    wait_for(all_done, 120, f"{JOBS} jobs to succeed", every=0.5)
    with db.connect() as conn:
        jobs = conn.execute(text("SELECT id, attempt, worker_id, result FROM job")).all()
        attempts = conn.execute(
            text("SELECT job_id, attempt, worker_id, outcome, ended_at FROM job_attempt")
        ).all()
    assert len(jobs) == JOBS and {j.id for j in jobs} == set(ids)
    assert all(j.attempt == 1 for j in jobs)
    # Exactly one attempt per job, ended succeeded, by the worker the job names.
    assert len(attempts) == JOBS and len({a.job_id for a in attempts}) == JOBS
    assert {a.outcome for a in attempts} == {"succeeded"}
    assert all(a.ended_at is not None for a in attempts)
    by_job = {a.job_id: a.worker_id for a in attempts}
    assert all(by_job[j.id] == j.worker_id for j in jobs)
    assert len({j.worker_id for j in jobs}) >= 2, "the jobs should be shared between workers"

    # The stored result is the planner's own answer for that job (independent re-run).
    sample = jobs[0]
    request = plan_request(30 + ids.index(sample.id) % 20)
    expected = make_plan(
        Measurements.model_validate_json(json.dumps(request["measurements"])),
        Targets.model_validate_json(json.dumps(request["targets"])),
        seed=seed_for_job(str(sample.id)),
    )
    assert sample.result == {"recommendation": expected.model_dump(mode="json")}
    Recommendation.model_validate(sample.result["recommendation"])

    for worker in workers:
        worker.signal(signal.SIGTERM)
    assert [worker.wait(15) for worker in workers] == [0, 0, 0, 0]
    rows = worker_rows(db)
    assert len(rows) == 4
    assert {r.status for r in rows.values()} == {"stopped"}
    assert all(r.current_job_id is None for r in rows.values())


def started_attempt(
    workers: list[WorkerProcess], job_id: uuid.UUID, attempt: int = 1
) -> tuple[WorkerProcess, int]:
    """Wait until one of ``workers`` has started (job, attempt); that worker and the child pid."""

    def find() -> tuple[WorkerProcess, int] | None:
        for worker in workers:
            pid = child_pid(worker, job_id, attempt)
            if pid is not None:
                return worker, pid
        return None

    return wait_for(find, 30, f"a worker to start attempt {attempt}")


@pytest.mark.parametrize("max_attempts", [3, 1])
def test_sigkilled_worker_job_is_reaped_and_finished_once(
    db, project_id, start_worker, max_attempts, tmp_path
):
    (job_id,) = insert_jobs(db, project_id, [SLOW], max_attempts=max_attempts)
    health = [tmp_path / "alive-0", tmp_path / "alive-1"]
    workers = [start_worker(*FAST, "--health-file", str(path)) for path in health]
    doomed, pid = started_attempt(workers, job_id)
    (rescuer,) = [w for w in workers if w is not doomed]
    doomed_health, rescuer_health = (health[workers.index(w)] for w in (doomed, rescuer))
    wait_for(lambda: all(p.exists() for p in health), 10, "both workers' first heartbeat")
    # Progress written by the heartbeat is visible while the job runs.
    wait_for(lambda: (job_row(db, job_id).progress or {}).get("stage") == "plan", 10, "progress")
    doomed_id = job_row(db, job_id).worker_id
    doomed.signal(signal.SIGKILL)
    doomed.wait(10)
    wait_for(lambda: process_gone(pid), 10, "the orphaned child to exit")
    # The health signal: the live worker keeps beating, the killed one stopped.
    time.sleep(3.0)
    assert _worker_health(rescuer_health, max_age=2.0) == 0
    assert _worker_health(doomed_health, max_age=2.0) == 1

    if max_attempts == 1:
        wait_for(lambda: status_of(db, job_id) == "failed", 30, "the job to fail")
        row = job_row(db, job_id)
        assert row.error["type"] == "worker-lost" and doomed_id in row.error["detail"]
        assert [a.outcome for a in attempt_rows(db, job_id)] == ["lease-lost"]
        assert logged(rescuer, "reaped a job whose lease expired")
        return
    wait_for(lambda: status_of(db, job_id) == "succeeded", 60, "the rescuer to finish the job")
    row = job_row(db, job_id)
    attempts = attempt_rows(db, job_id)
    assert row.attempt == 2 and row.worker_id != doomed_id
    assert [(a.attempt, a.worker_id, a.outcome) for a in attempts] == [
        (1, doomed_id, "lease-lost"),
        (2, row.worker_id, "succeeded"),
    ]
    assert row.result["recommendation"]["sample_size"]["n_losses"] == 4000
    assert child_pid(rescuer, job_id, 2) is not None
    # The dead worker's row: no heartbeat for CURVPLAN_WORKER_STALE_SECONDS (3 s) → stopped.
    wait_for(lambda: worker_rows(db)[doomed_id].status == "stopped", 15, "the stale worker row")
    assert worker_rows(db)[doomed_id].current_job_id is None


def _worker_health(path: Any, max_age: float) -> int:
    """``curvplan worker-health`` (the Docker HEALTHCHECK) on a worker's health file."""
    from typer.testing import CliRunner

    from curvplan.cli import app

    args = ["worker-health", "--file", str(path), "--max-age", str(max_age)]
    return CliRunner().invoke(app, args).exit_code


def test_paused_zombie_worker_cannot_overwrite_the_job(db, project_id, start_worker):
    """SIGSTOP a worker mid-job (a GC pause, a frozen VM): its lease expires, another
    worker finishes the job; when the zombie wakes up its late write is fenced out."""
    (job_id,) = insert_jobs(db, project_id, [SLOW])
    workers = [start_worker(*FAST), start_worker(*FAST)]
    zombie, _ = started_attempt(workers, job_id)
    zombie.signal(signal.SIGSTOP)
    try:
        wait_for(lambda: status_of(db, job_id) == "succeeded", 60, "the other worker to finish")
        before = job_row(db, job_id)
    finally:
        zombie.signal(signal.SIGCONT)
    wait_for(lambda: logged(zombie, "lease lost"), 20, "the zombie to notice its lost lease")
    time.sleep(0.5)  # give a (wrong) late write every chance to land
    assert job_row(db, job_id) == before
    assert [a.outcome for a in attempt_rows(db, job_id)] == ["lease-lost", "succeeded"]
    assert zombie.proc.poll() is None, "losing a lease ends the attempt, not the worker"


def test_cancel_queued_job_is_never_run(db, project_id, start_worker):
    cancelled, other = insert_jobs(db, project_id, [plan_request(), plan_request()])
    with Session(db) as session:
        assert cancel_job(session, project_id, cancelled).status == "cancelled"
        session.commit()
    start_worker(*FAST)
    wait_for(lambda: status_of(db, other) == "succeeded", 30, "the other job")
    assert status_of(db, cancelled) == "cancelled"
    assert attempt_rows(db, cancelled) == []


def test_cancel_running_job_stops_its_child(db, project_id, start_worker):
    (job_id,) = insert_jobs(db, project_id, [SLOW])
    worker = start_worker(*FAST)
    wait_for(lambda: child_pid(worker, job_id, 1), 30, "the job to start")
    pid = child_pid(worker, job_id, 1)
    with Session(db) as session:
        assert cancel_job(session, project_id, job_id).status == "cancelling"
        session.commit()
    wait_for(lambda: status_of(db, job_id) == "cancelled", 10, "the job to be cancelled")
    assert process_gone(pid)
    # The plan kind reports no progress inside the planner, so the child does not see
    # the cancel event there: the worker kills it after the 1 s grace period (the
    # cooperative path is covered in test_attempt.py).
    assert logged(worker, "cancellation requested")
    assert logged(worker, "ignored cancellation") or logged(worker, "attempt stopped")
    row = job_row(db, job_id)
    assert row.result is None and row.finished_at is not None
    assert [a.outcome for a in attempt_rows(db, job_id)] == ["cancelled"]
    assert worker.proc.poll() is None


def test_crashed_child_ends_the_attempt_not_the_worker(db, project_id, start_worker):
    (job_id,) = insert_jobs(db, project_id, [SLOW], max_attempts=2)
    worker = start_worker(*FAST)
    for attempt in (1, 2):
        wait_for(lambda a=attempt: child_pid(worker, job_id, a), 30, f"attempt {attempt}")
        os.kill(child_pid(worker, job_id, attempt), signal.SIGKILL)  # what the OOM killer does
    wait_for(lambda: status_of(db, job_id) == "failed", 10, "the job to fail")
    row = job_row(db, job_id)
    assert row.error["type"] == "worker-crashed"
    assert "SIGKILL" in row.error["detail"] and "attempt 2 of 2" in row.error["detail"]
    assert [a.outcome for a in attempt_rows(db, job_id)] == ["crashed", "crashed"]
    # The worker lives on and runs the next job.
    assert worker.proc.poll() is None
    (next_job,) = insert_jobs(db, project_id, [plan_request()])
    wait_for(lambda: status_of(db, next_job) == "succeeded", 30, "the next job")


@pytest.mark.slow
def test_sigterm_lets_the_running_job_finish(db, project_id, start_worker):
    (job_id,) = insert_jobs(db, project_id, [SLOW])
    worker = start_worker(*FAST, "--shutdown-grace-seconds", "60")
    wait_for(lambda: child_pid(worker, job_id, 1), 30, "the job to start")
    worker.signal(signal.SIGTERM)
    wait_for(
        lambda: {r.status for r in worker_rows(db).values()} == {"stopping"}, 5, "stopping status"
    )
    assert worker.wait(60) == 0
    row = job_row(db, job_id)
    assert (row.status, row.attempt) == ("succeeded", 1)
    assert {r.status for r in worker_rows(db).values()} == {"stopped"}


def test_sigterm_releases_a_job_that_outlives_the_grace_period(db, project_id, start_worker):
    (job_id,) = insert_jobs(db, project_id, [SLOW], max_attempts=1)
    workers = [start_worker(*FAST, "--shutdown-grace-seconds", "0.3") for _ in range(2)]
    leaving, pid = started_attempt(workers, job_id)
    (staying,) = [w for w in workers if w is not leaving]
    leaving.signal(signal.SIGTERM)
    assert leaving.wait(15) == 0
    assert process_gone(pid)
    assert logged(leaving, "job released at shutdown")
    wait_for(lambda: status_of(db, job_id) == "succeeded", 60, "the other worker to finish it")
    row = job_row(db, job_id)
    # The release gave the job back without using up its only attempt: max_attempts
    # was raised to 2, so the second claim could run it.
    assert (row.attempt, row.max_attempts) == (2, 2)
    assert [a.outcome for a in attempt_rows(db, job_id)] == ["released", "succeeded"]
    assert child_pid(staying, job_id, 2) is not None


@pytest.mark.slow
def test_concurrency_runs_jobs_side_by_side_in_one_process(db, project_id, start_worker):
    ids = insert_jobs(db, project_id, [SLOW, SLOW])
    worker = start_worker(*FAST, "--concurrency", "2")

    def both_running() -> bool:
        with db.connect() as conn:
            return (
                conn.execute(
                    text("SELECT count(DISTINCT worker_id) FROM job WHERE status = 'running'")
                ).scalar()
                == 2
            )

    wait_for(both_running, 30, "two slots running a job each")

    def both_rows_show_their_job() -> bool:
        # A slot's row learns its current job at the slot's next heartbeat, not at the claim.
        return {r.current_job_id for r in worker_rows(db).values()} == set(ids)

    wait_for(both_rows_show_their_job, 30, "each slot's worker row names its job")
    rows = worker_rows(db)
    assert len(rows) == 2 and {r.pid for r in rows.values()} == {worker.pid}
    worker.signal(signal.SIGTERM)
    assert worker.wait(60) == 0
    assert {status_of(db, job_id) for job_id in ids} == {"succeeded"}

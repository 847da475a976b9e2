"""The queue's SQL against a real PostgreSQL: claim, fencing, reaper, release, crash, workers.

These call ``curvplan_core.jobs.lifecycle`` and ``store`` directly (the worker processes are
exercised in test_workers.py), so each rule can be checked on exact rows: what a claim writes,
which writes a fence rejects, what the reaper makes of an expired lease.
"""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import pytest
from queue_helpers import attempt_rows, insert_jobs, job_row, plan_request
from sqlalchemy import Engine, text

from curvplan_core.jobs import lifecycle, store


def expire_lease(db: Engine, job_id: uuid.UUID, seconds_ago: float = 1.0) -> None:
    """Make the job's lease end in the past, as if its worker had stopped heart-beating."""
    with db.begin() as conn:
        conn.execute(
            text(
                "UPDATE job SET lease_expires_at = now() - make_interval(secs => :s) WHERE id = :id"
            ),
            {"id": job_id, "s": seconds_ago},
        )


def claim(db: Engine, worker_id: str, queues: tuple[str, ...] = ("cpu",)) -> store.ClaimedJob:
    with db.begin() as conn:
        job = lifecycle.claim(conn, worker_id, list(queues), lease_seconds=30)
    assert job is not None, f"{worker_id} found nothing to claim"
    return job


def test_claim_sets_lease_attempt_and_records_the_attempt(db, project_id):
    (job_id,) = insert_jobs(db, project_id, [plan_request()])
    with db.begin() as conn:
        store.register_worker(conn, "w1", "host", 1, ["cpu"])
    job = claim(db, "w1")
    assert job.fence == store.Fence(job_id, "w1", 1)
    assert job.kind == "plan" and job.request == plan_request()
    row = job_row(db, job_id)
    assert row.status == "running" and row.worker_id == "w1" and row.attempt == 1
    assert row.started_at is not None
    lease_left = (row.lease_expires_at - row.started_at).total_seconds()
    assert 29 < lease_left <= 30.001
    (attempt,) = attempt_rows(db, job_id)
    assert (attempt.attempt, attempt.worker_id, attempt.outcome) == (1, "w1", None)
    with db.connect() as conn:
        current = conn.execute(text("SELECT current_job_id FROM worker WHERE id = 'w1'")).scalar()
    assert current == job_id
    # The job is taken: nobody else can claim it.
    with db.begin() as conn:
        assert lifecycle.claim(conn, "w2", ["cpu"], 30) is None


def test_claim_order_queue_filter_and_run_after(db, project_id):
    low, high, later = insert_jobs(db, project_id, [plan_request()] * 3)
    with db.begin() as conn:
        conn.execute(text("UPDATE job SET priority = 5 WHERE id = :id"), {"id": high})
        conn.execute(
            text("UPDATE job SET run_after = now() + interval '1 hour' WHERE id = :id"),
            {"id": later},
        )
        assert lifecycle.claim(conn, "w", ["gpu"], 30) is None  # plan jobs are on the cpu queue
    assert claim(db, "w").fence.job_id == high  # priority first
    assert claim(db, "w").fence.job_id == low
    with db.begin() as conn:
        assert lifecycle.claim(conn, "w", ["cpu"], 30) is None  # `later` is not due yet


def test_concurrent_claims_never_hand_out_a_job_twice(db, project_id):
    ids = insert_jobs(db, project_id, [plan_request()] * 60)
    claimed: list[uuid.UUID] = []
    lock = threading.Lock()

    def claimer(worker_id: str) -> None:
        while True:
            with db.begin() as conn:
                job = lifecycle.claim(conn, worker_id, ["cpu"], 30)
            if job is None:
                return
            with lock:
                claimed.append(job.fence.job_id)

    threads = [threading.Thread(target=claimer, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(claimed) == sorted(ids)
    with db.connect() as conn:
        counts = conn.execute(
            text("SELECT count(*), count(DISTINCT job_id) FROM job_attempt")
        ).one()
    assert tuple(counts) == (60, 60)


def test_heartbeat_renews_lease_writes_progress_and_reads_cancel(db, project_id):
    (job_id,) = insert_jobs(db, project_id, [plan_request()])
    job = claim(db, "w1")
    expire_lease(db, job_id, seconds_ago=-0.5)  # lease ends in 0.5 s
    progress = {"fraction": 0.5, "stage": "fit", "message": "half"}
    with db.begin() as conn:
        beat = store.heartbeat(conn, job.fence, 30, progress)
    assert beat == store.Heartbeat(status="running", cancel_requested=False)
    row = job_row(db, job_id)
    assert row.progress == progress
    assert (row.lease_expires_at - row.updated_at) > timedelta(seconds=29)
    with db.begin() as conn:
        conn.execute(
            text("UPDATE job SET status = 'cancelling', cancel_requested = true WHERE id = :id"),
            {"id": job_id},
        )
        beat = store.heartbeat(conn, job.fence, 30, None)
    assert beat == store.Heartbeat(status="cancelling", cancel_requested=True)
    assert job_row(db, job_id).progress == progress  # None keeps the last progress


def test_zombie_writes_are_fenced_out_after_the_job_was_reclaimed(db, project_id):
    (job_id,) = insert_jobs(db, project_id, [plan_request()])
    zombie = claim(db, "zombie")
    expire_lease(db, job_id)
    with db.begin() as conn:
        (reaped,) = lifecycle.requeue_expired(conn, backoff_base=0, backoff_max=0)
    assert (reaped.job_id, reaped.status, reaped.lost_worker_id) == (job_id, "queued", "zombie")
    fresh = claim(db, "fresh")
    assert fresh.fence.attempt == 2
    before = job_row(db, job_id)

    late_result = {"recommendation": {"from": "zombie"}}
    with db.begin() as conn:
        assert store.heartbeat(conn, zombie.fence, 30, {"fraction": 1.0}) is None
        assert lifecycle.mark_succeeded(conn, zombie.fence, result=late_result) is None
        assert lifecycle.release(conn, zombie.fence) is None
        crashed = lifecycle.requeue_for_retry(
            conn, zombie.fence, detail="x", backoff_base=0, backoff_max=0
        )
        assert crashed is None
    after = job_row(db, job_id)
    assert after == before  # not one column changed
    assert [a.outcome for a in attempt_rows(db, job_id)] == ["lease-lost", None]

    with db.begin() as conn:
        assert lifecycle.mark_succeeded(conn, fresh.fence, result={"ok": 1}) == "succeeded"
    row = job_row(db, job_id)
    assert (row.status, row.result, row.worker_id) == ("succeeded", {"ok": 1}, "fresh")
    assert [a.outcome for a in attempt_rows(db, job_id)] == ["lease-lost", "succeeded"]
    # A finished job cannot be written again, not even by its own worker.
    with db.begin() as conn:
        assert lifecycle.fail(conn, fresh.fence, error={"type": "x"}) is None


def test_reaper_backoff_is_exponential_and_capped(db, project_id):
    (job_id,) = insert_jobs(db, project_id, [plan_request()], max_attempts=10)
    base, cap = 2.0, 5.0
    delays = []
    for attempt in range(1, 5):
        job = claim(db, f"w{attempt}")
        assert job.fence.attempt == attempt
        expire_lease(db, job_id)
        with db.begin() as conn:
            (reaped,) = lifecycle.requeue_expired(conn, backoff_base=base, backoff_max=cap)
            delay = conn.execute(
                text("SELECT extract(epoch FROM run_after - updated_at) FROM job WHERE id = :id"),
                {"id": job_id},
            ).scalar()
        assert reaped.status == "queued"
        delays.append(float(delay))
        with db.begin() as conn:  # make it due again for the next round
            conn.execute(text("UPDATE job SET run_after = now() WHERE id = :id"), {"id": job_id})
    assert delays == pytest.approx([2.0, 4.0, 5.0, 5.0], abs=1e-3)
    assert [store.backoff_seconds(a, base, cap) for a in range(1, 5)] == [2.0, 4.0, 5.0, 5.0]


def test_reaper_fails_the_last_attempt_with_worker_lost_and_cancels_cancelling(db, project_id):
    last, cancelling = insert_jobs(db, project_id, [plan_request()] * 2, max_attempts=1)
    claim(db, "lost-worker")
    claim(db, "lost-worker")
    with db.begin() as conn:
        conn.execute(
            text("UPDATE job SET status = 'cancelling', cancel_requested = true WHERE id = :id"),
            {"id": cancelling},
        )
    expire_lease(db, last)
    expire_lease(db, cancelling)
    with db.begin() as conn:
        reaped = lifecycle.requeue_expired(conn, backoff_base=1, backoff_max=1)
    assert {r.job_id: r.status for r in reaped} == {last: "failed", cancelling: "cancelled"}
    row = job_row(db, last)
    assert row.error["type"] == "worker-lost"
    assert "lost-worker" in row.error["detail"] and row.error["title"]
    assert row.finished_at is not None and row.lease_expires_at is None
    assert job_row(db, cancelling).finished_at is not None
    for job_id in (last, cancelling):
        assert [a.outcome for a in attempt_rows(db, job_id)] == ["lease-lost"]
    with db.begin() as conn:  # nothing left to reap, and live leases are left alone
        assert lifecycle.requeue_expired(conn, backoff_base=1, backoff_max=1) == []


def test_concurrent_reapers_reap_each_job_once(db, project_id):
    ids = insert_jobs(db, project_id, [plan_request()] * 40)
    for _ in ids:
        claim(db, "dead")
    with db.begin() as conn:
        conn.execute(text("UPDATE job SET lease_expires_at = now() - interval '1 second'"))
    results: list[list[store.ReapedJob]] = []
    barrier = threading.Barrier(4)

    def reaper() -> None:
        barrier.wait()
        with db.begin() as conn:
            results.append(lifecycle.requeue_expired(conn, backoff_base=0, backoff_max=0, batch=15))

    for _ in range(3):  # a few rounds: each round four reapers race
        threads = [threading.Thread(target=reaper) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    reaped_ids = [r.job_id for batch in results for r in batch]
    assert sorted(reaped_ids) == sorted(ids)  # every job exactly once
    with db.connect() as conn:
        outcomes = conn.execute(text("SELECT outcome, count(*) FROM job_attempt GROUP BY 1")).all()
    assert outcomes == [("lease-lost", 40)]


def test_release_requeues_without_spending_an_attempt(db, project_id):
    (job_id,) = insert_jobs(db, project_id, [plan_request()], max_attempts=2)
    job = claim(db, "w1")
    with db.begin() as conn:
        assert lifecycle.release(conn, job.fence) == "queued"
    row = job_row(db, job_id)
    assert (row.status, row.attempt, row.max_attempts, row.worker_id) == ("queued", 1, 3, None)
    assert [a.outcome for a in attempt_rows(db, job_id)] == ["released"]
    assert claim(db, "w2").fence.attempt == 2  # claimable again at once


def test_crash_requeues_until_max_attempts_then_fails_worker_crashed(db, project_id):
    (job_id,) = insert_jobs(db, project_id, [plan_request()], max_attempts=2)
    job = claim(db, "w1")
    with db.begin() as conn:
        status = lifecycle.requeue_for_retry(
            conn, job.fence, detail="killed by SIGKILL", backoff_base=0, backoff_max=0
        )
    assert status == "queued"
    job = claim(db, "w1")
    with db.begin() as conn:
        status = lifecycle.requeue_for_retry(
            conn, job.fence, detail="killed by SIGKILL", backoff_base=0, backoff_max=0
        )
    assert status == "failed"
    row = job_row(db, job_id)
    assert row.error["type"] == "worker-crashed"
    assert "SIGKILL" in row.error["detail"] and "attempt 2 of 2" in row.error["detail"]
    assert [a.outcome for a in attempt_rows(db, job_id)] == ["crashed", "crashed"]


def test_a_transient_failure_requeues_then_fails_with_its_own_error_type(db, project_id):
    (job_id,) = insert_jobs(db, project_id, [plan_request()], max_attempts=2)
    for expected in ("queued", "failed"):
        job = claim(db, "w1")
        with db.begin() as conn:
            status = lifecycle.requeue_for_retry(
                conn,
                job.fence,
                detail="download of blob 00ff failed",
                backoff_base=0,
                backoff_max=0,
                error_type="transient-error",
                title="A transfer failed",
            )
        assert status == expected
    error = job_row(db, job_id).error
    assert (error["type"], error["title"]) == ("transient-error", "A transfer failed")
    assert "blob 00ff" in error["detail"] and "attempt 2 of 2" in error["detail"]


def test_finish_while_cancelling_ends_cancelled_and_drops_the_result(db, project_id):
    (job_id,) = insert_jobs(db, project_id, [plan_request()])
    job = claim(db, "w1")
    with db.begin() as conn:
        conn.execute(
            text("UPDATE job SET status = 'cancelling', cancel_requested = true WHERE id = :id"),
            {"id": job_id},
        )
        assert lifecycle.mark_succeeded(conn, job.fence, result={"late": True}) == "cancelled"
    row = job_row(db, job_id)
    assert (row.status, row.result) == ("cancelled", None)
    assert [a.outcome for a in attempt_rows(db, job_id)] == ["cancelled"]


def test_stale_workers_are_marked_stopped_and_revive_on_heartbeat(db):
    with db.begin() as conn:
        store.register_worker(conn, "old", "h", 1, ["cpu"])
        store.register_worker(conn, "live", "h", 2, ["gpu"])
        conn.execute(
            text("UPDATE worker SET last_heartbeat_at = now() - interval '1 minute' WHERE id='old'")
        )
        assert store.mark_stale_workers(conn, 30) == ["old"]
        store.touch_worker(conn, "old", "running", None)
        rows = dict(conn.execute(text("SELECT id, status FROM worker")).all())
    assert rows == {"old": "running", "live": "running"}


def _plan_nodes(plan: dict[str, object]) -> list[dict[str, object]]:
    nodes = [plan]
    for child in plan.get("Plans", []):  # type: ignore[union-attr]
        nodes += _plan_nodes(child)  # type: ignore[arg-type]
    return nodes


N_BACKLOG_PROJECTS = 20
BACKLOG = 6000


def _backlog(db: Engine, project_id: uuid.UUID) -> None:
    """A busy queue: 20 000 finished jobs over 20 projects, one project's backlog of 6 000
    queued cpu jobs (a big fan-out), and two queued jobs (cpu, gpu) of each other project."""
    projects = [project_id] + [_new_project(db) for _ in range(N_BACKLOG_PROJECTS - 1)]
    insert = (
        "INSERT INTO job (id, project_id, kind, queue, status, request, created_at)"
        " SELECT gen_random_uuid(), {project},"
        "  CASE WHEN g % {every} = 0 THEN 'analyze' ELSE 'plan' END,"
        "  CASE WHEN g % {every} = 0 THEN 'gpu' ELSE 'cpu' END,"
        "  '{status}', '{{}}'::jsonb, clock_timestamp() FROM generate_series(1, :n) AS g"
    )
    all_projects = "(:projects)[1 + g % cardinality(:projects)]"
    others = "(:projects)[2 + g % (cardinality(:projects) - 1)]"
    with db.begin() as conn:
        conn.execute(
            text(insert.format(project=all_projects, every=3, status="succeeded")),
            {"projects": projects, "n": 20000},
        )
        conn.execute(  # g % (n + 1) is never 0: every job of the backlog is a cpu job
            text(insert.format(project=":p", every=BACKLOG + 1, status="queued")),
            {"p": project_id, "n": BACKLOG},
        )
        conn.execute(
            text(insert.format(project=others, every=2, status="queued")),
            {"projects": projects, "n": 2 * (N_BACKLOG_PROJECTS - 1)},
        )
        conn.execute(text("ANALYZE job"))


@pytest.mark.parametrize("queues", [("cpu",), ("gpu",), ("cpu", "gpu")])
def test_claim_walks_indexes_instead_of_sorting_the_backlog(db, project_id, queues):
    """With a backlog, a claim must not sort every queued job (it did: ~100 ms per claim at
    200 000 queued jobs). The fair claim reads each project's head jobs from an index and
    sorts only those: at most (project, queue) pairs × CLAIM_DEPTH rows, whatever the backlog."""
    _backlog(db, project_id)
    with db.connect() as conn:
        trans = conn.begin()
        (plan,) = conn.execute(
            text("EXPLAIN (ANALYZE, FORMAT JSON) " + lifecycle.CLAIM_SQL.text),
            {"worker_id": "w-explain", "queues": list(queues), "lease": 30.0},
        ).scalar_one()
        trans.rollback()
    nodes = _plan_nodes(plan["Plan"])
    job_scans = [n for n in nodes if n.get("Relation Name") == "job" and "Scan" in n["Node Type"]]
    assert not [n for n in job_scans if n["Node Type"] == "Seq Scan"], plan
    assert any(n.get("Index Name") == "ix_job_project_claim" for n in nodes), plan
    heads = 2 * N_BACKLOG_PROJECTS * lifecycle.CLAIM_DEPTH  # (project, queue) pairs × depth
    sorts = [n for n in nodes if n["Node Type"] in ("Sort", "Incremental Sort")]
    assert all(n["Actual Rows"] * n["Actual Loops"] <= heads for n in sorts), plan
    read = sum(
        (n["Actual Rows"] + n.get("Rows Removed by Filter", 0)) * n["Actual Loops"]
        for n in job_scans
    )
    assert read <= 4 * heads, f"the claim read {read} job rows of a {BACKLOG}-job backlog"
    # All projects idle and never served, all priority 0: the oldest queued job goes first.
    with db.connect() as conn:
        oldest = conn.execute(
            text(
                "SELECT id FROM job WHERE status = 'queued' AND queue = ANY(:q)"
                " ORDER BY created_at LIMIT 1"
            ),
            {"q": list(queues)},
        ).scalar_one()
    assert claim(db, "w-1", queues).fence.job_id == oldest


def _new_project(db: Engine) -> uuid.UUID:
    pid = uuid.uuid4()
    with db.begin() as conn:
        conn.execute(
            text("INSERT INTO project (id, name) VALUES (:id, :name)"),
            {"id": pid, "name": f"queue-test-{pid.hex[:8]}"},
        )
    return pid


def test_one_projects_many_jobs_do_not_starve_another_project(db, project_id):
    """Project A queues many jobs (a fan-out's children), project B one job later: B's job is
    claimed before A's second, by a second worker while A's first runs (fewest running
    first) and by the same worker after A's first ended (round robin)."""
    project_b = _new_project(db)
    a_jobs = insert_jobs(db, project_id, [plan_request()] * 30)
    (b_job,) = insert_jobs(db, project_b, [plan_request()])
    first = claim(db, "w1")
    assert first.fence.job_id in a_jobs
    assert claim(db, "w2").fence.job_id == b_job  # A has one running, B none
    # Round robin on one worker: A's next job, then B's next, though all of A's are older.
    (b_next,) = insert_jobs(db, project_b, [plan_request()])
    with db.begin() as conn:
        conn.execute(text("UPDATE job SET status = 'succeeded' WHERE status = 'running'"))
    a_second = claim(db, "w1").fence.job_id
    assert a_second in a_jobs and a_second != first.fence.job_id  # B was served last
    with db.begin() as conn:
        conn.execute(text("UPDATE job SET status = 'succeeded' WHERE id = :id"), {"id": a_second})
    assert claim(db, "w1").fence.job_id == b_next


def test_priority_still_comes_before_fairness(db, project_id):
    """A's urgent jobs go first even while A runs more jobs than B and was served last."""
    project_b = _new_project(db)
    (b_job,) = insert_jobs(db, project_b, [plan_request()])
    urgent = insert_jobs(db, project_id, [plan_request()] * 2)
    with db.begin() as conn:
        conn.execute(text("UPDATE job SET priority = 5 WHERE id = ANY(:ids)"), {"ids": urgent})
    assert {claim(db, "w1").fence.job_id, claim(db, "w2").fence.job_id} == set(urgent)
    assert claim(db, "w3").fence.job_id == b_job


def test_a_claim_falls_back_when_every_head_is_locked(db, project_id):
    """Two claims at once on one project with more claimers than CLAIM_DEPTH heads: the
    fallback hands out the next job instead of nothing."""
    # one insert each, so the creation times (and so the heads) are distinct
    n_jobs = lifecycle.CLAIM_DEPTH + 2
    jobs = [insert_jobs(db, project_id, [plan_request()])[0] for _ in range(n_jobs)]
    with db.connect() as holder:
        trans = holder.begin()
        held = (
            holder.execute(
                text(
                    "SELECT id FROM job WHERE status = 'queued' ORDER BY created_at LIMIT :n"
                    " FOR UPDATE"
                ),
                {"n": lifecycle.CLAIM_DEPTH},
            )
            .scalars()
            .all()
        )
        got = claim(db, "w1").fence.job_id
        trans.rollback()
    assert got == jobs[lifecycle.CLAIM_DEPTH] and got not in held


def test_live_workers_counts_fresh_slots_of_the_queue(db):
    """The default number of fan-out groups: running gpu worker slots with a fresh heartbeat."""
    from curvplan_core.fanout_groups import live_workers

    with db.begin() as conn:
        store.register_worker(conn, "g1", "host", 1, ["gpu", "cpu"])
        store.register_worker(conn, "g2", "host", 1, ["gpu"])
        store.register_worker(conn, "c1", "host", 1, ["cpu"])
        store.register_worker(conn, "old", "host", 1, ["gpu"])
        store.register_worker(conn, "gone", "host", 1, ["gpu"])
        conn.execute(
            text("UPDATE worker SET last_heartbeat_at = now() - interval '1 minute' WHERE id='old'")
        )
        store.stop_worker(conn, "gone")
    with db.connect() as conn:
        assert live_workers(conn, "gpu", stale_seconds=30) == 2
        assert live_workers(conn, "cpu", stale_seconds=30) == 2

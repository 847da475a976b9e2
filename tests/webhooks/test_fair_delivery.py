"""Fair webhook delivery: a burst of deliveries to a receiver that never
answers holds a bounded share of the senders and is backed off as a whole, so another
project's delivery waits no longer than one attempt's time limit.

Real parts: the outbox in PostgreSQL, the worker's sender loop in a thread, a loopback TCP
listener that accepts and never answers, and a real HTTP receiver that does.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from receiver import Receiver, SilentReceiver
from sqlalchemy import text
from sqlalchemy.orm import Session
from test_webhooks import LOOPBACK, _job, _project, _set_status

from curvplan.webhooks import verify
from curvplan_server.webhooks.service import list_deliveries
from curvplan_worker.webhooks import SenderOptions, deliver_due, sender_loop

BURST = 60  # the probe's 200, scaled to the test's time limit: 6 rounds of 10 in flight


def _burst(engine: Any, project_id: uuid.UUID, url: str, count: int) -> None:
    """``count`` pending deliveries of one project to ``url``, all due before anything else
    (the probe's jobs created and cancelled in a burst, as the outbox trigger writes them)."""
    job_id = _job(engine, project_id, url)
    with engine.begin() as conn:
        conn.execute(
            text(
                """
                INSERT INTO webhook_delivery (id, job_id, project_id, url, event_type, payload,
                                              next_attempt_at)
                SELECT gen_random_uuid(), :job, :project, :url, 'job.cancelled',
                       jsonb_build_object('id', 'x', 'type', 'job.cancelled'),
                       now() - make_interval(secs => 60 - i)
                  FROM generate_series(1, :count) AS i
                """
            ),
            {"job": job_id, "project": project_id, "url": url, "count": count},
        )


def test_a_burst_to_a_silent_receiver_delays_no_other_project(
    engine: Any, receiver: Receiver, silent_receiver: SilentReceiver
) -> None:
    options = SenderOptions(policy=LOOPBACK, max_attempts=8, backoff_seconds=30.0,
                            timeout_seconds=1.5, batch=10)  # fmt: skip
    noisy, _ = _project(engine)
    _burst(engine, noisy, silent_receiver.url, BURST)
    stop = threading.Event()
    sender = threading.Thread(target=sender_loop, args=(engine, options, stop, 0.1), daemon=True)
    sender.start()
    try:
        deadline = time.monotonic() + 10
        while silent_receiver.accepted == 0 and time.monotonic() < deadline:
            time.sleep(0.02)  # the burst is being sent: its first deliveries are in flight
        assert silent_receiver.accepted > 0
        quiet, secret = _project(engine)
        quiet_job = _job(engine, quiet, receiver.url + "/quiet")
        _set_status(engine, quiet_job, "succeeded")
        started = time.monotonic()
        (got,) = receiver.wait_for(1, timeout=30)
        waited = time.monotonic() - started
        # Before: oldest due first, 10 in flight, each taking its 1.5 s: ~9 s behind the burst.
        assert waited <= options.timeout_seconds, f"another project waited {waited:.1f} s"
        assert verify(got.body, got.headers, secret).job.id == str(quiet_job)
        # The burst's endpoint failed its first attempts and is now open (backed off as a
        # whole): nothing more reaches it for the cooldown. Before it opened, a slot freed by
        # one of the first failures may have taken one more of the burst.
        time.sleep(2 * options.timeout_seconds + 0.5)
    finally:
        stop.set()
        sender.join(timeout=30)
    tried = silent_receiver.accepted
    assert silent_receiver.most_open <= options.project_share
    assert options.breaker_failures <= tried <= options.project_share + options.breaker_failures
    with engine.connect() as conn:
        breaker = conn.execute(
            text("SELECT failures, open_until > now() AS open FROM webhook_endpoint "
                 "WHERE project_id = :p"), {"p": noisy},
        ).one()  # fmt: skip
        untried = conn.execute(
            text("SELECT count(*) FROM webhook_delivery WHERE project_id = :p AND attempts = 0"),
            {"p": noisy},
        ).scalar_one()
    assert breaker.failures == tried and breaker.open
    assert untried == BURST - tried  # still pending, not given up

    # Half-open: once the cooldown has passed, one probe at a time; it fails, and the endpoint
    # opens again for twice as long.
    with engine.begin() as conn:
        conn.execute(text("UPDATE webhook_endpoint SET open_until = now() WHERE project_id = :p"),
                     {"p": noisy})  # fmt: skip
    assert deliver_due(engine, options) == 1
    assert silent_receiver.accepted == tried + 1
    with engine.connect() as conn:
        cooldown = conn.execute(
            text("SELECT extract(epoch FROM open_until - now()) FROM webhook_endpoint "
                 "WHERE project_id = :p"), {"p": noisy},
        ).scalar_one()  # fmt: skip
    expected = options.backoff_seconds * 2 ** (tried + 1 - options.breaker_failures)
    assert expected - 5 < cooldown <= expected


def test_with_every_slot_held_by_failing_projects_another_waits_one_time_limit(
    engine: Any, receiver: Receiver, silent_receiver: SilentReceiver
) -> None:
    """Three projects' bursts to the silent receiver fill all 10 slots (4 + 4 + 2): a fourth
    project's delivery takes the first slot that frees, within one attempt's time limit (plus
    the sender's poll), ahead of the bursts' remaining deliveries."""
    options = SenderOptions(policy=LOOPBACK, max_attempts=8, backoff_seconds=30.0,
                            timeout_seconds=1.5, batch=10)  # fmt: skip
    for _ in range(3):
        noisy, _ = _project(engine)
        _burst(engine, noisy, silent_receiver.url, BURST // 3)
    stop = threading.Event()
    sender = threading.Thread(target=sender_loop, args=(engine, options, stop, 0.1), daemon=True)
    sender.start()
    try:
        deadline = time.monotonic() + 10
        while silent_receiver.accepted < options.batch and time.monotonic() < deadline:
            time.sleep(0.02)
        assert silent_receiver.accepted == options.batch  # every slot held
        quiet, _ = _project(engine)
        quiet_job = _job(engine, quiet, receiver.url + "/quiet")
        _set_status(engine, quiet_job, "succeeded")
        started = time.monotonic()
        receiver.wait_for(1, timeout=30)
        waited = time.monotonic() - started
    finally:
        stop.set()
        sender.join(timeout=30)
    # Before: 60 deliveries ahead of it, 10 at a time, 1.5 s each: ~9 s.
    assert waited <= options.timeout_seconds + 1.0, f"another project waited {waited:.1f} s"


def test_an_answer_closes_the_breaker(engine: Any, receiver: Receiver) -> None:
    """A probe that succeeds closes the endpoint: its deliveries flow again at once."""
    project_id, _ = _project(engine)
    endpoint = receiver.url.lower()
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO webhook_endpoint (project_id, endpoint, failures, open_until) "
                 "VALUES (:p, :e, 7, now() - interval '1 second')"),
            {"p": project_id, "e": endpoint},
        )  # fmt: skip
    jobs = [_job(engine, project_id, f"{receiver.url}/{i}") for i in range(3)]
    for job in jobs:
        _set_status(engine, job, "succeeded")
    options = SenderOptions(policy=LOOPBACK, backoff_seconds=0.05, timeout_seconds=5, batch=10)
    assert deliver_due(engine, options) == 1  # half-open: one probe
    assert deliver_due(engine, options) == 2  # it succeeded: closed, the rest go together
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM webhook_endpoint WHERE project_id = :p"),
                            {"p": project_id}).scalar_one() == 0  # fmt: skip
    with Session(engine) as session:
        for job in jobs:
            (delivery,) = list_deliveries(session, project_id, job).items
            assert delivery.status == "succeeded"

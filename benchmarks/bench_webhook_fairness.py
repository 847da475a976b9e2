"""The webhook-fairness probe at full scale: 200 webhook deliveries of one project to a
URL that never answers, and another project's events meanwhile (docs/integrations.md).

A fresh database; the worker's sender loop (``curvplan_worker.webhooks.sender_loop``, the
service's defaults: 10 in flight, 10 s time limit, 8 attempts, backoff 10 s, a project's
share 4, breaker after 3 failures) in a thread; a loopback listener that accepts and never
answers, and a real receiver. The noisy project's 200 deliveries are all due at the start
(its jobs created and cancelled in a burst); then the quiet project finishes one job every
``--every`` seconds for ``--seconds``. Prints, for the quiet project's events, the wait from
the job's end to the receiver (p50, max), and how many connections the silent URL got.

    python benchmarks/bench_webhook_fairness.py [--seconds 60] [--every 2] [--burst 200]

Before the fix (oldest due first, 10 in flight) the probe measured ~93 s for the other
project's events; ``tests/webhooks/test_fair_delivery.py`` measured 9.0 s on the old claim
at a 1.5 s limit.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import threading
import time
from pathlib import Path

import psycopg
from psycopg import sql
from sqlalchemy import text
from sqlalchemy.orm import Session

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "webhooks"))

from receiver import start_receiver, start_silent_receiver  # noqa: E402

from curvplan.types.jobs import PlanJobCreate  # noqa: E402
from curvplan_core.config import libpq_url  # noqa: E402
from curvplan_core.credentials.keys import create_key, lookup_key  # noqa: E402
from curvplan_core.db import make_engine  # noqa: E402
from curvplan_core.webhooks.guard import AddressPolicy  # noqa: E402
from curvplan_server import migrations  # noqa: E402
from curvplan_server.jobs import service  # noqa: E402
from curvplan_server.webhooks.service import rotate_secret  # noqa: E402
from curvplan_worker.webhooks import SenderOptions, sender_loop  # noqa: E402

BODY = {"kind": "plan", "measurements": {"loss_bound": 1.0}, "name": "hooked"}


def _project(engine: object, name: str) -> object:
    with Session(engine) as session:  # type: ignore[call-overload]
        key = create_key(session, name)
        session.commit()
        project_id = lookup_key(session, key).project_id  # type: ignore[union-attr]
        rotate_secret(session, project_id)
    return project_id


def _jobs(engine: object, project_id: object, url: str, count: int) -> list[object]:
    ids = []
    with Session(engine) as session:  # type: ignore[call-overload]
        for _ in range(count):
            model = PlanJobCreate.model_validate({**BODY, "webhook_url": url})
            ids.append(
                service.create_job(session, project_id, model, default_max_attempts=3).job.id
            )  # type: ignore[arg-type]
        session.commit()
    return ids


def _end(engine: object, job_ids: list[object]) -> None:
    with engine.begin() as conn:  # type: ignore[attr-defined]
        conn.execute(
            text("UPDATE job SET status = 'cancelled', finished_at = now() WHERE id = ANY(:ids)"),
            {"ids": job_ids},
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--every", type=float, default=2.0)
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument(
        "--admin-url",
        default=os.environ.get(
            "CURVPLAN_TEST_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    name = f"curvplan_bench_{secrets.token_hex(3)}"
    admin = libpq_url(args.admin_url)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = admin.rsplit("/", 1)[0] + "/" + name
    receiver_gen, silent_gen = start_receiver(), start_silent_receiver()
    receiver, silent = next(receiver_gen), next(silent_gen)
    waits: list[float] = []
    try:
        migrations.upgrade(url)
        engine = make_engine(url)
        noisy, quiet = _project(engine, "noisy"), _project(engine, "quiet")
        _end(engine, _jobs(engine, noisy, silent.url, args.burst))  # the burst, all due now
        options = SenderOptions(policy=AddressPolicy.from_lists(["127.0.0.1"], ["127.0.0.0/8"]))
        stop = threading.Event()
        sender = threading.Thread(target=sender_loop, args=(engine, options, stop), daemon=True)
        sender.start()
        started = time.monotonic()
        quiet_jobs = _jobs(engine, quiet, receiver.url + "/quiet", round(args.seconds / args.every))
        for i, job_id in enumerate(quiet_jobs):
            time.sleep(max(0.0, started + i * args.every - time.monotonic()))
            ended = time.monotonic()
            _end(engine, [job_id])
            receiver.wait_for(i + 1, timeout=120)
            waits.append(time.monotonic() - ended)
        elapsed = time.monotonic() - started
        stop.set()
        sender.join(timeout=60)
        with engine.connect() as conn:
            breaker = conn.execute(
                text("SELECT failures, open_until FROM webhook_endpoint WHERE project_id = :p"),
                {"p": noisy},
            ).first()
        engine.dispose()
    finally:
        for gen in (receiver_gen, silent_gen):
            gen.close()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
    print(
        f"bench_webhook_fairness: {args.burst} deliveries of one project to a URL that never "
        f"answers, all due at once; another project's {len(waits)} events, one every "
        f"{args.every:g} s over {elapsed:.0f} s; sender defaults (10 in flight, "
        f"{options.timeout_seconds:g} s limit, share {options.project_share}, breaker after "
        f"{options.breaker_failures}); load average before={load_before:.1f} "
        f"after={os.getloadavg()[0]:.1f}"
    )
    print(
        f"other project's wait, job end -> received: p50={statistics.median(waits):.2f} s  "
        f"max={max(waits):.2f} s  (the goal: at most one time limit, "
        f"{options.timeout_seconds:g} s)"
    )
    print(
        f"silent URL: {silent.accepted} connections in {elapsed:.0f} s, at most "
        f"{silent.most_open} at once; its breaker: "
        f"{breaker.failures if breaker else 0} failures in a row, "
        f"{'open' if breaker and breaker.open_until else 'closed'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Cost of one claim with a backlog: the fair claim beside a plain FIFO claim, side by side.

Fills a scratch database with ``--history`` finished jobs over all projects, one project's
backlog of ``--backlog`` queued jobs (a large fan-out) and two queued jobs of each of
``--projects`` other projects, then times ``curvplan_core.jobs.lifecycle.CLAIM_SQL`` (fair across
projects, docs/operations.md#claim-order) and the FIFO claim it replaced (ORDER BY priority
DESC, created_at on ``ix_job_claim_order``), each claim rolled back, and prints the fair
claim's EXPLAIN ANALYZE. Needs PostgreSQL: ``--admin-url``.

    python benchmarks/bench_claim.py [--history 200000] [--backlog 5000] [--projects 50]
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FIFO_CLAIM = """
    UPDATE job SET status = 'running', attempt = attempt + 1, worker_id = :worker_id,
        lease_expires_at = now() + make_interval(secs => :lease),
        started_at = coalesce(started_at, now()), updated_at = now(), progress = NULL
    WHERE id = (
        SELECT id FROM job
        WHERE status = 'queued' AND queue = ANY(:queues) AND run_after <= now()
          AND coalesce((request #>> '{resources,devices}')::int, 1)
              <= coalesce((SELECT devices FROM worker WHERE id = :worker_id), 1)
        ORDER BY priority DESC, created_at
        FOR UPDATE SKIP LOCKED
        LIMIT 1
    )
    RETURNING id, kind, queue, request, attempt, max_attempts
"""

INSERT = (
    "INSERT INTO job (id, project_id, kind, queue, status, request, created_at)"
    " SELECT gen_random_uuid(), {project}, 'analyze', 'gpu', '{status}', '{{}}'::jsonb,"
    " clock_timestamp() FROM generate_series(1, :n) AS g"
)


def fill(conn, args: argparse.Namespace) -> None:
    from sqlalchemy import text

    projects = [uuid.uuid4() for _ in range(args.projects + 1)]
    for p in projects:
        conn.execute(text("INSERT INTO project (id, name) VALUES (:i, :n)"), {"i": p, "n": str(p)})
    every = "(:projects)[1 + g % cardinality(:projects)]"
    others = "(:projects)[2 + g % (cardinality(:projects) - 1)]"
    conn.execute(
        text(INSERT.format(project=every, status="succeeded")),
        {"projects": projects, "n": args.history},
    )
    conn.execute(
        text(INSERT.format(project=":p", status="queued")), {"p": projects[0], "n": args.backlog}
    )
    conn.execute(
        text(INSERT.format(project=others, status="queued")),
        {"projects": projects, "n": 2 * args.projects},
    )
    conn.execute(
        text(
            "UPDATE job SET status = 'running', worker_id = 'x',"
            " lease_expires_at = now() + interval '1 minute' WHERE id IN"
            " (SELECT id FROM job WHERE status = 'queued' AND project_id = :p LIMIT 8)"
        ),
        {"p": projects[0]},
    )
    conn.execute(text("ANALYZE job"))


def median_ms(db, statement, repeats: int) -> float:
    params = {"worker_id": "bench", "queues": ["gpu"], "lease": 30.0}
    times = []
    for _ in range(repeats):
        with db.connect() as conn:
            trans = conn.begin()
            start = time.perf_counter()
            conn.execute(statement, params).all()
            times.append(time.perf_counter() - start)
            trans.rollback()
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--history", type=int, default=200_000)
    parser.add_argument("--backlog", type=int, default=5_000)
    parser.add_argument("--projects", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()

    import psycopg
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from curvplan_core.config import libpq_url, normalise_database_url
    from curvplan_core.jobs import lifecycle
    from curvplan_server import migrations

    name = f"curvplan_bench_claim_{secrets.token_hex(4)}"
    with psycopg.connect(libpq_url(args.admin_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = make_url(args.admin_url).set(database=name).render_as_string(False)
    url = normalise_database_url(url)
    try:
        migrations.upgrade(url)
        db = create_engine(url)
        with db.begin() as conn:
            fill(conn, args)
        with db.connect() as conn:
            trans = conn.begin()
            plan = conn.execute(
                text("EXPLAIN (ANALYZE) " + lifecycle.CLAIM_SQL.text),
                {"worker_id": "bench", "queues": ["gpu"], "lease": 30.0},
            ).scalars()
            print("\n".join(plan))
            trans.rollback()
        fair = median_ms(db, lifecycle.CLAIM_SQL, args.repeats)
        fifo = median_ms(db, text(FIFO_CLAIM), args.repeats)
        db.dispose()
    finally:
        with psycopg.connect(libpq_url(args.admin_url), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print(
        f"history {args.history}, backlog {args.backlog} in one project, "
        f"{args.projects} other projects with 2 queued each"
    )
    print(f"{'claim':>6} {'median ms':>10} {'ratio':>6}")
    print(f"{'fifo':>6} {fifo:>10.2f} {1.0:>6.2f}")
    print(f"{'fair':>6} {fair:>10.2f} {fair / fifo:>6.2f}")


if __name__ == "__main__":
    main()

"""Queue throughput: N small plan jobs run by W real ``curvplan worker`` processes.

Prints jobs/s (from the first claim to the last finish), the per-attempt wall time
(claim → outcome written, from ``job_attempt``) as p50/p99, and the worker start-up
time (process start → first claim). ``--child-latency`` instead times one attempt
child (start → result of a small plan) under ``forkserver`` and ``spawn``, without
a database: why the worker uses a preloaded forkserver. Needs PostgreSQL: ``--admin-url`` (default
``postgresql://postgres@127.0.0.1:5432/postgres``); a scratch database is created
and dropped.

    python benchmarks/bench_queue.py --jobs 400 --workers 4
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_service import curvplan_command

# Only the standard library at module level: every attempt child re-runs this main
# script (multiprocessing's "prepare" step), so heavy imports live in the functions.


def plan_body(n_losses: int) -> dict[str, object]:
    losses = [0.2 + 0.8 * ((i * 7919) % 1000) / 1000.0 for i in range(n_losses)]
    return {
        "kind": "plan",
        "measurements": {"per_sample_losses": losses, "loss_bound": 1.0},
        "targets": {"tolerances": [0.05], "orderings": 4, "bootstrap": 0},
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def child_latency(method: str, runs: int) -> None:
    """Start → result of one small plan attempt in a child, p50 over ``runs`` (after warm-up)."""
    from curvplan_worker.attempt import AttemptProcess, Final, make_context
    from curvplan_worker.child import ChildTask

    ctx = make_context(method, ["cpu"])
    times = []
    for _ in range(runs + 1):
        start = time.perf_counter()
        task = ChildTask(
            "plan",
            str(uuid.uuid4()),
            1,
            "bench",
            json.dumps(plan_body(40)),
            "/tmp",
            "json",
            "WARNING",
        )
        child = AttemptProcess(ctx, task)
        final = None
        while not child.finished_talking:
            for message in child.receive(0.005):
                if isinstance(message, Final):
                    final = message
        child.join()
        child.close()
        assert final is not None and final.kind == "result", final
        times.append(time.perf_counter() - start)
    print(
        f"{method}: first attempt {1000 * times[0]:.0f} ms (server start + preload), then"
        f" p50 {1000 * percentile(times[1:], 0.5):.1f} ms,"
        f" p99 {1000 * percentile(times[1:], 0.99):.1f} ms per attempt"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--child-latency", action="store_true")
    args = parser.parse_args()
    if args.child_latency:
        child_latency("forkserver", 30)
        child_latency("spawn", 3)
        return

    import psycopg
    from psycopg import sql
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from curvplan_core.config import libpq_url, normalise_database_url
    from curvplan_server import migrations

    name = f"curvplan_bench_queue_{secrets.token_hex(4)}"
    with psycopg.connect(libpq_url(args.admin_url), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = normalise_database_url(
        make_url(args.admin_url).set(database=name).render_as_string(hide_password=False)
    )
    procs: list[subprocess.Popen[bytes]] = []
    engine = create_engine(url)
    try:
        migrations.upgrade(url)
        project = uuid.uuid4()
        with engine.begin() as conn:
            conn.execute(
                text("INSERT INTO project (id, name) VALUES (:id, 'bench')"), {"id": project}
            )
            conn.execute(
                text(
                    "INSERT INTO job (id, project_id, kind, queue, status, request)"
                    " VALUES (:id, :p, 'plan', 'cpu', 'queued', CAST(:r AS jsonb))"
                ),
                [
                    {"id": uuid.uuid4(), "p": project, "r": json.dumps(plan_body(30 + i % 20))}
                    for i in range(args.jobs)
                ],
            )
        env = {**os.environ, "DATABASE_URL": url, "CURVPLAN_LOG_LEVEL": "WARNING"}
        logs = Path(tempfile.mkdtemp(prefix="bench-queue-"))
        started = time.time()
        for i in range(args.workers):
            procs.append(
                subprocess.Popen(
                    [
                        *curvplan_command(),
                        "worker",
                        "--queues",
                        "cpu",
                        "--poll-interval",
                        "0.05",
                    ],
                    env=env,
                    stdout=(logs / f"w{i}.log").open("wb"),
                    stderr=subprocess.STDOUT,
                )
            )
        while True:
            with engine.connect() as conn:
                left = conn.execute(
                    text("SELECT count(*) FROM job WHERE status NOT IN ('succeeded', 'failed')")
                ).scalar()
            if left == 0:
                break
            time.sleep(0.2)
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT extract(epoch FROM claimed_at) AS c, extract(epoch FROM ended_at) AS e,"
                    " outcome FROM job_attempt"
                )
            ).all()
            statuses = dict(conn.execute(text("SELECT status, count(*) FROM job GROUP BY 1")).all())
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(30)
        engine.dispose()
        with psycopg.connect(libpq_url(args.admin_url), autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
    first_claim = min(float(r.c) for r in rows)
    last_end = max(float(r.e) for r in rows)
    durations = [float(r.e) - float(r.c) for r in rows]
    print(
        f"jobs: {args.jobs}, workers: {args.workers}, cores: {os.cpu_count()}, statuses: {statuses}"
    )
    print(f"attempts: {len(rows)} (outcomes: {sorted({r.outcome for r in rows})})")
    print(f"worker start → first claim: {first_claim - started:.2f} s")
    print(f"throughput: {len(rows) / (last_end - first_claim):.1f} jobs/s")
    print(
        f"attempt wall time (claim → outcome): p50 {1000 * percentile(durations, 0.5):.1f} ms,"
        f" p99 {1000 * percentile(durations, 0.99):.1f} ms"
    )


if __name__ == "__main__":
    main()

"""PostgreSQL restarted under a steady submit load: 20 submissions/s for 30 s (full figures).

A private embedded PostgreSQL (never the shared server) backs ``curvplan serve`` and one
``curvplan worker``; raw POSTs (no retries) go out at ``--rate`` per second while the
server is stopped for ``--down`` seconds and started again; a Python client submits
beside them with its default retry policy. Printed: the answers by status (every one
must be 202 or 503 with Retry-After), how many accepted jobs finished and how many ran
more than once, and what the Python client lost or duplicated.

    python benchmarks/bench_db_restart.py [--rate 20] [--seconds 30] [--down 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import restart_load  # noqa: E402
from live_plugin import free_port, make_api_key  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--restart-at", type=float, default=10.0)
    parser.add_argument("--down", type=float, default=3.0)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    pg = restart_load.PrivatePostgres()
    work = Path(tempfile.mkdtemp(prefix="curvplan-bench-restart-"))
    server = worker = None
    try:
        url = pg.create_database()
        key = make_api_key(url, f"bench-restart-{uuid.uuid4().hex[:6]}")
        port = free_port()
        server, worker = restart_load.start_service(url, work, port)
        result = restart_load.run_load(
            f"http://127.0.0.1:{port}",
            key,
            pg,
            rate=args.rate,
            seconds=args.seconds,
            restart_at=args.restart_at,
            down_seconds=args.down,
        )
        accepted = result.accepted + result.client_submitted
        state = restart_load.wait_finished(url, accepted, timeout=600)
    finally:
        if worker is not None:
            restart_load.stop_process(worker)
        if server is not None:
            restart_load.stop_process(server)
        pg.cleanup()
    jobs = state["jobs"]
    finished = sum(1 for j in accepted if j in jobs and jobs[j].status == "succeeded")
    twice = sum(1 for j in accepted if j in jobs and jobs[j].succeeded_attempts > 1)
    retried = sum(1 for j in accepted if j in jobs and jobs[j].attempts > 1)
    names = [row.name for row in jobs.values()]
    raw_rows = names.count(restart_load.RAW_NAME)
    client_rows = names.count(restart_load.CLIENT_NAME)
    q = statistics.quantiles(result.latencies, n=100) if len(result.latencies) > 2 else [0] * 99
    print(
        f"PostgreSQL restart under load: {args.rate:.0f} POST/s for {args.seconds:.0f} s, "
        f"database down {result.down_seconds:.1f} s (stop, {args.down:.0f} s pause, start); "
        f"cores={os.cpu_count()}, load average before={load_before:.1f} "
        f"after={os.getloadavg()[0]:.1f}"
    )
    print(f"raw POST answers by status: {dict(sorted(result.statuses.items()))}")
    print(f"answers other than 202 or 503+Retry-After: {len(result.unexpected)}")
    print(f"raw POST latency ms: p50={q[49] * 1e3:.1f} p99={q[98] * 1e3:.1f}")
    print(
        f"accepted jobs: {len(accepted)}; succeeded {finished}; pending {len(state['pending'])}; "
        f"succeeded more than once {twice}; with a second attempt {retried}"
    )
    print(
        f"raw rows {raw_rows} for {len(result.accepted)} answered 202 "
        f"(extra rows, committed but answered 503: {raw_rows - len(result.accepted)})"
    )
    submitted = len(result.client_submitted)
    lost = sum(1 for j in result.client_submitted if j not in jobs)
    print(
        f"Python client: {submitted} submitted, {client_rows} rows (lost {lost}, "
        f"duplicated {max(0, client_rows - submitted)}), errors {len(result.client_errors)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

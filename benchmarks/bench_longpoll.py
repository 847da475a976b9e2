"""Database transactions per second while N clients long-poll queued jobs: polling vs NOTIFY.

Starts ``curvplan serve`` on a fresh database (no worker: the jobs stay queued), creates
N jobs, then lets N clients hold ``GET /v1/jobs/{id}?wait=30`` for a fixed time. The
database load is read from ``pg_stat_database`` (``xact_commit + xact_rollback`` of the
benchmark database) before and after. Run twice: with ``CURVPLAN_JOB_NOTIFY=false`` (each
long-poll queries every ``long_poll_interval_seconds``, the previous behaviour) and with
the default LISTEN/NOTIFY (each long-poll re-checks only every fallback interval).

    python benchmarks/bench_longpoll.py [--clients 500] [--seconds 15]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_api import free_port, wait_ready  # noqa: E402

from curvplan_core.config import libpq_url  # noqa: E402
from curvplan_core.credentials.keys import create_key  # noqa: E402
from curvplan_core.db import make_engine, make_sessionmaker  # noqa: E402
from curvplan_server import migrations  # noqa: E402

BODY = json.dumps(
    {
        "kind": "plan",
        "measurements": {"per_sample_losses": [0.7, 0.6, 0.8, 0.5], "loss_bound": 5.0},
        "targets": {"tolerances": [0.01], "radius": 0.1},
    }
).encode()


def xacts(admin: str, name: str) -> int:
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s", (name,)
        ).fetchone()
    return int(row[0]) if row else 0


async def create_jobs(base: str, key: str, n: int) -> list[str]:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=60) as http:
        return [(await http.post("/v1/jobs", content=BODY)).json()["id"] for _ in range(n)]


async def hold(base: str, key: str, ids: list[str], seconds: float) -> tuple[int, int]:
    """Each job long-polled by its own client for ``seconds``; (answers, failures)."""
    headers = {"Authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=len(ids), max_keepalive_connections=len(ids))
    async with httpx.AsyncClient(
        base_url=base, headers=headers, limits=limits, timeout=120
    ) as http:
        stop = time.monotonic() + seconds
        answers = failures = 0

        async def poller(job_id: str) -> None:
            nonlocal answers, failures
            while time.monotonic() < stop:
                wait = max(0.5, min(30.0, stop - time.monotonic()))
                try:
                    response = await http.get(f"/v1/jobs/{job_id}", params={"wait": wait})
                    if response.status_code == 200:
                        answers += 1
                    else:
                        failures += 1
                except httpx.HTTPError:
                    failures += 1

        await asyncio.gather(*(poller(j) for j in ids))
    return answers, failures


def run(admin: str, clients: int, seconds: float, notify: bool) -> dict[str, float]:
    name = f"curvplan_lp_{secrets.token_hex(3)}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = admin.rsplit("/", 1)[0] + "/" + name
    server = None
    try:
        migrations.upgrade(url)
        engine = make_engine(url)
        with make_sessionmaker(engine)() as session:
            key = create_key(session, "bench")
            session.commit()
        engine.dispose()
        port = free_port()
        env = {
            **os.environ,
            "DATABASE_URL": url,
            "CURVPLAN_LOG_LEVEL": "WARNING",
            "CURVPLAN_JOB_NOTIFY": "true" if notify else "false",
            "CURVPLAN_ACCESS_LOG": "false",
            "CURVPLAN_RATE_LIMITS": "false",  # it creates --clients jobs at once with one key
        }
        log = open(os.environ.get("BENCH_SERVER_LOG", os.devnull), "ab")  # noqa: SIM115
        server = subprocess.Popen(
            [sys.executable, "-m", "curvplan.cli", "serve", "--port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        base = f"http://127.0.0.1:{port}"
        asyncio.run(wait_ready(base))
        ids = asyncio.run(create_jobs(base, key, clients))
        # Count only the holding phase: the jobs exist, nothing changes, 500 clients wait.
        began_x, began_t = xacts(admin, name), time.monotonic()
        answers, failures = asyncio.run(hold(base, key, ids, seconds))
        elapsed = time.monotonic() - began_t
        used = xacts(admin, name) - began_x
    finally:
        if server is not None:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(10)
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
    return {
        "xact_per_s": used / elapsed,
        "answers": answers,
        "failures": failures,
        "seconds": elapsed,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument(
        "--admin-url",
        default=os.environ.get(
            "CURVPLAN_TEST_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    args = parser.parse_args()
    admin = libpq_url(args.admin_url)
    load_before = os.getloadavg()[0]
    polling = run(admin, args.clients, args.seconds, notify=False)
    notify = run(admin, args.clients, args.seconds, notify=True)
    print(
        f"{args.clients} clients long-polling queued jobs for {args.seconds:.0f} s "
        f"(no worker: nothing changes), cores={os.cpu_count()}, load average before="
        f"{load_before:.1f} after={os.getloadavg()[0]:.1f}"
    )
    for label, r in (("polling (before)", polling), ("LISTEN/NOTIFY (after)", notify)):
        print(
            f"  {label:24s} {r['xact_per_s']:8.0f} DB transactions/s   answers={r['answers']}"
            f"  failed={r['failures']}  measured {r['seconds']:.0f} s"
        )
    ratio = polling["xact_per_s"] / max(notify["xact_per_s"], 1e-9)
    print(f"  ratio polling / notify: {ratio:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

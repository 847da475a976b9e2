"""POST /v1/jobs throughput and latency against the real server and PostgreSQL.

Starts ``curvplan serve --workers N`` on a fresh database, fires plan-job
submissions at a fixed concurrency with httpx (async) for a fixed time, prints
requests/s and p50/p90/p99 latency, then stops the server and drops the database.
Goal on a 2-core machine: >= 500 req/s with p99 < 50 ms at concurrency 32.

    python benchmarks/bench_api.py [--seconds 10] [--concurrency 32] [--workers 2]

The load generator shares the machine's cores with the server and PostgreSQL,
so the figures are a lower bound of what the server alone sustains.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from live_plugin import free_port  # noqa: E402  (the tests' shared live-service helpers)

from curvplan_core.config import libpq_url  # noqa: E402
from curvplan_core.credentials.keys import create_key  # noqa: E402
from curvplan_core.db import make_engine, make_sessionmaker  # noqa: E402
from curvplan_server import migrations  # noqa: E402

BODY = json.dumps(
    {
        "kind": "plan",
        "name": "bench",
        "tags": {"team": "bench"},
        "measurements": {
            "per_sample_losses": [0.71, 0.64, 0.80, 0.55, 0.62, 0.70, 0.66, 0.59],
            "loss_bound": 5.0,
            "steps_to_target": [
                {"batch_size": 64, "steps": 46000},
                {"batch_size": 256, "steps": 14000},
            ],
        },
        "targets": {"tolerances": [0.01, 0.001], "radius": 0.1},
    }
).encode()


async def wait_ready(base: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(base_url=base) as client:
        while time.monotonic() < deadline:
            try:
                if (await client.get("/readyz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.2)
    raise RuntimeError("server did not become ready")


async def load(base: str, key: str, seconds: float, concurrency: int) -> tuple[list[float], int]:
    """``concurrency`` virtual users, each with its own httpx.AsyncClient (one keep-alive
    connection): a shared 32-connection pool spends most of its CPU on pool bookkeeping."""
    latencies: list[float] = []
    errors = 0
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    clients = [
        httpx.AsyncClient(base_url=base, headers=headers, limits=limits) for _ in range(concurrency)
    ]
    try:
        # warm-up: open the connections and the server's pools
        await asyncio.gather(*(c.post("/v1/jobs", content=BODY) for c in clients))
        stop = time.perf_counter() + seconds

        async def user(client: httpx.AsyncClient) -> None:
            nonlocal errors
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                response = await client.post("/v1/jobs", content=BODY)
                latencies.append(time.perf_counter() - t0)
                if response.status_code != 202:
                    errors += 1

        await asyncio.gather(*(user(c) for c in clients))
    finally:
        await asyncio.gather(*(c.aclose() for c in clients))
    return latencies, errors


async def load_raw(
    host: str, port: int, key: str, seconds: float, concurrency: int
) -> tuple[list[float], int]:
    """The same load over plain asyncio streams (HTTP/1.1 keep-alive), for a client that
    costs far less CPU than httpx on a machine whose cores the server shares."""
    request = (
        f"POST /v1/jobs HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n\r\n"
    ).encode() + BODY
    latencies: list[float] = []
    errors = 0

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        await reader.readexactly(length)
        return status

    async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection(host, port)
        await one(reader, writer)  # warm-up
        return reader, writer

    async def user(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal errors
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            status = await one(reader, writer)
            latencies.append(time.perf_counter() - t0)
            if status != 202:
                errors += 1
        writer.close()

    connections = await asyncio.gather(*(connect() for _ in range(concurrency)))
    stop = time.perf_counter() + seconds
    await asyncio.gather(*(user(r, w) for r, w in connections))
    return latencies, errors


def server_cpu_seconds(pid: int) -> float:
    """CPU time used so far by the server process and its uvicorn workers."""
    import psutil

    root = psutil.Process(pid)
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2, help="uvicorn worker processes")
    parser.add_argument(
        "--client",
        choices=("httpx", "raw"),
        default="httpx",
        help="load generator: httpx (async) or raw asyncio streams (cheaper on shared cores)",
    )
    parser.add_argument(
        "--admin-url",
        default=os.environ.get(
            "CURVPLAN_TEST_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    parser.add_argument(
        "--without-notify-trigger",
        action="store_true",
        help="drop the job_notify trigger (NOTIFY per job insert and status change) after the "
        "migrations, to see what it costs the API (its listeners wake on every notification)",
    )
    args = parser.parse_args()

    load_before = os.getloadavg()[0]
    name = f"curvplan_bench_{secrets.token_hex(3)}"
    admin = libpq_url(args.admin_url)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = admin.rsplit("/", 1)[0] + "/" + name
    server = None
    try:
        migrations.upgrade(url)
        engine = make_engine(url)
        if args.without_notify_trigger:
            with engine.begin() as conn:
                conn.exec_driver_sql("DROP TRIGGER job_notify ON job")
        with make_sessionmaker(engine)() as session:
            key = create_key(session, "bench")
            session.commit()
        port = free_port()
        env = {
            **os.environ,
            "DATABASE_URL": url,
            "CURVPLAN_LOG_LEVEL": "WARNING",
            # The submission path's capacity, not its rate limits (bench_ratelimit.py for those).
            "CURVPLAN_RATE_LIMITS": "false",
            "CURVPLAN_DB_POOL_SIZE": str(max(4, args.concurrency // args.workers)),
        }
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "curvplan.cli",
                "serve",
                "--port",
                str(port),
                "--workers",
                str(args.workers),
            ],
            env=env,
        )
        base = f"http://127.0.0.1:{port}"
        asyncio.run(wait_ready(base))
        cpu0, client0 = server_cpu_seconds(server.pid), time.process_time()
        if args.client == "httpx":
            latencies, errors = asyncio.run(load(base, key, args.seconds, args.concurrency))
        else:
            latencies, errors = asyncio.run(
                load_raw("127.0.0.1", port, key, args.seconds, args.concurrency)
            )
        server_cpu = server_cpu_seconds(server.pid) - cpu0
        client_cpu = time.process_time() - client0
        with engine.connect() as conn:
            stored = conn.exec_driver_sql("SELECT count(*) FROM job").scalar_one()
        engine.dispose()
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    latencies.sort()
    n = len(latencies)
    q = statistics.quantiles(latencies, n=100, method="inclusive")
    rate = n / args.seconds
    print(
        f"POST /v1/jobs  client={args.client}  concurrency={args.concurrency}  "
        f"uvicorn workers={args.workers}  cores={os.cpu_count()}  duration={args.seconds:.0f}s  "
        f"load average before={load_before:.1f} after={os.getloadavg()[0]:.1f}"
        + ("  job_notify trigger DROPPED" if args.without_notify_trigger else "")
    )
    print(f"requests={n}  errors={errors}  jobs stored={stored}  throughput={rate:.0f} req/s")
    print(
        f"latency ms: p50={q[49] * 1e3:.1f}  p90={q[89] * 1e3:.1f}  p99={q[98] * 1e3:.1f}  "
        f"max={latencies[-1] * 1e3:.1f}"
    )
    print(
        f"CPU per request: server (API processes) {server_cpu / n * 1e3:.2f} ms, "
        f"load generator {client_cpu / n * 1e3:.2f} ms (both include warm-up)"
    )
    goal = rate >= 500 and q[98] < 0.050
    print(f"goal (>= 500 req/s, p99 < 50 ms): {'met' if goal else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

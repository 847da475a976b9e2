"""A runaway submission loop against another project's POST /v1/jobs latency, with and without
the rate limits (issue 31; docs/operations.md#rate-limits).

Starts ``curvplan serve --workers N`` on a fresh database with two projects. A *victim*
process submits plan jobs at a steady rate (its own process and connection, so the load
generator's event loop does not add to its latencies) and records each POST's latency:

1. idle: the victim alone;
2. under the loop, limits on (the defaults): a *runaway* loop from another project fires
   4,400 submissions in 40 s (110/s, open loop over keep-alive connections, ignoring 429s);
3. under the loop, limits off (``CURVPLAN_RATE_LIMITS=false``, the server restarted): what
   the loop costs the victim without them (``--skip-unlimited`` leaves it out).

Prints the victim's p50/p90/p99/max side by side and the runaway's answers, and whether the
goal holds: the victim's p99 under the loop is at most 2× its idle p99.

    python benchmarks/bench_ratelimit.py [--seconds 40] [--runaway 4400] [--victim-rate 5]

The load generator shares the machine's cores with the server and PostgreSQL.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import secrets
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_api import BODY, wait_ready  # noqa: E402
from live_plugin import free_port  # noqa: E402

from curvplan_core.config import libpq_url  # noqa: E402
from curvplan_core.credentials.keys import create_key  # noqa: E402
from curvplan_core.db import make_engine, make_sessionmaker  # noqa: E402
from curvplan_server import migrations  # noqa: E402


def _request(port: int, key: str) -> bytes:
    return (
        f"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n\r\n"
    ).encode() + BODY


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    request: bytes) -> int:  # fmt: skip
    """One request on a keep-alive connection; the answer's status."""
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    await reader.readexactly(length)
    return int(head.split(b" ", 2)[1])


async def _steady(port: int, keys: list[str], rate: float, seconds: float,
                  connections: int) -> tuple[list[float], Counter[int], float]:  # fmt: skip
    """Requests at ``rate``/s for ``seconds`` (open loop: each at its scheduled time, over
    ``connections`` keep-alive connections taken round-robin, keys taken in turn); returns the
    latencies, the statuses and the time it took."""
    links = [await asyncio.open_connection("127.0.0.1", port) for _ in range(connections)]
    locks = [asyncio.Lock() for _ in links]
    requests = [_request(port, key) for key in keys]
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    total = round(rate * seconds)

    async def one(i: int, due: float) -> None:
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        lock = locks[i % len(links)]
        async with lock:
            t0 = time.perf_counter()
            status = await _exchange(*links[i % len(links)], requests[i % len(requests)])
            latencies.append(time.perf_counter() - t0)
            statuses[status] += 1

    start = time.perf_counter()
    await asyncio.gather(*(one(i, start + i / rate) for i in range(total)))
    took = time.perf_counter() - start
    for _, writer in links:
        writer.close()
    return latencies, statuses, took


def _victim(port: int, keys: list[str], rate: float, seconds: float, out: Any) -> None:
    latencies, statuses, _ = asyncio.run(_steady(port, keys, rate, seconds, connections=2))
    out.send((latencies, dict(statuses)))


def _measure(port: int, victim_keys: list[str], runaway_key: str | None,
             args: argparse.Namespace) -> dict[str, Any]:  # fmt: skip
    receive, send = multiprocessing.Pipe(duplex=False)
    victim = multiprocessing.Process(
        target=_victim, args=(port, victim_keys, args.victim_rate, args.seconds, send)
    )
    victim.start()
    runaway: tuple[list[float], Counter[int], float] | None = None
    if runaway_key is not None:
        rate = args.runaway / args.seconds
        runaway = asyncio.run(
            _steady(port, [runaway_key], rate, args.seconds, args.runaway_connections)
        )
    latencies, statuses = receive.recv()
    victim.join()
    return {"victim": latencies, "victim_statuses": statuses, "runaway": runaway}


def _start(url: str, port: int, workers: int, limits: bool) -> subprocess.Popen[bytes]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CURVPLAN_")},
        "DATABASE_URL": url,
        "CURVPLAN_LOG_LEVEL": "WARNING",
        "CURVPLAN_ACCESS_LOG": "false",
        "CURVPLAN_RATE_LIMITS": "true" if limits else "false",
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "curvplan.cli", "serve", "--port", str(port),
         "--workers", str(workers)],
        env=env,
    )  # fmt: skip
    asyncio.run(wait_ready(f"http://127.0.0.1:{port}"))
    return server


def _stop(server: subprocess.Popen[bytes]) -> None:
    server.terminate()
    server.wait(30)


def _quantiles(latencies: list[float]) -> dict[str, float]:
    q = statistics.quantiles(latencies, n=100, method="inclusive")
    return {"p50": q[49] * 1e3, "p90": q[89] * 1e3, "p99": q[98] * 1e3,
            "max": max(latencies) * 1e3}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--runaway", type=int, default=4400, help="submissions of the loop")
    parser.add_argument("--runaway-connections", type=int, default=8)
    parser.add_argument("--victim-rate", type=float, default=5.0, help="victim POSTs per s")
    parser.add_argument("--workers", type=int, default=2, help="uvicorn worker processes")
    parser.add_argument("--skip-unlimited", action="store_true")
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
    phases: dict[str, dict[str, Any]] = {}
    try:
        migrations.upgrade(url)
        engine = make_engine(url)
        with make_sessionmaker(engine)() as session:
            victim_keys = [create_key(session, "victim") for _ in range(2)]
            runaway_key = create_key(session, "runaway")
            session.commit()
        engine.dispose()
        port = free_port()
        server = _start(url, port, args.workers, limits=True)
        try:
            asyncio.run(_steady(port, victim_keys, 10, 1, 2))  # warm-up: pools, caches
            phases["idle"] = _measure(port, victim_keys, None, args)
            phases["loop, limits on"] = _measure(port, victim_keys, runaway_key, args)
        finally:
            _stop(server)
        if not args.skip_unlimited:
            server = _start(url, port, args.workers, limits=False)
            try:
                asyncio.run(_steady(port, victim_keys, 10, 1, 2))
                phases["loop, limits off"] = _measure(port, victim_keys, runaway_key, args)
            finally:
                _stop(server)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    print(
        f"bench_ratelimit: uvicorn workers={args.workers}  cores={os.cpu_count()}  "
        f"victim {args.victim_rate:g} POST/s for {args.seconds:g} s per phase  runaway "
        f"{args.runaway} submissions in {args.seconds:g} s ({args.runaway / args.seconds:.0f}/s)  "
        f"load average before={load_before:.1f} after={os.getloadavg()[0]:.1f}"
    )
    stats = {phase: _quantiles(data["victim"]) for phase, data in phases.items()}
    header = f"{'victim POST /v1/jobs (ms)':<28}" + "".join(f"{p:>20}" for p in phases)
    print(header)
    for row in ("p50", "p90", "p99", "max"):
        print(f"{row:<28}" + "".join(f"{stats[p][row]:>20.1f}" for p in phases))
    answers = [
        " ".join(f"{code}x{n}" for code, n in sorted(d["victim_statuses"].items()))
        for d in phases.values()
    ]
    print(f"{'victim answers':<28}" + "".join(f"{a:>20}" for a in answers))
    for phase, data in phases.items():
        if data["runaway"] is not None:
            _, statuses, took = data["runaway"]
            answers = "  ".join(f"{code} x {n}" for code, n in sorted(statuses.items()))
            print(f"runaway ({phase}): {sum(statuses.values())} sent in {took:.1f} s: {answers}")
    idle, loaded = stats["idle"]["p99"], stats["loop, limits on"]["p99"]
    verdict = "met" if loaded <= 2 * idle else "NOT met"
    print(f"goal p99 under the loop <= 2 x idle p99: {loaded:.1f} ms vs 2 x {idle:.1f} ms: "
          f"{verdict} ({loaded / idle:.2f}x)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

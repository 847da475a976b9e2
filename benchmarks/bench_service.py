"""A scratch curvplan service for the benchmarks that time real processes.

``scratch_service`` creates a database on the PostgreSQL of ``admin_url``, runs the migrations,
starts ``curvplan serve`` and W ``curvplan worker`` processes (authentication off, their logs
in a temporary directory), waits for the API and yields its base URL; on exit it stops every
process and drops the database.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path


def curvplan_command() -> list[str]:
    """The ``curvplan`` console script next to this interpreter, else ``python -m``."""
    script = Path(sys.executable).parent / "curvplan"
    return [str(script)] if script.exists() else [sys.executable, "-m", "curvplan.cli"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_healthy(base: str, timeout: float = 120.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("the API did not come up")
        time.sleep(0.2)


@contextmanager
def scratch_service(
    admin_url: str,
    prefix: str,
    *,
    workers: int,
    queues: str,
    env: Mapping[str, str] | None = None,
) -> Iterator[str]:
    """API + ``workers`` workers on ``queues`` against a new database; yields the base URL.

    The processes get this environment without its ``CURVPLAN_*`` settings, plus ``env``."""
    import psycopg
    from sqlalchemy.engine import make_url

    from curvplan_core.config import libpq_url, normalise_database_url
    from curvplan_server import migrations

    name = f"curvplan_bench_{prefix}_{secrets.token_hex(4)}"
    with psycopg.connect(libpq_url(admin_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = normalise_database_url(make_url(admin_url).set(database=name).render_as_string(False))
    procs: list[subprocess.Popen] = []
    tmp = Path(tempfile.mkdtemp(prefix=f"bench-{prefix}-"))
    try:
        migrations.upgrade(url)
        process_env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("CURVPLAN_")},
            "DATABASE_URL": url,
            "CURVPLAN_DATA_DIR": str(tmp / "data"),
            "CURVPLAN_AUTH_DISABLED": "true",
            **(env or {}),
        }
        port = free_port()
        cmd = curvplan_command()
        with (tmp / "server.log").open("wb") as log:
            procs.append(
                subprocess.Popen(
                    [*cmd, "serve", "--port", str(port)], env=process_env, stdout=log, stderr=log
                )
            )
        for i in range(workers):
            with (tmp / f"worker-{i}.log").open("wb") as log:
                procs.append(
                    subprocess.Popen(
                        [*cmd, "worker", "--queues", queues, "--poll-interval", "0.1"],
                        env=process_env,
                        stdout=log,
                        stderr=log,
                    )
                )
        base = f"http://127.0.0.1:{port}"
        _wait_healthy(base)
        yield base
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        with psycopg.connect(libpq_url(admin_url), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

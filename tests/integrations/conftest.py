"""Fixtures of the integration tests: the shared live service and a real MLflow server; the
client tests' input builders (tests/client) and the CLI helpers (tests/cli) on the path."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import live_plugin
import psycopg
import pytest
from psycopg import sql
from sqlalchemy.engine import make_url

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS / "client"), str(TESTS / "cli")]

MLFLOW_START_SECONDS = 240  # a loaded 2-core machine; about 20 s when idle


@pytest.fixture(scope="module")
def mlflow_server(pg_admin_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``mlflow server`` on 127.0.0.1 with a PostgreSQL database of its own as backend store
    (never curvplan's: both use Alembic's ``alembic_version`` table) and artifacts served
    over HTTP from a temporary folder. One per module: it takes seconds to start."""
    from curvplan_core.config import libpq_url

    name = f"curvplan_test_mlflow_{secrets.token_hex(3)}"
    with psycopg.connect(libpq_url(pg_admin_url), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    store = make_url(pg_admin_url).set(drivername="postgresql+psycopg", database=name)
    tmp = tmp_path_factory.mktemp("mlflow")
    port = live_plugin.free_port()
    log = (tmp / "server.log").open("wb")
    mlflow = Path(sys.executable).with_name("mlflow")
    process = subprocess.Popen(
        [str(mlflow), "server",
         "--backend-store-uri", store.render_as_string(hide_password=False),
         "--artifacts-destination", str(tmp / "artifacts"),
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--gunicorn-opts", "--timeout 120"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")},
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    try:
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if process.poll() is not None or time.monotonic() - started > MLFLOW_START_SECONDS:
                raise RuntimeError(
                    f"mlflow server did not start: {(tmp / 'server.log').read_text()[-3000:]}"
                )
            time.sleep(0.5)
        print(f"\nmlflow server started in {time.monotonic() - started:.1f} s", file=sys.stderr)
        yield url
    finally:
        os.killpg(process.pid, signal.SIGINT)  # gunicorn: quick shutdown
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()
        with psycopg.connect(libpq_url(pg_admin_url), autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

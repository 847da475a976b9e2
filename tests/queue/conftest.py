"""Fixtures of the queue tests: a migrated database, a project, real worker processes."""

from __future__ import annotations

import secrets
import signal
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from queue_helpers import WorkerProcess
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from curvplan_core.config import libpq_url, normalise_database_url


@pytest.fixture(scope="session")
def queue_database(pg_admin_url: str) -> Iterator[str]:
    """A database of the queue tests alone, migrated once with the real migrations.

    Queue tests start worker processes that claim every runnable job and reaper runs
    that touch every expired lease, so they cannot share the session database of the
    API tests; they run one after the other and :func:`queue_db_url` empties this one
    before each test (cloning a fresh database per test cost ~2 s of CREATE/DROP
    DATABASE each on a loaded machine).
    """
    from curvplan_server import migrations

    name = f"curvplan_queue_{secrets.token_hex(4)}"
    _admin(pg_admin_url, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        url = _database(pg_admin_url, name)
        migrations.upgrade(url)
        yield url
    finally:
        _admin(
            pg_admin_url,
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)),
        )


@pytest.fixture
def queue_db_url(queue_database: str) -> str:
    """The queue database, with every table empty (as freshly migrated) for this test.

    Any connection a previous test left behind (a worker that had to be killed) is
    ended first, as ``DROP DATABASE … WITH (FORCE)`` did, so nothing of it survives.
    """
    with psycopg.connect(libpq_url(queue_database), autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
                " AND tablename <> 'alembic_version'"
            )
        ]
        conn.execute(
            sql.SQL("TRUNCATE {} RESTART IDENTITY CASCADE").format(
                sql.SQL(", ").join(sql.Identifier(t) for t in tables)
            )
        )
    return queue_database


def _admin(admin_url: str, statement: sql.Composed) -> None:
    with psycopg.connect(libpq_url(admin_url), autocommit=True) as conn:
        conn.execute(statement)


def _database(admin_url: str, name: str) -> str:
    return normalise_database_url(make_url(admin_url).set(database=name).render_as_string(False))


@pytest.fixture
def db(queue_db_url: str) -> Iterator[Engine]:
    """An engine on this test's database."""
    eng = create_engine(queue_db_url, pool_size=2, max_overflow=4)
    yield eng
    eng.dispose()


@pytest.fixture
def project_id(db: Engine) -> uuid.UUID:
    pid = uuid.uuid4()
    with db.begin() as conn:
        conn.execute(
            text("INSERT INTO project (id, name) VALUES (:id, :name)"),
            {"id": pid, "name": f"queue-test-{pid.hex[:8]}"},
        )
    return pid


@pytest.fixture
def start_worker(queue_db_url: str, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start ``curvplan worker`` processes (stopped with SIGTERM at the end of the test)."""
    started: list[WorkerProcess] = []

    def start(*args: str) -> WorkerProcess:
        worker = WorkerProcess(queue_db_url, tmp_path / f"worker-{len(started)}.log", list(args))
        started.append(worker)
        return worker

    yield start
    for worker in started:  # signal all first: they shut down in parallel
        if worker.proc.poll() is None:
            worker.signal(signal.SIGTERM)
    for worker in started:
        worker.stop()

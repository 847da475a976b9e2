"""Fixtures of the queue tests: a migrated database, a project, real worker processes."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from queue_helpers import WorkerProcess
from sqlalchemy import Engine, create_engine, text

SERVER_URL = os.environ.get("CURVPLAN_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432")


@pytest.fixture
def database_url() -> Iterator[str]:
    """A freshly created and migrated database (temporary: until tests/conftest.py has it)."""
    from app.migrations import upgrade

    name = f"curvplan_queue_{uuid.uuid4().hex[:12]}"
    admin = create_engine(f"{SERVER_URL}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = f"{SERVER_URL}/{name}"
    upgrade(url)
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    eng = create_engine(database_url, pool_size=2, max_overflow=2)
    yield eng
    eng.dispose()


@pytest.fixture
def project_id(engine: Engine) -> uuid.UUID:
    pid = uuid.uuid4()
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO project (id, name) VALUES (:id, :name)"),
            {"id": pid, "name": f"queue-test-{pid.hex[:8]}"},
        )
    return pid


@pytest.fixture
def start_worker(database_url: str, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start ``curvplan worker`` processes (stopped with SIGTERM at the end of the test)."""
    started: list[WorkerProcess] = []

    def start(*args: str) -> WorkerProcess:
        worker = WorkerProcess(database_url, tmp_path / f"worker-{len(started)}.log", list(args))
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()

"""Small builders shared by the storage tests."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
from safetensors.numpy import save as st_save
from sqlalchemy import text


def checkpoint_bytes(seed: int = 0, rows: int = 8) -> bytes:
    rng = np.random.default_rng(seed)
    return st_save(
        {
            "embed.weight": rng.standard_normal((rows, 4)).astype(np.float32),
            "head.weight": rng.standard_normal((3, 4)).astype(np.float32),
        }
    )


def upload(client: Any, headers: dict[str, str], data: bytes, kind: str = "checkpoint") -> Any:
    return client.post(
        "/v1/artifacts",
        headers=headers,
        files={"file": ("model.safetensors", data, "application/octet-stream")},
        data={"kind": kind},
    )


def assert_problem(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    return response.json()


def _blocked_by(engine: Any, holder_pid: int) -> int:
    """Sessions of this database waiting for a lock that ``holder_pid`` holds."""
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND :holder = ANY(pg_blocking_pids(pid))"
            ),
            {"holder": holder_pid},
        ).scalar_one()


def backend_pid(holder: Any) -> int:
    """The server process of a connection (or a session's) in its current transaction."""
    return int(holder.execute(text("SELECT pg_backend_pid()")).scalar_one())


def wait_until_blocked(
    engine: Any, thread: threading.Thread, holder: Any, timeout: float = 10.0
) -> None:
    """Until some session waits for a lock that ``holder`` (the test's connection or session
    that took it) holds: the thread's request. Not any lock wait of the database: the session
    database is shared, and a wait another test left behind would end this one too early."""
    pid = backend_pid(holder)
    deadline = time.monotonic() + timeout
    while _blocked_by(engine, pid) == 0:
        assert thread.is_alive(), "the request finished without waiting for the lock"
        assert time.monotonic() < deadline, "the request never waited for the lock"
        time.sleep(0.02)


def committed_key(database_url: str, project: str) -> str:
    """An API key of a new project, committed (visible to every connection)."""
    from curvplan_core.credentials.keys import create_key
    from curvplan_core.db import make_engine, make_sessionmaker

    engine = make_engine(database_url)
    try:
        with make_sessionmaker(engine)() as session:
            key = create_key(session, project)
            session.commit()
    finally:
        engine.dispose()
    return key

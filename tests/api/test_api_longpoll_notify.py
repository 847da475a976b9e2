"""Long-polls woken by PostgreSQL NOTIFY: with polling pushed out to 60 s, a committed
status change still answers the waiting request at once."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
from api_helpers import JobReads
from sqlalchemy import text


def test_a_status_change_wakes_the_long_poll_without_polling(
    settings: Any, database_url: str, plan_body: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fastapi.testclient import TestClient

    from curvplan_core.credentials.keys import create_key
    from curvplan_core.db import make_engine, make_sessionmaker
    from curvplan_server.main import create_app

    engine = make_engine(database_url)
    project = f"notify-{uuid.uuid4().hex[:8]}"
    with make_sessionmaker(engine)() as session:
        key = create_key(session, project)
        session.commit()
    headers = {"Authorization": f"Bearer {key}"}
    # Only a notification can end the wait early: both polling intervals are 60 s.
    application = create_app(
        settings.model_copy(
            update={
                "job_notify": True,
                "notify_fallback_seconds": 60.0,
                "long_poll_interval_seconds": 60.0,
            }
        )
    )
    try:
        with TestClient(application, raise_server_exceptions=False) as client:
            notifier = application.state.job_notifier
            deadline = time.monotonic() + 15
            while not notifier.connected:
                assert time.monotonic() < deadline, "the LISTEN connection never came up"
                time.sleep(0.05)
            job = client.post("/v1/jobs", json=plan_body, headers=headers).json()
            read = JobReads(monkeypatch).next_read()

            def change_later() -> None:
                # after the long-poll read the job as queued (late on a loaded machine): a
                # change before that read is none to it, and it would wait its whole 30 s
                assert read.wait(30), "the long-poll never read the job"
                time.sleep(0.5)
                with engine.begin() as conn:
                    conn.execute(
                        text("UPDATE job SET status = 'running' WHERE id = :id"), {"id": job["id"]}
                    )

            writer = threading.Thread(target=change_later)
            writer.start()
            began = time.monotonic()
            response = client.get(f"/v1/jobs/{job['id']}", params={"wait": 30}, headers=headers)
            elapsed = time.monotonic() - began
            writer.join()
            assert response.json()["status"] == "running"
            assert 0.4 <= elapsed < 10, elapsed
    finally:
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM project WHERE name = :n"), {"n": project})
        engine.dispose()
        application.state.engine.dispose()


def test_many_long_polls_share_a_small_pool(
    settings: Any, database_url: str, plan_body: dict[str, Any]
) -> None:
    """60 long-polls at once on a 2-connection pool all answer at their timeout.

    A long-poll once held its connection while it waited for a thread to commit; with
    every thread waiting for a connection, the pool deadlocked until its 30 s timeout.
    """
    import asyncio

    import httpx

    from curvplan_core.credentials.keys import create_key
    from curvplan_core.db import make_engine, make_sessionmaker
    from curvplan_server.main import create_app

    engine = make_engine(database_url)
    project = f"pool-{uuid.uuid4().hex[:8]}"
    with make_sessionmaker(engine)() as session:
        key = create_key(session, project)
        session.commit()
    application = create_app(settings.model_copy(update={"db_pool_size": 2, "db_max_overflow": 0}))

    async def run() -> list[tuple[int, float]]:
        transport = httpx.ASGITransport(app=application)
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://t", headers=headers, timeout=120
        ) as http:
            ids = [(await http.post("/v1/jobs", json=plan_body)).json()["id"] for _ in range(60)]

            async def poll(job_id: str) -> tuple[int, float]:
                began = time.monotonic()
                response = await http.get(f"/v1/jobs/{job_id}", params={"wait": 1})
                return response.status_code, time.monotonic() - began

            return await asyncio.gather(*(poll(j) for j in ids))

    try:
        answers = asyncio.run(run())
        assert [status for status, _ in answers] == [200] * 60
        assert max(elapsed for _, elapsed in answers) < 15
    finally:
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM project WHERE name = :n"), {"n": project})
        engine.dispose()
        application.state.engine.dispose()

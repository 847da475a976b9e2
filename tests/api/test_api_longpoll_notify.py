"""Long-polls woken by PostgreSQL NOTIFY: with polling pushed out to 60 s, a committed
status change still answers the waiting request at once."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from sqlalchemy import text


def test_a_status_change_wakes_the_long_poll_without_polling(
    settings: Any, database_url: str, plan_body: dict[str, Any]
) -> None:
    from fastapi.testclient import TestClient

    from curvplan_server.auth.keys import create_key
    from curvplan_server.db import make_engine, make_sessionmaker
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

            def change_later() -> None:
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

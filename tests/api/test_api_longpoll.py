"""GET /v1/jobs/{id}?wait=N against committed data: returns on change, on terminal, at timeout."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from api_helpers import JobReads, assert_problem, error_fields
from sqlalchemy import text


@pytest.fixture(params=[30.0], ids=["cap30s"])
def live(
    request: pytest.FixtureRequest, settings: Any, database_url: str
) -> Iterator[tuple[Any, Any, dict[str, str]]]:
    """A client on an app WITHOUT the rolled-back session (a writer thread must see commits).

    The long-poll cap is the fixture's param. Time bounds in these tests are loose
    (the machine is shared) but far apart from the waits they tell apart.
    """
    from fastapi.testclient import TestClient

    from curvplan_core.credentials.keys import create_key
    from curvplan_core.db import make_engine, make_sessionmaker
    from curvplan_server.main import create_app

    engine = make_engine(database_url)
    project = f"longpoll-{uuid.uuid4().hex[:8]}"
    with make_sessionmaker(engine)() as session:
        key = create_key(session, project)
        session.commit()
    application = create_app(
        settings.model_copy(
            update={"long_poll_interval_seconds": 0.05, "long_poll_max_seconds": request.param}
        )
    )
    try:
        with TestClient(application, raise_server_exceptions=False) as client:
            yield client, engine, {"Authorization": f"Bearer {key}"}
    finally:
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM project WHERE name = :n"), {"n": project})
        engine.dispose()
        application.state.engine.dispose()


def _set_status_later(
    engine: Any, job_id: str, status: str, delay: float, after: threading.Event | None = None
) -> threading.Thread:
    """Set the status ``delay`` seconds after ``after`` (the long-poll's first read) is set."""

    def run() -> None:
        if after is not None:
            assert after.wait(30), "the long-poll never read the job"
        time.sleep(delay)
        with engine.begin() as conn:
            conn.execute(
                text("UPDATE job SET status = :s, updated_at = now() WHERE id = :id"),
                {"s": status, "id": job_id},
            )

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _timed_get(client: Any, url: str, headers: dict[str, str], **params: Any) -> tuple[Any, float]:
    t0 = time.monotonic()
    response = client.get(url, params=params, headers=headers)
    return response, time.monotonic() - t0


def test_long_poll_returns_on_change_and_on_terminal(
    live, plan_body: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, engine, headers = live
    reads = JobReads(monkeypatch)
    job = client.post("/v1/jobs", json=plan_body, headers=headers).json()
    url = f"/v1/jobs/{job['id']}"

    response, elapsed = _timed_get(client, url, headers, wait=0)
    assert response.json()["status"] == "queued" and elapsed < 5

    # the status changes 0.4 s into a 30 s wait (after the poll read it as queued, which a
    # loaded machine may do late): the answer comes right after the change
    writer = _set_status_later(engine, job["id"], "running", 0.4, after=reads.next_read())
    response, elapsed = _timed_get(client, url, headers, wait=30)
    writer.join()
    assert response.json()["status"] == "running"
    assert 0.35 <= elapsed < 10, elapsed

    # nothing changes: the answer comes at the timeout, with the same status
    response, elapsed = _timed_get(client, url, headers, wait=0.5)
    assert response.json()["status"] == "running" and 0.5 <= elapsed < 10

    # a terminal job answers at once, whatever the wait
    _set_status_later(engine, job["id"], "succeeded", 0).join()
    response, elapsed = _timed_get(client, url, headers, wait=30)
    assert response.json()["status"] == "succeeded" and elapsed < 10

    problem = assert_problem(client.get(url, params={"wait": -1}, headers=headers), 422)
    assert error_fields(problem) == {"query.wait"}


@pytest.mark.parametrize("live", [1.0], indirect=True, ids=["cap1s"])
def test_long_poll_wait_is_capped(live, plan_body: dict[str, Any]) -> None:
    client, _engine, headers = live
    job = client.post("/v1/jobs", json=plan_body, headers=headers).json()
    response, elapsed = _timed_get(client, f"/v1/jobs/{job['id']}", headers, wait=3600)
    assert response.status_code == 200 and response.json()["status"] == "queued"
    assert 1.0 <= elapsed < 10, elapsed

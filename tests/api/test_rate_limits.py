"""Rate limits: a key's and a project's submissions and an address's failed
authentications, kept in PostgreSQL so that every API process sees the same counts; 429 with
Retry-After and the draft-09 RateLimit-Policy/RateLimit fields; the client waits and retries."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

import curvplan
from curvplan_core.credentials.keys import create_key
from curvplan_server.ratelimit.limiter import RateLimiter, RatePolicy

WINDOW = 60.0


@pytest.fixture
def settings(settings: Any) -> Any:
    """Small limits, on (the suite's settings have them off: tests/conftest.py)."""
    return settings.model_copy(
        update={
            "rate_limits": True,
            "rate_limit_window_seconds": WINDOW,
            "rate_limit_submissions_per_key": 3,
            "rate_limit_submissions_per_project": 4,
            "rate_limit_failed_auth_per_address": 3,
        }
    )


def _key(db_session: Any, project: str) -> dict[str, str]:
    key = create_key(db_session, project)
    db_session.commit()
    return {"Authorization": f"Bearer {key}"}


def _remaining(answer: httpx.Response) -> tuple[str, int]:
    match = re.fullmatch(r'"([a-z-]+)";r=(\d+);t=(\d+)', answer.headers["ratelimit"])
    assert match, answer.headers["ratelimit"]
    return match[1], int(match[2])


def test_submissions_are_limited_per_key_and_per_project_across_processes(
    app: Any, client: TestClient, db_session: Any, plan_body: dict[str, Any], settings: Any
) -> None:
    project = f"limited-{uuid.uuid4().hex[:8]}"
    first, second = _key(db_session, project), _key(db_session, project)
    answers = [client.post("/v1/jobs", json=plan_body, headers=first) for _ in range(3)]
    assert [a.status_code for a in answers] == [202, 202, 202]
    assert [_remaining(a) for a in answers] == [
        ("submissions-per-key", 2),  # the policy closest to exhaustion (2/3 left < 3/4)
        ("submissions-per-key", 1),
        ("submissions-per-key", 0),
    ]
    assert answers[0].headers["ratelimit-policy"] == (
        '"submissions-per-key";q=3;w=60, "submissions-per-project";q=4;w=60'
    )
    refused = client.post("/v1/jobs", json=plan_body, headers=first)
    assert refused.status_code == 429
    assert refused.headers["content-type"] == "application/problem+json"
    assert refused.json()["policy"] == "submissions-per-key"
    # one submission every 60/3 = 20 s: the next is admitted in (just under) 20 s
    assert 18 <= int(refused.headers["retry-after"]) <= 20
    assert _remaining(refused) == ("submissions-per-key", 0)

    # Another key of the project: the project's 4th (the refused one was not counted) ...
    assert client.post("/v1/jobs", json=plan_body, headers=second).status_code == 202
    over = client.post("/v1/jobs", json=plan_body, headers=second)
    assert over.status_code == 429 and over.json()["policy"] == "submissions-per-project"
    # ... and another project is not affected.
    other = _key(db_session, f"other-{uuid.uuid4().hex[:8]}")
    assert client.post("/v1/jobs", json=plan_body, headers=other).status_code == 202

    # A second API process (its own in-process state) sees the counts of the first.
    from curvplan_server.main import create_app

    second_process = create_app(settings)
    second_process.dependency_overrides = dict(app.dependency_overrides)  # the test's session
    with TestClient(second_process, raise_server_exceptions=False) as process_two:
        assert process_two.post("/v1/jobs", json=plan_body, headers=first).status_code == 429


def test_failed_authentication_is_limited_per_address(client: TestClient, db_session: Any) -> None:
    bad = {"Authorization": "Bearer cpk_not-a-key"}
    assert [client.get("/v1/jobs", headers=bad).status_code for _ in range(3)] == [401] * 3
    locked = client.get("/v1/jobs", headers=bad)
    assert locked.status_code == 429 and int(locked.headers["retry-after"]) >= 1
    assert locked.json()["policy"] == "failed-auth-per-address"
    # while locked out, a key this process has not seen is not even looked up
    fresh = _key(db_session, f"fresh-{uuid.uuid4().hex[:8]}")
    assert client.get("/v1/jobs", headers=fresh).status_code == 429


def test_the_client_waits_retry_after_and_resubmits(
    app: Any, db_session: Any, plan_body: dict[str, Any]
) -> None:
    """One submission per second per key: the client's second submission is answered 429 +
    Retry-After: 1, and it waits that long and sends it again (a real app, over ASGI)."""
    app.state.settings = app.state.settings.model_copy(
        update={"rate_limit_submissions_per_key": 1, "rate_limit_window_seconds": 1.0}
    )
    key = create_key(db_session, f"retry-{uuid.uuid4().hex[:8]}")
    db_session.commit()
    statuses: list[int] = []

    async def record(response: httpx.Response) -> None:
        statuses.append(response.status_code)

    async def run() -> float:
        async with curvplan.AsyncClient("http://testserver", key,
                                        transport=httpx.ASGITransport(app=app)) as api:  # fmt: skip
            api._http.event_hooks["response"].append(record)
            await api.submit_job(plan_body)
            started = time.monotonic()
            await api.submit_job(plan_body)
            return time.monotonic() - started

    waited = asyncio.run(run())
    assert statuses == [202, 429, 202]
    assert waited >= 0.9


def test_gcra_admits_a_burst_then_one_per_interval(engine: Any) -> None:
    """The limiter alone against PostgreSQL: q requests at once, then one per w/q seconds."""
    limiter = RateLimiter()
    policy = RatePolicy("unit", quota=5, window=1.0)
    bucket = [(f"unit:{uuid.uuid4()}", policy)]
    verdicts = [limiter.hit(engine, bucket) for _ in range(6)]
    assert [v.allowed for v in verdicts if v] == [True] * 5 + [False]
    assert [v.remaining for v in verdicts if v][:5] == [4, 3, 2, 1, 0]
    assert 0 < verdicts[-1].retry_after <= 0.2 + 0.05  # (one interval) - (time since the burst)
    time.sleep(verdicts[-1].retry_after + 0.02)
    again = limiter.hit(engine, bucket)
    assert again is not None and again.allowed and again.remaining == 0

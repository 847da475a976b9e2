"""Concurrent POST /v1/jobs with one Idempotency-Key, against committed data (no shared
rolled-back session): the unique (project_id, idempotency_key) index decides, so exactly
one job exists and every request answers with it, or with 422 when its body differs."""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import text

CONCURRENCY = 8


@pytest.fixture
def committed_app(settings: Any, database_url: str) -> Iterator[tuple[Any, Any, str, uuid.UUID]]:
    from curvplan_core.credentials.keys import create_key
    from curvplan_core.db import make_engine, make_sessionmaker
    from curvplan_server.main import create_app

    engine = make_engine(database_url)
    project = f"idem-race-{uuid.uuid4().hex[:8]}"
    with make_sessionmaker(engine)() as session:
        key = create_key(session, project)
        session.commit()
    with engine.connect() as conn:
        project_id = conn.execute(
            text("SELECT id FROM project WHERE name = :n"), {"n": project}
        ).scalar_one()
    application = create_app(settings)
    try:
        yield application, engine, key, project_id
    finally:
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM project WHERE name = :n"), {"n": project})
        engine.dispose()
        application.state.engine.dispose()


async def _post_all(app: Any, key: str, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    transport = httpx.ASGITransport(app=app)
    headers = {"Authorization": f"Bearer {key}", "Idempotency-Key": "race-1"}
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        return await asyncio.gather(
            *(client.post("/v1/jobs", json=body, headers=headers) for body in bodies)
        )


def _jobs_with_key(engine: Any, project_id: uuid.UUID) -> list[Any]:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT id FROM job WHERE project_id = :p AND idempotency_key = 'race-1'"),
            {"p": project_id},
        ).all()


def test_concurrent_same_key_same_body_makes_one_job(committed_app, plan_body) -> None:
    app, engine, key, project_id = committed_app
    responses = asyncio.run(_post_all(app, key, [plan_body] * CONCURRENCY))
    assert [r.status_code for r in responses] == [202] * CONCURRENCY, [r.text for r in responses]
    assert len({r.json()["id"] for r in responses}) == 1
    assert sum(r.headers.get("Idempotent-Replayed") == "true" for r in responses) == CONCURRENCY - 1
    # A replay repeats the first answer (jsonb may reorder the keys of ``request``).
    first = responses[0].json()
    assert all(r.json() == first for r in responses)
    assert len(_jobs_with_key(engine, project_id)) == 1


def test_concurrent_same_key_other_bodies_one_wins_the_rest_are_422(
    committed_app, plan_body
) -> None:
    app, engine, key, project_id = committed_app
    bodies = []
    for i in range(CONCURRENCY):
        body = copy.deepcopy(plan_body)
        body["name"] = f"variant-{i}"
        bodies.append(body)
    responses = asyncio.run(_post_all(app, key, bodies))
    codes = sorted(r.status_code for r in responses)
    assert codes == [202] + [422] * (CONCURRENCY - 1), [r.text for r in responses]
    (winner,) = [r for r in responses if r.status_code == 202]
    (row,) = _jobs_with_key(engine, project_id)
    assert winner.json()["id"] == str(row.id)
    for loser in (r for r in responses if r.status_code == 422):
        assert loser.headers["content-type"].startswith("application/problem+json")
        assert loser.json()["job_id"] == str(row.id)

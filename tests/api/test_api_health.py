"""/healthz, /readyz (DB reachable and at head), /metrics, GET /v1/workers, no torch in the API."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import uuid
from typing import Any

import psycopg
import pytest
from api_helpers import assert_problem
from psycopg import sql
from sqlalchemy import text

from curvplan_core.config import libpq_url


def _client(application: Any) -> Any:
    from fastapi.testclient import TestClient

    return TestClient(application, raise_server_exceptions=False)


def _scrape(application: Any) -> str:
    from curvplan_server.metrics import render_metrics

    return render_metrics(application.state.metrics_registry).decode()


def test_healthz(client) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}


def test_readyz_ok_when_migrated(client) -> None:
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json()["checks"] == {"database": "ok", "migrations": "ok"}


@pytest.fixture
def empty_database_url(pg_admin_url: str) -> Any:
    from sqlalchemy.engine import make_url

    name = f"curvplan_test_empty_{secrets.token_hex(3)}"
    with psycopg.connect(libpq_url(pg_admin_url), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield make_url(pg_admin_url).set(database=name).render_as_string(hide_password=False)
    with psycopg.connect(libpq_url(pg_admin_url), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def test_readyz_503_when_migrations_are_not_at_head(settings, empty_database_url) -> None:
    from curvplan_server import migrations
    from curvplan_server.main import create_app

    application = create_app(settings.model_copy(update={"database_url": empty_database_url}))
    with _client(application) as c:
        problem = assert_problem(c.get("/readyz"), 503)
        assert "curvplan db upgrade" in problem["detail"]
        migrations.upgrade(empty_database_url)
        assert c.get("/readyz").status_code == 200
        migrations.downgrade(empty_database_url, "base")
        assert_problem(c.get("/readyz"), 503)
    application.state.engine.dispose()


def test_readyz_503_when_database_unreachable(settings) -> None:
    from curvplan_server.main import create_app

    bad = "postgresql+psycopg://postgres@127.0.0.1:1/nothing?connect_timeout=2"
    application = create_app(settings.model_copy(update={"database_url": bad}))
    with _client(application) as c:
        problem = assert_problem(c.get("/readyz"), 503)
        assert problem["checks"]["database"] == "unreachable"
        # A scrape still answers, and says the queue gauges could not be read.
        assert "curvplan_metrics_db_up 0.0" in _scrape(application)


def test_creating_the_app_does_not_touch_the_database(settings, caplog) -> None:
    """The API must start while PostgreSQL is still coming up (/readyz says when it is):
    registering the queue collector once ran a scrape, i.e. a query, in create_app."""
    from curvplan_server.main import create_app

    bad = "postgresql+psycopg://postgres@127.0.0.1:1/nothing?connect_timeout=2"
    caplog.set_level("WARNING", logger="curvplan_server.metrics")
    application = create_app(settings.model_copy(update={"database_url": bad}))
    try:
        assert [r for r in caplog.records if r.name == "curvplan_server.metrics"] == []
        # control: a scrape does query, and says it failed
        assert "curvplan_metrics_db_up 0.0" in _scrape(application)
        assert [r for r in caplog.records if r.name == "curvplan_server.metrics"] != []
    finally:
        application.state.engine.dispose()


def _gauge(text_: str, name: str, labels: str = "") -> float:
    pattern = re.escape(name + (("{" + labels + "}") if labels else "")) + r" ([0-9.e+-]+)"
    match = re.search(pattern, text_)
    assert match, f"{name}{{{labels}}} not in metrics"
    return float(match.group(1))


def test_metrics_count_requests_by_route_template(client, auth_headers, operator_headers) -> None:
    client.get(f"/v1/jobs/{uuid.uuid4()}", headers=auth_headers)
    body = client.get("/metrics", headers=operator_headers).text
    assert (
        'curvplan_http_requests_total{method="GET",route="/v1/jobs/{job_id}",status="404"}' in body
    )
    assert "curvplan_http_request_duration_seconds_bucket" in body


def test_queue_gauges_read_committed_jobs_at_scrape_time(settings, database_url) -> None:
    """Gauges come from the DB: committing 3 queued jobs raises the queued count by 3."""
    from curvplan_core.credentials.keys import get_or_create_project
    from curvplan_core.db import make_engine, make_sessionmaker
    from curvplan_server.main import create_app

    application = create_app(settings)
    engine = make_engine(database_url)
    name = f"metrics-{uuid.uuid4().hex[:6]}"
    try:
        # The collector itself (the route's operator key is tested in test_api_auth).
        before = _scrape(application)
        with make_sessionmaker(engine)() as s:
            project = get_or_create_project(s, name)
            for i in range(3):
                s.execute(
                    text(
                        "INSERT INTO job (id, project_id, kind, queue, request, created_at) "
                        "VALUES (:id, :p, 'plan', 'cpu', '{}', "
                        "now() - make_interval(secs => :age))"
                    ),
                    {"id": uuid.uuid4(), "p": project.id, "age": 100 + i},
                )
            s.execute(
                text(
                    "INSERT INTO worker (id, hostname, pid, queues) "
                    "VALUES (:id, 'h', 1, ARRAY['cpu'])"
                ),
                {"id": f"w-{name}"},
            )
            s.commit()
        after = _scrape(application)
        key = 'queue="cpu",status="queued"'
        assert _gauge(after, "curvplan_jobs", key) - _gauge(before, "curvplan_jobs", key) == 3
        assert _gauge(after, "curvplan_queue_oldest_queued_age_seconds", 'queue="cpu"') >= 102
        assert _gauge(after, "curvplan_workers_live") - _gauge(before, "curvplan_workers_live") == 1
        assert _gauge(after, "curvplan_metrics_db_up") == 1
    finally:
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM project WHERE name = :n"), {"n": name})
            conn.execute(text("DELETE FROM worker WHERE id = :id"), {"id": f"w-{name}"})
        engine.dispose()
        application.state.engine.dispose()


def test_workers_endpoint_reports_heartbeats(
    client, auth_headers, operator_headers, db_session, plan_body
) -> None:
    created = client.post("/v1/jobs", json=plan_body, headers=auth_headers)
    assert created.status_code == 202, created.text
    job_id = uuid.UUID(created.json()["id"])
    db_session.execute(
        text(
            "INSERT INTO worker (id, hostname, pid, queues, status, last_heartbeat_at, "
            "current_job_id) VALUES "
            "('fresh-1', 'gpu-box', 11, ARRAY['gpu'], 'running', now(), :job),"
            "('stale-1', 'cpu-box', 12, ARRAY['cpu','gpu'], 'running', now() - interval '1 hour',"
            " NULL),"
            "('done-1', 'cpu-box', 13, ARRAY['cpu'], 'stopped', now(), NULL)"
        ),
        {"job": job_id},
    )
    db_session.commit()
    # Hostnames, pids and jobs of every project: an operator concern, not a project's.
    assert_problem(client.get("/v1/workers", headers=auth_headers), 403)
    response = client.get("/v1/workers", headers=operator_headers)
    assert response.status_code == 200
    by_id = {w["id"]: w for w in response.json()["items"]}
    assert by_id["fresh-1"]["live"] is True
    assert by_id["fresh-1"]["current_job_id"] == str(job_id)
    assert by_id["fresh-1"]["queues"] == ["gpu"]
    assert by_id["stale-1"]["live"] is False
    assert by_id["done-1"]["live"] is False
    stopped = client.get("/v1/workers", params={"status": "stopped"}, headers=operator_headers)
    assert {w["id"] for w in stopped.json()["items"]} >= {"done-1"}
    assert "fresh-1" not in {w["id"] for w in stopped.json()["items"]}
    bad = client.get("/v1/workers", params={"status": "x"}, headers=operator_headers)
    assert_problem(bad, 422)


def test_api_process_never_imports_torch(database_url) -> None:
    code = (
        "import sys\n"
        "from curvplan_core.config import Settings\n"
        "from curvplan_server.main import create_app\n"
        "from curvplan.cli import app as cli\n"
        f"create_app(Settings(database_url={database_url!r}))\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'workers'))\n"
        "print(heavy)\n"
        "assert not [m for m in heavy if m.startswith('torch')], heavy\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
    )
    assert result.returncode == 0, result.stderr + result.stdout

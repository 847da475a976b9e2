"""Programmatic Alembic: find the migrations shipped with the project and run them."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, text

from curvplan_core.config import normalise_database_url


def script_location() -> Path:
    """The migration scripts: ``curvplan_server/db_migrations`` in an installed wheel, the
    repository's ``alembic/`` in a source checkout (editable install: this file is
    ``app/curvplan_server/migrations.py``)."""
    here = Path(__file__).resolve().parent
    shipped = here / "db_migrations"
    if (shipped / "env.py").is_file():
        return shipped
    return here.parents[1] / "alembic"


def alembic_config(database_url: str) -> Config:
    """An Alembic config for ``database_url`` that works from any working directory."""
    location = script_location()
    ini = location.parent / "alembic.ini"
    cfg = Config(str(ini)) if ini.exists() and location.name == "alembic" else Config()
    cfg.set_main_option("script_location", str(location))
    # '%' must be escaped for ConfigParser interpolation (passwords may contain it).
    cfg.set_main_option("sqlalchemy.url", normalise_database_url(database_url).replace("%", "%%"))
    cfg.attributes["configure_logger"] = False
    return cfg


def upgrade(database_url: str, revision: str = "head") -> None:
    """Run ``alembic upgrade <revision>`` against ``database_url``."""
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str = "base") -> None:
    """Run ``alembic downgrade <revision>`` against ``database_url``."""
    command.downgrade(alembic_config(database_url), revision)


def head_revisions() -> set[str]:
    """The head revision ids of the shipped migration scripts."""
    cfg = Config()
    cfg.set_main_option("script_location", str(script_location()))
    return set(ScriptDirectory.from_config(cfg).get_heads())


def current_revisions(connection: Connection) -> set[str]:
    """The revisions recorded in the database's ``alembic_version`` table (empty if none).

    A plain query rather than an Alembic MigrationContext: /readyz calls this on
    every probe and must stay cheap and quiet.
    """
    exists = connection.execute(text("SELECT to_regclass('alembic_version')")).scalar()
    if exists is None:
        return set()
    rows = connection.execute(text("SELECT version_num FROM alembic_version")).scalars()
    return set(rows)


def is_at_head(engine: Engine) -> bool:
    """True when the database is reachable and migrated to the shipped head."""
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))
        return current_revisions(conn) == head_revisions()

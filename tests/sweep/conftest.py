"""Fixtures of the sweep tests: a tiny learnable language (counting mod V) and, for the end-to-end
tests, real ``curvplan serve`` + ``curvplan worker`` processes (helpers of tests/analyze)."""

from __future__ import annotations

import secrets
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analyze"))

from curvplan_server.config import libpq_url, normalise_database_url


@pytest.fixture(scope="module")
def sweep_database(pg_admin_url: str) -> Iterator[str]:
    """A migrated database of this module alone (its worker claims every job in it)."""
    from curvplan_server import migrations

    name = f"curvplan_sweep_{secrets.token_hex(4)}"
    with psycopg.connect(libpq_url(pg_admin_url), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = normalise_database_url(
        make_url(pg_admin_url).set(database=name).render_as_string(hide_password=False)
    )
    try:
        migrations.upgrade(url)
        yield url
    finally:
        with psycopg.connect(libpq_url(pg_admin_url), autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

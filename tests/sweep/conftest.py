"""Fixtures of the sweep tests: a tiny learnable language (counting mod V) and, for the end-to-end
tests, real ``curvplan serve`` + ``curvplan worker`` processes (helpers of tests/analyze)."""

from __future__ import annotations

import secrets
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analyze"))

from curvplan_server.config import libpq_url, normalise_database_url

TINY_SPEC: dict[str, Any] = {
    "d_model": 8,
    "n_heads": 2,
    "d_ff": 16,
    "n_layers": 1,
    "task": {"type": "causal_lm", "vocab_size": 11, "seq_len": 6},
}


def counting_data(n: int, seed: int) -> Any:
    """Sequences that count mod 11 from a random start: learnable in tens of steps."""
    import torch

    from curvplan_worker.curvature.data import Dataset

    gen = torch.Generator().manual_seed(seed)
    start = torch.randint(0, 11, (n, 1), generator=gen)
    tokens = (start + torch.arange(7)) % 11
    return Dataset(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())


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


def api_key(database_url: str) -> str:
    from curvplan_server.auth.keys import create_key
    from curvplan_server.db import make_engine, make_sessionmaker

    engine = make_engine(database_url)
    try:
        with make_sessionmaker(engine)() as session:
            key = create_key(session, f"sweep-{uuid.uuid4().hex[:6]}")
            session.commit()
    finally:
        engine.dispose()
    return key

"""Database engine, sessions and the declarative base.

The API gets a session per request through :data:`SessionDep`; the session is
committed after the endpoint returns and rolled back if it raises. Workers and
CLI commands build their own engine with :func:`make_engine`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import Engine, MetaData, create_engine
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

from curvplan_server.config import Settings, normalise_database_url

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """Declarative base of every table; constraint names follow NAMING_CONVENTION."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def make_engine(
    settings_or_url: Settings | str,
    *,
    pool_size: int = 5,
    max_overflow: int = 5,
    pre_ping: bool = True,
) -> Engine:
    """Create a psycopg 3 engine for ``settings_or_url`` (URL normalised to postgresql+psycopg).

    ``pre_ping`` tests each connection on checkout (one extra round trip); the API
    turns it off for its hot path and relies on SQLAlchemy invalidating the pool
    when a connection turns out dead, plus ``pool_recycle``.
    """
    if isinstance(settings_or_url, Settings):
        url = settings_or_url.sqlalchemy_url
        pool_size = settings_or_url.db_pool_size
        max_overflow = settings_or_url.db_max_overflow
    else:
        url = normalise_database_url(settings_or_url)
    return create_engine(
        url,
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_pre_ping=pre_ping,
        pool_recycle=1800,
        future=True,
    )


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    """A session factory that keeps loaded attributes usable after commit."""
    return sessionmaker(bind=engine, expire_on_commit=False, autoflush=False)


async def get_db(request: Request) -> AsyncIterator[Session]:
    """FastAPI dependency: one session per request, committed on success, rolled back on error.

    The session factory lives on ``request.app.state.sessionmaker`` (set by
    ``create_app``); tests override this dependency to bind a per-test
    transaction. Creating a session does no I/O (the connection is taken on first
    use), so this runs on the event loop and only the commit/rollback go to a
    worker thread.
    """
    factory: sessionmaker[Session] = request.app.state.sessionmaker
    session = factory()
    try:
        yield session
        if session.in_transaction():
            await run_in_threadpool(session.commit)
    except BaseException:
        if session.in_transaction():
            await run_in_threadpool(session.rollback)
        raise
    finally:
        if session.in_transaction():
            await run_in_threadpool(session.close)
        else:
            session.close()


# scope="function": commit BEFORE the response is sent, so a 2xx means the row is durable.
SessionDep = Annotated[Session, Depends(get_db, scope="function")]

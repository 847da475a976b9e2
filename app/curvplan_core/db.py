"""Database engine, sessions, the declarative base, and what a lost database raises.

The API gets a session per request through :data:`curvplan_server.db.SessionDep`; workers
and CLI commands build their own engine with :func:`make_engine`.
"""

from __future__ import annotations

import psycopg
from sqlalchemy import Engine, MetaData, create_engine
from sqlalchemy import exc as sa_exc
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

from curvplan_core.config import Settings, normalise_database_url

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


#: What a lost or unobtainable connection raises: SQLAlchemy's wrappers, and psycopg's own
#: errors from the hot path's direct driver calls.
UNAVAILABLE_ERRORS: tuple[type[Exception], ...] = (
    sa_exc.OperationalError,
    sa_exc.InterfaceError,
    sa_exc.TimeoutError,  # pool exhausted
    psycopg.OperationalError,
    psycopg.InterfaceError,
)


def is_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it wraps) means the database cannot be reached now."""
    if isinstance(exc, UNAVAILABLE_ERRORS):
        return True
    if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
        return True
    cause = exc.__cause__ or exc.__context__
    return cause is not None and cause is not exc and isinstance(cause, UNAVAILABLE_ERRORS)

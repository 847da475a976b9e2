"""A database that went away is a 503 with ``Retry-After``, not a 500.

While PostgreSQL restarts (or fails over, or the pool is exhausted), a request that needs
it cannot be served *now*; the client should come back shortly. The answer says so:
503 problem+json, ``type …/database-unavailable``, ``Retry-After`` in seconds. The write
may or may not have been committed before the connection broke, so a client resends
a job submission with the same ``Idempotency-Key`` (the Python client does).
"""

from __future__ import annotations

import logging

import psycopg
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy import exc as sa_exc

from curvplan_server.problems import PROBLEM_TYPE_BASE, problem_response

log = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 1

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


def unavailable_response(path: str | None) -> JSONResponse:
    return problem_response(
        503,
        title="Service Unavailable",
        type=PROBLEM_TYPE_BASE + "database-unavailable",
        detail="the database is unavailable; retry after the delay in Retry-After (a job "
        "submission with the same Idempotency-Key, which never creates a second job)",
        instance=path,
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
    )


async def _handler(request: Request, exc: Exception) -> JSONResponse:
    log.warning(
        "database unavailable on %s %s: %s",
        request.method,
        request.url.path,
        type(exc).__name__,
    )
    return unavailable_response(request.url.path)


def install_unavailable_handlers(app: FastAPI) -> None:
    """Answer 503 + Retry-After for every exception class of a lost database."""
    for cls in UNAVAILABLE_ERRORS:
        app.add_exception_handler(cls, _handler)

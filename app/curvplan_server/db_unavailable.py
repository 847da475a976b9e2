"""A database that went away is a 503 with ``Retry-After``, not a 500.

While PostgreSQL restarts (or fails over, or the pool is exhausted), a request that needs
it cannot be served *now*; the client should come back shortly. The answer says so:
503 problem+json, ``type …/database-unavailable``, ``Retry-After`` in seconds. The write
may or may not have been committed before the connection broke, so a client resends
a job submission with the same ``Idempotency-Key`` (the Python client does).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from curvplan_core.db import UNAVAILABLE_ERRORS
from curvplan_server.problems import unavailable_response

log = logging.getLogger(__name__)


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

"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from curvplan_core.credentials.service_keys import ServiceContext
from curvplan_server.auth.dependencies import require_scope
from curvplan_server.metrics import render_metrics
from curvplan_server.migrations import current_revisions, head_revisions
from curvplan_server.problems import problem_response, problem_responses

log = logging.getLogger(__name__)
router = APIRouter(tags=["health"])


@router.get("/healthz", name="healthz", summary="Liveness: the process answers")
async def healthz() -> dict[str, str]:
    """Always 200 while the process serves requests (no dependency checks). On the event loop
    itself: busy threadpool threads (uploads) never delay it."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    name="readyz",
    summary="Readiness: database reachable and migrated to head",
    responses=problem_responses(503),
)
async def readyz(request: Request) -> Response:
    """200 when PostgreSQL answers and its Alembic revision is the shipped head, else 503."""
    engine = request.app.state.engine
    expected = head_revisions()
    try:  # on the database executor, not the threadpool uploads keep busy
        loop = asyncio.get_running_loop()
        current = await loop.run_in_executor(request.app.state.db_executor, _current, engine)
    except Exception as exc:
        log.warning("readiness: database unreachable: %s", type(exc).__name__)
        return problem_response(
            503,
            title="Service Unavailable",
            detail="the database is unreachable",
            extra={"checks": {"database": "unreachable"}},
        )
    if current != expected:
        return problem_response(
            503,
            title="Service Unavailable",
            detail=f"database schema is at {sorted(current) or 'no revision'}, "
            f"expected {sorted(expected)}; run `curvplan db upgrade`",
            extra={"checks": {"database": "ok", "migrations": "pending"}},
        )
    return JSONResponse({"status": "ready", "checks": {"database": "ok", "migrations": "ok"}})


def _current(engine: object) -> set[str]:
    with engine.connect() as conn:  # type: ignore[attr-defined]
        return current_revisions(conn)


@router.get(
    "/metrics",
    name="metrics",
    summary="Prometheus metrics (operator key with scope metrics:read)",
    response_class=PlainTextResponse,
    responses={
        200: {"content": {"text/plain": {}}, "description": "Prometheus text format"},
        **problem_responses(401, 403),
    },
    openapi_extra={"security": [{"bearer": []}]},
)
def metrics(
    request: Request,
    operator: Annotated[ServiceContext, Depends(require_scope("metrics:read"))],
) -> Response:
    """HTTP request metrics and queue gauges (read from the database at scrape time).

    The queue gauges count every project's jobs, so this is an operator route: send a
    service credential with scope ``metrics:read`` (``curvplan keys create-operator``).
    """
    return Response(
        render_metrics(request.app.state.metrics_registry), media_type=CONTENT_TYPE_LATEST
    )

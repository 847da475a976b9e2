"""``GET /v1/workers``: the worker processes and their heartbeats."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response
from sqlalchemy import func, select

from curvplan.types.jobs import WorkerList, WorkerOut
from curvplan_core.credentials.service_keys import ServiceContext
from curvplan_server.auth.dependencies import require_scope
from curvplan_server.db import SessionDep
from curvplan_server.jobs.service import query_field_error
from curvplan_server.problems import problem_responses
from curvplan_server.workers.models import WORKER_STATUSES, Worker

router = APIRouter(prefix="/v1/workers", tags=["workers"])


@router.get(
    "",
    name="list_workers",
    response_model=WorkerList,
    summary="List workers with their heartbeat",
    responses=problem_responses(401, 403, 422, 500, 503),
)
def list_workers(
    request: Request,
    session: SessionDep,
    operator: Annotated[ServiceContext, Depends(require_scope("workers:read"))],
    status: Annotated[str | None, Query(description="running | stopping | stopped")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> Response:
    """Workers (shared by all projects), most recent heartbeat first. An operator route:
    it needs a service credential with scope ``workers:read`` (a project key gets 403),
    since hostnames, pids and current jobs span every project.

    ``live`` is true for a running worker whose heartbeat is younger than
    ``CURVPLAN_WORKER_STALE_SECONDS``.
    """
    stale = request.app.state.settings.worker_stale_seconds
    stmt = select(
        Worker,
        (
            (Worker.status == "running")
            & (Worker.last_heartbeat_at > func.now() - func.make_interval(0, 0, 0, 0, 0, 0, stale))
        ).label("live"),
        Worker.current_job_id.label("visible_job_id"),
    )
    if status is not None:
        if status not in WORKER_STATUSES:
            raise query_field_error("status", f"unknown worker status {status!r}")
        stmt = stmt.where(Worker.status == status)
    rows = session.execute(stmt.order_by(Worker.last_heartbeat_at.desc()).limit(limit)).all()
    items = [
        WorkerOut(
            id=w.id,
            hostname=w.hostname,
            pid=w.pid,
            queues=list(w.queues),
            devices=w.devices,
            status=w.status,
            live=bool(live),
            started_at=w.started_at,
            last_heartbeat_at=w.last_heartbeat_at,
            current_job_id=visible_job_id,
        )
        for w, live, visible_job_id in rows
    ]
    return Response(WorkerList(items=items).model_dump_json(), media_type="application/json")

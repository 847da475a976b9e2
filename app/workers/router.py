"""``GET /v1/workers``: the worker processes and their heartbeats."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from sqlalchemy import func, select

from curvplan.types.jobs import WorkerList
from curvplan_server.auth.dependencies import ProjectDep
from curvplan_server.db import SessionDep
from curvplan_server.jobs.models import Job
from curvplan_server.jobs.service import query_field_error
from curvplan_server.problems import problem_responses
from curvplan_server.workers.models import WORKER_STATUSES, Worker

router = APIRouter(prefix="/v1/workers", tags=["workers"])


@router.get(
    "",
    name="list_workers",
    response_model=WorkerList,
    summary="List workers with their heartbeat",
    responses=problem_responses(401, 422, 500),
)
def list_workers(
    request: Request,
    session: SessionDep,
    auth: ProjectDep,
    status: Annotated[str | None, Query(description="running | stopping | stopped")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> JSONResponse:
    """Workers (shared by all projects), most recent heartbeat first.

    ``current_job_id`` is null unless the job belongs to the caller's project.

    ``live`` is true for a running worker whose heartbeat is younger than
    ``CURVPLAN_WORKER_STALE_SECONDS``.
    """
    stale = request.app.state.settings.worker_stale_seconds
    # Workers are shared, their jobs are not: the current job's id is shown only to its
    # own project (another project's job id would leak that it exists).
    own_job = (
        select(Job.id)
        .where(Job.id == Worker.current_job_id, Job.project_id == auth.project_id)
        .scalar_subquery()
    )
    stmt = select(
        Worker,
        (
            (Worker.status == "running")
            & (Worker.last_heartbeat_at > func.now() - func.make_interval(0, 0, 0, 0, 0, 0, stale))
        ).label("live"),
        own_job.label("visible_job_id"),
    )
    if status is not None:
        if status not in WORKER_STATUSES:
            raise query_field_error("status", f"unknown worker status {status!r}")
        stmt = stmt.where(Worker.status == status)
    rows = session.execute(stmt.order_by(Worker.last_heartbeat_at.desc()).limit(limit)).all()
    items = [
        {
            "id": w.id,
            "hostname": w.hostname,
            "pid": w.pid,
            "queues": list(w.queues),
            "status": w.status,
            "live": bool(live),
            "started_at": w.started_at.isoformat(),
            "last_heartbeat_at": w.last_heartbeat_at.isoformat(),
            "current_job_id": str(visible_job_id) if visible_job_id else None,
        }
        for w, live, visible_job_id in rows
    ]
    return JSONResponse({"items": items})

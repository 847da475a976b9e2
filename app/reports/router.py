"""Routes of the report page: the HTML report and signed links to it."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel
from sqlalchemy import select

from curvplan_server.auth.dependencies import ProjectDep, authenticate
from curvplan_server.db import SessionDep
from curvplan_server.jobs import service
from curvplan_server.jobs.models import Job
from curvplan_server.problems import PROBLEM_RESPONSES, Problem, not_found
from curvplan_server.reports import signing
from curvplan_server.reports.page import render_report

router = APIRouter(prefix="/v1/jobs", tags=["reports"])

# No script, no remote resource: the page is static HTML + inline CSS + inline SVG.
REPORT_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
    "img-src data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "Cache-Control": "private, no-store",
    "Referrer-Policy": "no-referrer",  # the signed token is in the URL
    "X-Content-Type-Options": "nosniff",
}


class ReportLinkOut(BaseModel):
    """A signed URL of the report page, valid until ``expires_at``."""

    url: str
    path: str
    expires_at: datetime


def _job_project(session: SessionDep, job_id: uuid.UUID) -> uuid.UUID | None:
    return session.execute(
        select(Job.__table__.c.project_id).where(Job.__table__.c.id == job_id)
    ).scalar_one_or_none()


@router.get(
    "/{job_id}/report",
    name="get_job_report",
    response_class=HTMLResponse,
    summary="The job's report page (HTML with SVG plots)",
    responses={**PROBLEM_RESPONSES},
)
async def get_job_report(
    request: Request,
    job_id: uuid.UUID,
    session: SessionDep,
    expires: Annotated[int | None, Query(description="Signed link: expiry, Unix s.")] = None,
    token: Annotated[str | None, Query(description="Signed link: HMAC token.")] = None,
) -> HTMLResponse:
    """Authenticate with ``Authorization: Bearer <key>``, or with a signed link's
    ``expires`` and ``token`` (from ``POST /v1/jobs/{id}/report-link``)."""
    settings = request.app.state.settings
    if token is not None or expires is not None:
        if token is None or expires is None:
            raise Problem(
                401, "a signed report link needs both expires and token", title="Unauthorized"
            )
        project_id = await run_in_threadpool(_job_project, session, job_id)
        secret = signing.link_secret(settings)
        reason = (
            "the report link's signature is not valid"
            if project_id is None
            else signing.verify(secret, job_id, project_id, expires, token)
        )
        if reason is not None:
            raise Problem(401, reason, title="Unauthorized")
        assert project_id is not None
    else:
        project_id = (await authenticate(request, session)).project_id
    job = await run_in_threadpool(service.get_job, session, project_id, job_id)
    html = await run_in_threadpool(render_report, job)
    return HTMLResponse(html, headers=REPORT_HEADERS)


@router.post(
    "/{job_id}/report-link",
    name="create_job_report_link",
    response_model=ReportLinkOut,
    summary="A short-lived signed link to the job's report, for browsers",
    responses={**PROBLEM_RESPONSES},
)
def create_job_report_link(
    request: Request, job_id: uuid.UUID, session: SessionDep, auth: ProjectDep
) -> JSONResponse:
    """The link opens this job's report without the key until ``expires_at``."""
    settings = request.app.state.settings
    if _job_project(session, job_id) != auth.project_id:
        raise not_found("job")
    expires = int(time.time() + settings.report_link_seconds)
    token = signing.sign(signing.link_secret(settings), job_id, auth.project_id, expires)
    path = f"/v1/jobs/{job_id}/report?expires={expires}&token={token}"
    body = ReportLinkOut(
        url=str(request.base_url).rstrip("/") + path,
        path=path,
        expires_at=datetime.fromtimestamp(expires, UTC),
    )
    return JSONResponse(body.model_dump(mode="json"))

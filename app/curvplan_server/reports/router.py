"""Routes of the report: the HTML page, signed links to it, and its figures as SVG and PNG."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Literal

from fastapi import APIRouter, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel
from sqlalchemy import select

from curvplan.types.reports import PlotFiles, PlotInfo, PlotList
from curvplan_core.jobs.models import Job
from curvplan_server.auth.dependencies import ProjectDep, authenticate
from curvplan_server.db import SessionDep
from curvplan_server.jobs import service
from curvplan_server.problems import PROBLEM_RESPONSES, Problem, conflict, not_found
from curvplan_server.public_url import base_url
from curvplan_server.reports import signing
from curvplan_server.reports.view import ReportJob

if TYPE_CHECKING:
    from curvplan_server.reports.plots import Plot

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
    job = await run_in_threadpool(_job_json, session, project_id, job_id)
    html = await run_in_threadpool(_render_page, session, job)
    return HTMLResponse(html, headers=REPORT_HEADERS)


def _job_json(session: SessionDep, project_id: uuid.UUID, job_id: uuid.UUID) -> ReportJob:
    """The job as ``GET /v1/jobs/{id}`` answers it, read as the report and its figures read
    it."""
    job = service.get_job(session, project_id, job_id)
    return ReportJob.of(job.model_dump(mode="json", exclude_unset=True))


def _render_page(session: SessionDep, job: ReportJob) -> str:
    # matplotlib loads here, on the first report, not at API start.
    from curvplan_server.reports.cache import job_plots
    from curvplan_server.reports.page import render_report

    return render_report(job, job_plots(session, job))


def _plots(session: SessionDep, job: ReportJob, with_png: bool = False) -> list[Plot]:
    from curvplan_server.reports.cache import job_plots

    return job_plots(session, job, with_png=with_png)


@router.get(
    "/{job_id}/plots",
    name="list_job_plots",
    response_model=PlotList,
    summary="The report's figures: which are drawn (SVG and PNG links), which are empty and why",
    responses={**PROBLEM_RESPONSES},
)
async def list_job_plots(job_id: uuid.UUID, session: SessionDep, auth: ProjectDep) -> PlotList:
    """Figures are drawn once, on the first request for a succeeded job, and kept."""
    job = await run_in_threadpool(_job_json, session, auth.project_id, job_id)
    plots = await run_in_threadpool(_plots, session, job)
    base = f"/v1/jobs/{job_id}/plots"
    return PlotList(
        job_id=str(job_id),
        plots=[
            PlotInfo(
                id=p.id,
                title=p.title,
                caption=p.caption,
                empty_reason=p.empty_reason,
                numbers=p.numbers,
                files=PlotFiles(svg=f"{base}/{p.id}.svg", png=f"{base}/{p.id}.png")
                if p.drawn
                else None,
            )
            for p in plots
        ],
    )


MEDIA_TYPES = {"svg": "image/svg+xml", "png": "image/png"}


@router.get(
    "/{job_id}/plots/{name}.{fmt}",
    name="get_job_plot",
    response_class=Response,
    summary="One figure of the report as SVG or PNG",
    responses={
        200: {"content": {"image/svg+xml": {}, "image/png": {}}},
        **PROBLEM_RESPONSES,
    },
)
async def get_job_plot(
    job_id: uuid.UUID,
    session: SessionDep,
    auth: ProjectDep,
    name: Annotated[str, Path(description="The figure's id (see GET /v1/jobs/{id}/plots).")],
    fmt: Annotated[Literal["svg", "png"], Path(description="svg or png")],
) -> Response:
    job = await run_in_threadpool(_job_json, session, auth.project_id, job_id)
    if job.status != "succeeded":
        raise conflict(f"the job is {job.status}; figures are drawn for succeeded jobs")
    plots = await run_in_threadpool(_plots, session, job, fmt == "png")
    plot = next((p for p in plots if p.id == name), None)
    if plot is None:
        raise not_found(f"plot {name!r}")
    if not plot.drawn:
        raise Problem(404, f"plot {name!r} is empty: {plot.empty_reason}", title="Not Found")
    content = plot.svg.encode() if fmt == "svg" and plot.svg is not None else plot.png
    headers = {
        # A succeeded job's figures never change.
        "Cache-Control": "private, max-age=86400, immutable",
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'",
        "Content-Disposition": f'inline; filename="{name}.{fmt}"',
    }
    return Response(content, media_type=MEDIA_TYPES[fmt], headers=headers)


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
        url=base_url(request) + path,
        path=path,
        expires_at=datetime.fromtimestamp(expires, UTC),
    )
    return JSONResponse(body.model_dump(mode="json"))

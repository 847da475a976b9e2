"""HTTP route: ``GET /v1/recommendations?name=&tag=&kind=&page_size=&page_token=``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from curvplan.types.recommendations import (
    RecommendationPage,
)
from curvplan_server.auth.dependencies import ProjectDep
from curvplan_server.db import SessionDep
from curvplan_server.jobs.filters import (
    KIND_FILTER_SCHEMA,
    NAME_FILTER_SCHEMA,
    TAG_FILTER_SCHEMA,
)
from curvplan_server.jobs.service import parse_filters
from curvplan_server.problems import problem_responses
from curvplan_server.recommendations.service import latest_recommendations

router = APIRouter(prefix="/v1/recommendations", tags=["recommendations"])


@router.get(
    "",
    name="list_recommendations",
    response_model=RecommendationPage,
    summary="Latest succeeded recommendation per job name (by name, cursor pagination)",
    responses=problem_responses(401, 422, 500),
)
def list_recommendations(
    request: Request,
    session: SessionDep,
    auth: ProjectDep,
    name: Annotated[
        str | None, Query(description="Only this job name", json_schema_extra=NAME_FILTER_SCHEMA)
    ] = None,
    tag: Annotated[
        list[str] | None,
        Query(description="key:value; repeatable (AND)", json_schema_extra=TAG_FILTER_SCHEMA),
    ] = None,
    kind: Annotated[
        str | None, Query(description="plan or analyze", json_schema_extra=KIND_FILTER_SCHEMA)
    ] = None,
    page_size: Annotated[int | None, Query(ge=1)] = None,
    page_token: Annotated[str | None, Query()] = None,
) -> Response:
    """For each job name, the recommendation of its most recently finished succeeded job."""
    settings = request.app.state.settings
    size = min(page_size or settings.default_page_size, settings.max_page_size)
    filters = parse_filters(None, kind, name, tag)
    page = latest_recommendations(
        session, auth.project_id, filters, page_size=size, page_token=page_token
    )
    return Response(page.model_dump_json(exclude_unset=True), media_type="application/json")

"""Storage routes: ``DELETE /v1/artifacts/{id}`` and ``GET /v1/storage`` (usage and quota)."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from curvplan.types.storage import StorageUsage
from curvplan_server.auth.dependencies import ProjectDep
from curvplan_server.db import SessionDep
from curvplan_server.problems import PROBLEM_RESPONSES
from curvplan_server.storage.deletion import delete_artifact
from curvplan_server.storage.quota import Quota, project_usage
from curvplan_server.storage.store import blob_store

router = APIRouter(tags=["artifacts"])


@router.delete(
    "/v1/artifacts/{artifact_id}",
    name="delete_artifact",
    status_code=204,
    summary="Delete an uploaded artifact (409 while a queued or running job uses it)",
    responses={**PROBLEM_RESPONSES, 204: {"description": "Deleted"}},
)
def delete_artifact_route(
    request: Request, artifact_id: uuid.UUID, session: SessionDep, auth: ProjectDep
) -> Response:
    """Delete the artifact's row, and its blob once no other artifact shares the content.

    404 for an unknown id or another project's; 409 for a job output (deleted with its job)
    and while a queued or running job of the project names the artifact (the problem lists
    those jobs).
    """
    delete_artifact(session, blob_store(request), auth.project_id, artifact_id)
    return Response(status_code=204)


@router.get(
    "/v1/storage",
    name="get_storage_usage",
    response_model=StorageUsage,
    summary="The project's storage usage and quota",
    responses={**PROBLEM_RESPONSES},
)
def get_storage_usage(request: Request, session: SessionDep, auth: ProjectDep) -> JSONResponse:
    """Bytes and count of the project's uploaded artifacts, and the configured limits."""
    usage = project_usage(session.connection(), auth.project_id)
    quota = Quota.from_settings(request.app.state.settings)
    return JSONResponse({"usage": usage.as_dict(), "quota": quota.as_dict()})

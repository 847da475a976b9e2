"""Routes of ``curvplan agent`` (docs/budget.md#sweeps-with-your-own-trainer): register, claim
a point of the project's agent sweeps, and the claimed attempt's fenced heartbeat and end.

Every route takes the project's API key; an agent sees only its project's points. The id in
the path is the one ``POST /v1/agents`` returned, the ``attempt`` in the body the one the claim
returned: a write whose agent and attempt no longer hold the point's lease answers 409.
"""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Path, Request, Response
from fastapi.concurrency import run_in_threadpool

from curvplan.types.agents import (
    AgentAttempt,
    AgentClaim,
    AgentClaimOut,
    AgentComplete,
    AgentEnd,
    AgentFail,
    AgentHeartbeat,
    AgentHeartbeatOut,
    AgentOut,
    AgentRegister,
)
from curvplan_core.config import Settings
from curvplan_server.agents import service
from curvplan_server.auth.dependencies import ProjectDep
from curvplan_server.db import SessionDep
from curvplan_server.problems import problem_responses

router = APIRouter(prefix="/v1/agents", tags=["agents"])

AgentId = Annotated[
    str,
    Path(
        min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.\-]+$", description="The agent's id."
    ),
]
LOST = "The agent's attempt no longer holds the point's lease: stop the command"
RESPONSES = problem_responses(400, 401, 404, 422, 500, 503)
FENCED = problem_responses(400, 401, 404, 422, 500, 503, _409=LOST)


def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


@router.post(
    "",
    name="register_agent",
    response_model=AgentOut,
    status_code=201,
    summary="Register a `curvplan agent` process of the project",
    responses=RESPONSES,
)
async def register_agent(
    body: AgentRegister, request: Request, session: SessionDep, auth: ProjectDep
) -> AgentOut:
    """The agent's id (listed by ``GET /v1/workers`` with queue ``agent``) and its lease."""
    return await run_in_threadpool(
        service.register, session, auth.project_name, body, _settings(request)
    )


@router.post(
    "/{agent_id}/claim",
    name="claim_agent_point",
    response_model=AgentClaimOut,
    summary="Claim the next point of the project's agent sweeps",
    responses=RESPONSES,
)
async def claim_point(
    agent_id: AgentId,
    body: AgentClaim,
    request: Request,
    session: SessionDep,
    auth: ProjectDep,
) -> AgentClaimOut:
    """The oldest runnable ``sweep_point`` of a sweep of this project submitted with
    ``runner: agent`` (``job: null`` when there is none): what to train and the attempt that
    fences every later write."""
    return await run_in_threadpool(
        service.claim, session, auth.project_id, agent_id, body.lease_seconds, _settings(request)
    )


@router.post(
    "/{agent_id}/jobs/{job_id}/heartbeat",
    name="agent_heartbeat",
    response_model=AgentHeartbeatOut,
    summary="Renew the point's lease and report progress (fenced)",
    responses=FENCED,
)
async def heartbeat(
    agent_id: AgentId,
    job_id: uuid.UUID,
    body: AgentHeartbeat,
    request: Request,
    session: SessionDep,
    auth: ProjectDep,
) -> AgentHeartbeatOut:
    """``cancel_requested: true``: the point's cancel was asked; stop the command and report
    ``cancelled``."""
    return await run_in_threadpool(
        service.heartbeat, session, auth.project_id, agent_id, job_id, body, _settings(request)
    )


@router.post(
    "/{agent_id}/jobs/{job_id}/complete",
    name="complete_agent_point",
    response_model=AgentEnd,
    summary="The command finished: its evaluation losses are the point's result (fenced)",
    responses=FENCED,
)
async def complete(
    agent_id: AgentId, job_id: uuid.UUID, body: AgentComplete, session: SessionDep, auth: ProjectDep
) -> AgentEnd:
    """The records become the point's ``result.point`` (the built-in loop's schema): a batch
    sweep's steps to the target loss, a data sweep's best evaluation."""
    return await run_in_threadpool(
        service.complete, session, auth.project_id, agent_id, job_id, body
    )


@router.post(
    "/{agent_id}/jobs/{job_id}/fail",
    name="fail_agent_point",
    response_model=AgentEnd,
    summary="The attempt failed: for good, or queued again while attempts remain (fenced)",
    responses=FENCED,
)
async def fail(
    agent_id: AgentId,
    job_id: uuid.UUID,
    body: AgentFail,
    request: Request,
    session: SessionDep,
    auth: ProjectDep,
) -> AgentEnd:
    return await run_in_threadpool(
        service.fail, session, auth.project_id, agent_id, job_id, body, _settings(request)
    )


@router.post(
    "/{agent_id}/jobs/{job_id}/cancelled",
    name="cancelled_agent_point",
    response_model=AgentEnd,
    summary="The command stopped on the point's cancel (fenced)",
    responses=FENCED,
)
async def cancelled(
    agent_id: AgentId, job_id: uuid.UUID, body: AgentAttempt, session: SessionDep, auth: ProjectDep
) -> AgentEnd:
    return await run_in_threadpool(
        service.cancelled, session, auth.project_id, agent_id, job_id, body.attempt
    )


@router.post(
    "/{agent_id}/jobs/{job_id}/release",
    name="release_agent_point",
    response_model=AgentEnd,
    summary="Give the point back unfinished: queued again at once (fenced)",
    responses=FENCED,
)
async def release(
    agent_id: AgentId, job_id: uuid.UUID, body: AgentAttempt, session: SessionDep, auth: ProjectDep
) -> AgentEnd:
    """The agent is stopping (SIGTERM, Ctrl-C): the point goes back to the queue without using
    up an attempt."""
    return await run_in_threadpool(
        service.release, session, auth.project_id, agent_id, job_id, body.attempt
    )


@router.delete(
    "/{agent_id}",
    name="stop_agent",
    status_code=204,
    summary="The agent exits",
    responses=RESPONSES,
)
async def stop_agent(agent_id: AgentId, session: SessionDep, auth: ProjectDep) -> Response:
    await run_in_threadpool(service.stop, session, agent_id)
    return Response(status_code=204)

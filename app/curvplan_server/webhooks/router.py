"""Routes of webhooks: the project's signing secret and a job's deliveries."""

from __future__ import annotations

import uuid

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool

from curvplan.types.webhooks import WebhookDeliveryList, WebhookSecretOut
from curvplan_server.auth.dependencies import ProjectDep
from curvplan_server.db import SessionDep
from curvplan_server.problems import PROBLEM_RESPONSES
from curvplan_server.webhooks import service

router = APIRouter(tags=["webhooks"])


@router.post(
    "/v1/webhooks/secret",
    name="rotate_webhook_secret",
    response_model=WebhookSecretOut,
    status_code=201,
    summary="Create (or replace) the project's webhook signing secret",
    responses={**PROBLEM_RESPONSES},
)
async def rotate_webhook_secret(session: SessionDep, auth: ProjectDep) -> WebhookSecretOut:
    """The secret signs every event (header ``Curvplan-Signature``); it is shown only here.
    A new secret replaces the old at once: events still pending are signed with the new one."""
    return await run_in_threadpool(service.rotate_secret, session, auth.project_id)


@router.get(
    "/v1/jobs/{job_id}/webhooks",
    name="list_job_webhooks",
    response_model=WebhookDeliveryList,
    summary="The job's webhook deliveries and every attempt",
    responses={**PROBLEM_RESPONSES},
)
async def list_job_webhooks(
    job_id: uuid.UUID, session: SessionDep, auth: ProjectDep
) -> WebhookDeliveryList:
    return await run_in_threadpool(service.list_deliveries, session, auth.project_id, job_id)

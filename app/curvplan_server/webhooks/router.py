"""Routes of webhooks: the project's signing secret and a job's deliveries."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Query, Request
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
async def rotate_webhook_secret(
    request: Request,
    session: SessionDep,
    auth: ProjectDep,
    overlap_seconds: float | None = Query(
        None,
        ge=0,
        le=30 * 86400,
        description="How long the old secret keeps signing beside the new one (a second "
        "webhook-signature entry); default: the service's webhook_secret_overlap_seconds; "
        "0: the old one stops at once.",
    ),
) -> WebhookSecretOut:
    """The secret signs every event (Standard Webhooks: header ``webhook-signature``); it is
    shown only here. Every event sent after this is signed with the new secret, and for the
    overlap with the old one beside it."""
    if overlap_seconds is None:
        overlap_seconds = request.app.state.settings.webhook_secret_overlap_seconds
    return await run_in_threadpool(service.rotate_secret, session, auth.project_id, overlap_seconds)


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

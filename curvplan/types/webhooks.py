"""Webhook events and deliveries (``webhook_url`` of a job; docs/integrations.md).

On every terminal status of a job that names a ``webhook_url`` (fan-out children excepted)
the service POSTs a :class:`WebhookEvent` as JSON, signed in the ``Curvplan-Signature``
header: ``t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>." + body)>`` (the scheme of
Stripe's webhooks). Receivers check it with :func:`curvplan.webhooks.verify`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

SIGNATURE_HEADER = "Curvplan-Signature"
EVENT_ID_HEADER = "Curvplan-Event-Id"
EVENT_TYPES = ("job.succeeded", "job.failed", "job.cancelled")


class WebhookJob(BaseModel):
    id: str
    kind: str
    name: str | None = None
    status: Literal["succeeded", "failed", "cancelled"]
    tags: dict[str, str] = Field(default_factory=dict)


class WebhookLinks(BaseModel):
    job: str
    recommendation: str
    report: str


class WebhookEvent(BaseModel):
    """The JSON body of a webhook POST."""

    id: str = Field(description="Event id (also the Curvplan-Event-Id header): dedupe on it.")
    type: Literal["job.succeeded", "job.failed", "job.cancelled"]
    created_at: datetime = Field(description="When the job reached the status.")
    job: WebhookJob
    links: WebhookLinks


class WebhookAttemptOut(BaseModel):
    number: int
    started_at: datetime
    status_code: int | None = Field(None, description="The receiver's HTTP status, if any.")
    error: str | None = Field(None, description="Why the attempt failed, if it did.")
    duration_ms: float


class WebhookDeliveryOut(BaseModel):
    id: str = Field(description="The event id.")
    job_id: str
    url: str
    event_type: str
    status: Literal["pending", "succeeded", "failed"]
    attempts: list[WebhookAttemptOut]
    next_attempt_at: datetime | None = None
    created_at: datetime
    delivered_at: datetime | None = None


class WebhookDeliveryList(BaseModel):
    items: list[WebhookDeliveryOut]


class WebhookSecretOut(BaseModel):
    """The project's signing secret (shown when created; creating again rotates it)."""

    secret: str
    created_at: datetime

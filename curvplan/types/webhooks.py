"""Webhook events and deliveries (``webhook_url`` of a job; docs/integrations.md).

On every terminal status of a job that names a ``webhook_url`` (fan-out children excepted)
the service POSTs a :class:`WebhookEvent` as JSON, signed as Standard Webhooks specifies
(https://www.standardwebhooks.com, the scheme of OpenAI's and Svix's webhooks): headers
``webhook-id`` (the event id), ``webhook-timestamp`` (unix seconds) and ``webhook-signature``
(``v1,<base64 HMAC-SHA256(key, "<id>.<timestamp>." + body)>``, space-separated while a
rotated-out secret still signs). Receivers check it with :func:`curvplan.webhooks.verify` or
any Standard Webhooks library.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal, TypedDict

from pydantic import BaseModel, Field

ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
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

    id: str = Field(description="Event id (also the webhook-id header): dedupe on it.")
    type: Literal["job.succeeded", "job.failed", "job.cancelled"]
    created_at: datetime = Field(description="When the job reached the status.")
    job: WebhookJob
    links: WebhookLinks
    budget: dict[str, float] | None = Field(
        None,
        description="A succeeded job's budget and main numbers under their stable names "
        "(``curvplan.headline``, docs/integrations.md), e.g. ``budget.tokens``; null when "
        "the job has no recommendation.",
    )


class StoredWebhookJob(TypedDict):
    """``job`` of a stored event (:class:`WebhookJob` as JSON)."""

    id: str
    kind: str
    name: str | None
    status: Literal["succeeded", "failed", "cancelled"]
    tags: dict[str, str]


class StoredWebhookEvent(TypedDict):
    """A :class:`WebhookEvent` as the outbox stores it (``webhook_delivery.payload``, written
    by the database trigger ``job_webhook_outbox``): no ``budget`` yet, ``links`` (job,
    recommendation, report) paths from the API's root; the sender adds both."""

    id: str
    type: Literal["job.succeeded", "job.failed", "job.cancelled"]
    created_at: str
    job: StoredWebhookJob
    links: dict[str, str]


class SentWebhookEvent(StoredWebhookEvent):
    """The event as POSTed (:class:`WebhookEvent` as JSON): the stored one with ``budget``
    and, given the service's public URL, absolute links."""

    budget: dict[str, float] | None


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
    previous_expires_at: datetime | None = Field(
        None,
        description="Until then the rotated-out secret signs too (a second signature in "
        "webhook-signature), so receivers can switch over; null: it stopped at once.",
    )

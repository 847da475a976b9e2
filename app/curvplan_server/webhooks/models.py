"""The webhook outbox: one delivery per terminal job status, its attempts, the project secret.

Deliveries are inserted by a trigger on ``job`` (migration 0007_webhooks) in the very
transaction that sets a terminal status, so no status change is lost or announced twice;
the workers send them (``curvplan_worker.webhooks``).
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import (
    CheckConstraint,
    Computed,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from curvplan.types.webhooks import StoredWebhookEvent
from curvplan_core.db import Base

# A delivery's endpoint: its URL's ``scheme://host:port`` (lower case), the unit backed off.
ENDPOINT_EXPRESSION = "lower(substring(url from '^[^/?#]*//[^/?#]*'))"


class WebhookSecret(Base):
    """The project's signing secret (HMAC key); a new one replaces the old, which keeps
    signing beside it until ``previous_expires_at`` (an overlap for the receivers)."""

    __tablename__ = "webhook_secret"

    project_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("project.id", ondelete="CASCADE"), primary_key=True
    )
    secret: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    previous_secret: Mapped[str | None] = mapped_column(Text)
    previous_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class WebhookDelivery(Base):
    """One event to POST to one URL, retried with backoff until it succeeds or gives up."""

    __tablename__ = "webhook_delivery"
    __table_args__ = (
        CheckConstraint("status IN ('pending', 'succeeded', 'failed')", name="status"),
        Index(
            "ix_webhook_delivery_due",
            "next_attempt_at",
            postgresql_where=text("status = 'pending'"),
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)  # the event id
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("job.id", ondelete="CASCADE"), index=True)
    project_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("project.id", ondelete="CASCADE"))
    url: Mapped[str] = mapped_column(Text)
    endpoint: Mapped[str | None] = mapped_column(
        Text, Computed(ENDPOINT_EXPRESSION, persisted=True)
    )
    event_type: Mapped[str] = mapped_column(Text)
    payload: Mapped[StoredWebhookEvent] = mapped_column(JSONB)
    status: Mapped[str] = mapped_column(Text, server_default="pending")
    attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    next_attempt_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    locked_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class WebhookAttempt(Base):
    """One POST of a delivery: what the receiver answered, or why it could not be reached."""

    __tablename__ = "webhook_attempt"

    delivery_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("webhook_delivery.id", ondelete="CASCADE"), primary_key=True
    )
    number: Mapped[int] = mapped_column(Integer, primary_key=True)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    duration_ms: Mapped[float] = mapped_column(Float)


class WebhookEndpoint(Base):
    """A failing endpoint of a project (the row goes at its next success): consecutive
    retryable failures, and once they reach the breaker's threshold ``open_until``: no delivery
    to it is attempted before then, and one probe at a time after it."""

    __tablename__ = "webhook_endpoint"

    project_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("project.id", ondelete="CASCADE"), primary_key=True
    )
    endpoint: Mapped[str] = mapped_column(Text, primary_key=True)
    failures: Mapped[int] = mapped_column(Integer, server_default="0")
    open_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

"""Secrets, the submit-time check of a job's ``webhook_url`` and the delivery listing."""

from __future__ import annotations

import base64
import secrets
import uuid
from datetime import timedelta

from sqlalchemy import func, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from curvplan.types.webhooks import (
    WebhookAttemptOut,
    WebhookDeliveryList,
    WebhookDeliveryOut,
    WebhookSecretOut,
)
from curvplan_core.config import Settings
from curvplan_core.webhooks.guard import AddressPolicy, WebhookRefused
from curvplan_server.problems import Problem, not_found, validation_problem
from curvplan_server.webhooks.models import WebhookAttempt, WebhookDelivery, WebhookSecret


def policy_of(settings: Settings) -> AddressPolicy:
    return AddressPolicy.from_lists(
        settings.webhook_allowed_hosts, settings.webhook_allowed_networks
    )


def _field_problem(message: str) -> Problem:
    return validation_problem(
        [
            {
                "field": "body.webhook_url",
                "loc": ["body", "webhook_url"],
                "message": message,
                "type": "value_error",
            }
        ]
    )


def check_job_webhook(
    session: Session, settings: Settings, project_id: uuid.UUID, url: object
) -> None:
    """422 naming ``body.webhook_url`` (``url``, a job body's) when its host is not allowed or
    the project has no signing secret yet (events would be unverifiable)."""
    if url is None:
        return
    try:
        policy_of(settings).check_url(str(url))
    except WebhookRefused as exc:
        raise _field_problem(str(exc)) from None
    has_secret = session.execute(
        select(WebhookSecret.__table__.c.project_id).where(
            WebhookSecret.__table__.c.project_id == project_id
        )
    ).first()
    if has_secret is None:
        raise _field_problem(
            "the project has no webhook signing secret: create one first with "
            "POST /v1/webhooks/secret (`curvplan webhooks secret`)"
        )


def new_secret() -> str:
    """``whsec_`` + base64 of 32 random bytes (a Standard Webhooks secret)."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def rotate_secret(
    session: Session, project_id: uuid.UUID, overlap_seconds: float = 0.0
) -> WebhookSecretOut:
    """A new signing secret for the project; the old one keeps signing beside it for
    ``overlap_seconds`` (0: it stops at once)."""
    value = new_secret()
    table = WebhookSecret.__table__
    insert_secret = insert(WebhookSecret).values(project_id=project_id, secret=value)
    overlap_until = func.now() + timedelta(seconds=overlap_seconds)
    stmt = insert_secret.on_conflict_do_update(
        index_elements=["project_id"],
        set_={
            "secret": value,
            "created_at": insert_secret.excluded.created_at,
            "previous_secret": table.c.secret if overlap_seconds > 0 else None,
            "previous_expires_at": overlap_until if overlap_seconds > 0 else None,
        },
    ).returning(table.c.created_at, table.c.previous_expires_at)
    row = session.execute(stmt).one()
    session.commit()
    return WebhookSecretOut(
        secret=value, created_at=row.created_at, previous_expires_at=row.previous_expires_at
    )


def list_deliveries(
    session: Session, project_id: uuid.UUID, job_id: uuid.UUID
) -> WebhookDeliveryList:
    """The job's deliveries with every attempt; 404 for an unknown job or another project's
    (the answer ``GET /v1/jobs/{id}`` gives)."""
    owned = session.execute(
        text("SELECT 1 FROM job WHERE id = :j AND project_id = :p"), {"j": job_id, "p": project_id}
    ).first()
    if owned is None:
        raise not_found("job")
    d = WebhookDelivery.__table__.c
    a = WebhookAttempt.__table__.c
    rows = session.execute(
        select(WebhookDelivery.__table__)
        .where(d.job_id == job_id, d.project_id == project_id)
        .order_by(d.created_at)
    ).all()
    attempts: dict[uuid.UUID, list[WebhookAttemptOut]] = {r.id: [] for r in rows}
    if rows:
        for att in session.execute(
            select(WebhookAttempt.__table__)
            .where(a.delivery_id.in_(list(attempts)))
            .order_by(a.number)
        ):
            attempts[att.delivery_id].append(
                WebhookAttemptOut(
                    number=att.number,
                    started_at=att.started_at,
                    status_code=att.status_code,
                    error=att.error,
                    duration_ms=att.duration_ms,
                )
            )
    return WebhookDeliveryList(
        items=[
            WebhookDeliveryOut(
                id=str(r.id),
                job_id=str(r.job_id),
                url=r.url,
                event_type=r.event_type,
                status=r.status,
                attempts=attempts[r.id],
                next_attempt_at=r.next_attempt_at,
                created_at=r.created_at,
                delivered_at=r.delivered_at,
            )
            for r in rows
        ]
    )

"""Webhooks: the project's signing secret, the delivery outbox and its attempts, and the
trigger that writes a delivery in the transaction that sets a job's terminal status.

The trigger is the one place that turns a status change into an event, so every path that
ends a job (worker finish, crash, reaper, API cancel, fan-in) announces it exactly once,
atomically with the change. Fan-out children (``parent_id`` set) do not fire.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30 21:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TRIGGER_FUNCTION = """
CREATE FUNCTION job_webhook_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    hook text := NEW.request ->> 'webhook_url';
    event uuid := gen_random_uuid();
    path text := '/v1/jobs/' || NEW.id::text;
BEGIN
    IF hook IS NULL OR NEW.parent_id IS NOT NULL
       OR NEW.status NOT IN ('succeeded', 'failed', 'cancelled')
       OR OLD.status IN ('succeeded', 'failed', 'cancelled') THEN
        RETURN NEW;
    END IF;
    INSERT INTO webhook_delivery (id, job_id, project_id, url, event_type, payload)
    VALUES (
        event, NEW.id, NEW.project_id, hook, 'job.' || NEW.status,
        jsonb_build_object(
            'id', event::text,
            'type', 'job.' || NEW.status,
            'created_at', to_jsonb(COALESCE(NEW.finished_at, now())),
            'job', jsonb_build_object(
                'id', NEW.id::text, 'kind', NEW.kind, 'name', NEW.name,
                'status', NEW.status, 'tags', COALESCE(NEW.tags, '{}'::jsonb)
            ),
            'links', jsonb_build_object(
                'job', path,
                'recommendation', path || '/recommendation',
                'report', path || '/report'
            )
        )
    );
    RETURN NEW;
END
$$;
"""


def upgrade() -> None:
    op.create_table(
        "webhook_secret",
        sa.Column("project_id", sa.Uuid(), nullable=False),
        sa.Column("secret", sa.Text(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["project.id"],
            name=op.f("fk_webhook_secret_project_id_project"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("project_id", name=op.f("pk_webhook_secret")),
    )
    op.create_table(
        "webhook_delivery",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("job_id", sa.Uuid(), nullable=False),
        sa.Column("project_id", sa.Uuid(), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("event_type", sa.Text(), nullable=False),
        sa.Column("payload", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("status", sa.Text(), server_default="pending", nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column(
            "next_attempt_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=True,
        ),
        sa.Column("locked_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('pending', 'succeeded', 'failed')", name=op.f("ck_webhook_delivery_status")
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["job.id"], name=op.f("fk_webhook_delivery_job_id_job"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["project.id"],
            name=op.f("fk_webhook_delivery_project_id_project"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_delivery")),
    )
    op.create_index(op.f("ix_webhook_delivery_job_id"), "webhook_delivery", ["job_id"])
    op.create_index(
        "ix_webhook_delivery_due",
        "webhook_delivery",
        ["next_attempt_at"],
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.create_table(
        "webhook_attempt",
        sa.Column("delivery_id", sa.Uuid(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("duration_ms", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["delivery_id"],
            ["webhook_delivery.id"],
            name=op.f("fk_webhook_attempt_delivery_id_webhook_delivery"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("delivery_id", "number", name=op.f("pk_webhook_attempt")),
    )
    op.execute(TRIGGER_FUNCTION)
    op.execute(
        "CREATE TRIGGER job_webhook_outbox AFTER UPDATE OF status ON job "
        "FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status) "
        "EXECUTE FUNCTION job_webhook_outbox()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER job_webhook_outbox ON job")
    op.execute("DROP FUNCTION job_webhook_outbox()")
    op.drop_table("webhook_attempt")
    op.drop_index("ix_webhook_delivery_due", table_name="webhook_delivery")
    op.drop_index(op.f("ix_webhook_delivery_job_id"), table_name="webhook_delivery")
    op.drop_table("webhook_delivery")
    op.drop_table("webhook_secret")

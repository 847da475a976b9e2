"""Service credentials (operator keys with scopes) and NOTIFY on job changes.

Service credentials: keys of no project, with scopes (operator now, worker later).

``GET /v1/workers`` and ``GET /metrics`` show every project's workers and queue counts,
so they need a credential that belongs to no project: an operator key with the scopes
``workers:read`` / ``metrics:read``. Only the sha256 of a key is stored.

Job notifications: a trigger sends ``pg_notify('curvplan_job', '<id> <status> <queue>')``
when a job's status changes (long-polls listen) and ``pg_notify('curvplan_queue',
'<queue>')`` when a job is queued, new or again (idle workers listen), so neither
queries the database every fraction of a second. API processes do not hear inserts.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30 21:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "service_credential",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.Text(), nullable=True),
        sa.Column("prefix", sa.Text(), nullable=False),
        sa.Column("key_hash", sa.Text(), nullable=False),
        sa.Column("scopes", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("cardinality(scopes) > 0", name="ck_service_credential_scopes"),
        sa.PrimaryKeyConstraint("id", name="pk_service_credential"),
        sa.UniqueConstraint("key_hash", name="uq_service_credential_key_hash"),
    )


    op.execute(NOTIFY_FUNCTION)
    op.execute(
        "CREATE TRIGGER job_notify AFTER INSERT OR UPDATE OF status ON job"
        " FOR EACH ROW EXECUTE FUNCTION curvplan_job_notify()"
    )


NOTIFY_FUNCTION = """
CREATE FUNCTION curvplan_job_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- A status change of an existing job: what long-polls wait for.
    IF TG_OP = 'UPDATE' AND NEW.status IS DISTINCT FROM OLD.status THEN
        PERFORM pg_notify('curvplan_job', NEW.id::text || ' ' || NEW.status || ' ' || NEW.queue);
    END IF;
    -- A job (newly or again) queued: what idle workers wait for.
    IF NEW.status = 'queued' AND (TG_OP = 'INSERT' OR OLD.status IS DISTINCT FROM 'queued') THEN
        PERFORM pg_notify('curvplan_queue', NEW.queue);
    END IF;
    RETURN NULL;
END
$$
"""


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS job_notify ON job")
    op.execute("DROP FUNCTION IF EXISTS curvplan_job_notify()")
    op.drop_table("service_credential")

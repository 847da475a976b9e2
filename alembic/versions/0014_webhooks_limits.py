"""Fair webhook delivery, secret rotation with an overlap, and the rate-limit buckets.

- ``webhook_delivery.endpoint``: the URL's ``scheme://host:port`` part (generated), the unit a
  failing receiver is backed off as;
- ``webhook_endpoint``: one row per (project, endpoint) while it fails: consecutive retryable
  failures and, once they reach the breaker's threshold, ``open_until`` (no delivery to it is
  attempted before; after it, one probe at a time until one succeeds and the row goes);
- ``webhook_secret.previous_secret`` / ``previous_expires_at``: a rotated-out secret keeps
  signing beside the new one until then (Standard Webhooks: space-separated signatures);
- ``rate_limit``: one GCRA bucket per limited subject (its theoretical arrival time), shared
  by every API process.

Revision ID: webhooks_limits
Revises: 0013
Create Date: 2026-12-03 23:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "webhooks_limits"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ENDPOINT_EXPRESSION = "lower(substring(url from '^[^/?#]*//[^/?#]*'))"


def upgrade() -> None:
    op.add_column(
        "webhook_delivery",
        sa.Column(
            "endpoint",
            sa.Text(),
            sa.Computed(ENDPOINT_EXPRESSION, persisted=True),
            nullable=True,
        ),
    )
    op.create_table(
        "webhook_endpoint",
        sa.Column("project_id", sa.Uuid(), nullable=False),
        sa.Column("endpoint", sa.Text(), nullable=False),
        sa.Column("failures", sa.Integer(), server_default="0", nullable=False),
        sa.Column("open_until", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["project.id"],
            name=op.f("fk_webhook_endpoint_project_id_project"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("project_id", "endpoint", name=op.f("pk_webhook_endpoint")),
    )
    op.add_column("webhook_secret", sa.Column("previous_secret", sa.Text(), nullable=True))
    op.add_column(
        "webhook_secret",
        sa.Column("previous_expires_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_table(
        "rate_limit",
        sa.Column("bucket", sa.Text(), nullable=False),
        sa.Column("tat", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("bucket", name=op.f("pk_rate_limit")),
    )


def downgrade() -> None:
    op.drop_table("rate_limit")
    op.drop_column("webhook_secret", "previous_expires_at")
    op.drop_column("webhook_secret", "previous_secret")
    op.drop_table("webhook_endpoint")
    op.drop_column("webhook_delivery", "endpoint")

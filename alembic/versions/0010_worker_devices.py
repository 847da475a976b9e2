"""Devices per worker: a worker claims only jobs asking for at most as many devices as it has.

``worker.devices`` is how many devices (data-parallel ranks) the worker gives one job
(``curvplan worker --devices``); the claim compares it with the job's
``request.resources.devices`` (1 when absent). Existing rows get 1.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-30 23:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("worker", sa.Column("devices", sa.Integer(), nullable=False, server_default="1"))


def downgrade() -> None:
    op.drop_column("worker", "devices")

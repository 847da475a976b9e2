"""Worker credentials: a service credential may belong to one worker row.

A worker on another host talks to the API for artifact blobs with a service credential of
scope ``worker`` that it creates itself at start (it has database access) and revokes at
stop; the reaper revokes the credentials of workers it marks stale. ``worker_id`` links the
credential to its worker row (NULL for an operator's credential).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-30 23:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("service_credential", sa.Column("worker_id", sa.Text(), nullable=True))
    op.create_foreign_key(
        "fk_service_credential_worker_id_worker",
        "service_credential",
        "worker",
        ["worker_id"],
        ["id"],
        ondelete="CASCADE",
    )
    op.create_index(
        "ix_service_credential_worker_id", "service_credential", ["worker_id"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_service_credential_worker_id", table_name="service_credential")
    op.drop_constraint(
        "fk_service_credential_worker_id_worker", "service_credential", type_="foreignkey"
    )
    op.drop_column("service_credential", "worker_id")

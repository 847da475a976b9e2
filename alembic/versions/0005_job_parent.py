"""Fan-out: a job may have a parent job (``job.parent_id``), and an attempt may end by fanning out.

A parent job creates child jobs in the transaction that ends its fan-out attempt (attempt
outcome ``fanned-out``); it then stays ``running`` without a lease while its children run,
and the transaction that records the last child's end queues it again for a fan-in attempt.
Deleting a parent deletes its children (a child is never kept without its parent).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 21:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OUTCOMES = "'succeeded', 'failed', 'cancelled', 'lease-lost', 'released', 'crashed'"


def upgrade() -> None:
    op.add_column("job", sa.Column("parent_id", sa.Uuid(), nullable=True))
    op.create_foreign_key(
        op.f("fk_job_parent_id_job"), "job", "job", ["parent_id"], ["id"], ondelete="CASCADE"
    )
    op.create_index(op.f("ix_job_parent_id"), "job", ["parent_id"])
    op.drop_constraint(op.f("ck_job_attempt_outcome"), "job_attempt", type_="check")
    op.create_check_constraint(
        op.f("ck_job_attempt_outcome"),
        "job_attempt",
        f"outcome IS NULL OR outcome IN ({_OUTCOMES}, 'fanned-out')",
    )


def downgrade() -> None:
    op.execute("UPDATE job_attempt SET outcome = 'succeeded' WHERE outcome = 'fanned-out'")
    op.drop_constraint(op.f("ck_job_attempt_outcome"), "job_attempt", type_="check")
    op.create_check_constraint(
        op.f("ck_job_attempt_outcome"),
        "job_attempt",
        f"outcome IS NULL OR outcome IN ({_OUTCOMES})",
    )
    op.drop_index(op.f("ix_job_parent_id"), table_name="job")
    op.drop_constraint(op.f("fk_job_parent_id_job"), "job", type_="foreignkey")
    op.drop_column("job", "parent_id")

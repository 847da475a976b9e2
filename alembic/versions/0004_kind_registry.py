"""Job kinds and queues are validated by the application's registry, not by CHECK constraints.

Adding a job kind used to need a migration for ``ck_job_kind``/``ck_job_queue``; the
contract's registry (``curvplan.types.jobs.QUEUE_OF_KIND``) is now the one place. This
migration, like every migration, names literal values and never imports the live registry.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 20:45:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_constraint(op.f("ck_job_kind"), "job", type_="check")
    op.drop_constraint(op.f("ck_job_queue"), "job", type_="check")


def downgrade() -> None:
    # The kinds and queues that existed when this migration was written.
    op.create_check_constraint(op.f("ck_job_kind"), "job", "kind IN ('plan', 'analyze')")
    op.create_check_constraint(op.f("ck_job_queue"), "job", "queue IN ('cpu', 'gpu')")

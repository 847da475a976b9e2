"""Fair claim across projects: a per-project claim index and the project's last claim time.

The claim (``curvplan_worker.store.CLAIM_SQL``) now orders, within equal priority, by the
project's running jobs (fewest first), then by when the project was last served (longest ago
first, round robin), then by ``created_at``. It finds each project's head job through
``ix_job_project_claim`` (project_id, queue, priority DESC, created_at) WHERE status =
'queued' — one skip-scan step per (project, queue) with queued jobs — instead of sorting the
backlog, and stamps ``project.last_claimed_at`` in the same statement.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-30 23:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

QUEUED = sa.text("status = 'queued'")


def upgrade() -> None:
    op.add_column("project", sa.Column("last_claimed_at", sa.DateTime(timezone=True)))
    op.create_index(
        "ix_job_project_claim",
        "job",
        ["project_id", "queue", sa.literal_column("priority DESC"), "created_at"],
        unique=False,
        postgresql_where=QUEUED,
    )


def downgrade() -> None:
    op.drop_index("ix_job_project_claim", table_name="job", postgresql_where=QUEUED)
    op.drop_column("project", "last_claimed_at")

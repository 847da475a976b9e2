"""Artifacts: uploaded checkpoints/datasets and job outputs.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 08:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "artifact",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("project_id", sa.Uuid(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=True),
        sa.Column("storage", sa.Text(), nullable=False),
        sa.Column("sha256", sa.Text(), nullable=True),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        sa.Column("uri", sa.Text(), nullable=True),
        sa.Column("tensors", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("job_id", sa.Uuid(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "kind IN ('checkpoint', 'dataset', 'job-output')", name=op.f("ck_artifact_kind")
        ),
        sa.CheckConstraint("storage IN ('blob', 'uri')", name=op.f("ck_artifact_storage")),
        sa.CheckConstraint(
            "(storage = 'blob' AND sha256 IS NOT NULL AND size_bytes IS NOT NULL AND uri IS NULL)"
            " OR (storage = 'uri' AND uri IS NOT NULL)",
            name=op.f("ck_artifact_storage_fields"),
        ),
        sa.CheckConstraint(
            "(kind = 'job-output') = (job_id IS NOT NULL)",
            name=op.f("ck_artifact_job_output_has_job"),
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["job.id"], name=op.f("fk_artifact_job_id_job"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["project.id"],
            name=op.f("fk_artifact_project_id_project"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_artifact")),
    )
    op.create_index(
        "ix_artifact_project_id_created_at_id",
        "artifact",
        ["project_id", "created_at", "id"],
        unique=False,
    )
    op.create_index(
        "uq_artifact_upload_content",
        "artifact",
        ["project_id", "kind", "sha256"],
        unique=True,
        postgresql_where=sa.text("job_id IS NULL AND storage = 'blob'"),
    )
    op.create_index(
        "uq_artifact_job_output_name",
        "artifact",
        ["job_id", "name"],
        unique=True,
        postgresql_where=sa.text("job_id IS NOT NULL"),
    )
    op.create_index("ix_artifact_sha256", "artifact", ["sha256"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_artifact_sha256", table_name="artifact")
    op.drop_index("uq_artifact_job_output_name", table_name="artifact")
    op.drop_index("uq_artifact_upload_content", table_name="artifact")
    op.drop_index("ix_artifact_project_id_created_at_id", table_name="artifact")
    op.drop_table("artifact")

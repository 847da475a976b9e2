"""The ``artifact`` table: uploaded checkpoints/datasets and the bulky outputs of jobs.

An artifact is either a blob in the content-addressed store (``storage='blob'``, with its
sha256 and size) or a reference to a file the workers can read (``storage='uri'``; hashed
and validated when a job first uses it). Job outputs (``kind='job-output'``) carry the
``job_id`` that wrote them and a ``name`` unique within that job.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import BigInteger, CheckConstraint, DateTime, ForeignKey, Index, Text, func, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from curvplan_core.artifacts.safetensors_format import SafetensorsSummary
from curvplan_core.db import Base

ARTIFACT_KINDS = ("checkpoint", "dataset", "job-output")
UPLOAD_KINDS = ("checkpoint", "dataset")
STORAGES = ("blob", "uri")


def _sql_in(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{v}'" for v in values)


class Artifact(Base):
    """A safetensors file owned by a project (and, for job outputs, by a job)."""

    __tablename__ = "artifact"
    __table_args__ = (
        CheckConstraint(f"kind IN ({_sql_in(ARTIFACT_KINDS)})", name="kind"),
        CheckConstraint(f"storage IN ({_sql_in(STORAGES)})", name="storage"),
        CheckConstraint(
            "(storage = 'blob' AND sha256 IS NOT NULL AND size_bytes IS NOT NULL AND uri IS NULL)"
            " OR (storage = 'uri' AND uri IS NOT NULL)",
            name="storage_fields",
        ),
        CheckConstraint("(kind = 'job-output') = (job_id IS NOT NULL)", name="job_output_has_job"),
        Index("ix_artifact_project_id_created_at_id", "project_id", "created_at", "id"),
        # One row per (project, kind, content) for uploads: re-uploading answers the same row.
        Index(
            "uq_artifact_upload_content",
            "project_id",
            "kind",
            "sha256",
            unique=True,
            postgresql_where=text("job_id IS NULL AND storage = 'blob'"),
        ),
        # A job's outputs have unique names (a retried attempt overwrites its own rows).
        Index(
            "uq_artifact_job_output_name",
            "job_id",
            "name",
            unique=True,
            postgresql_where=text("job_id IS NOT NULL"),
        ),
        Index("ix_artifact_sha256", "sha256"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    project_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("project.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(Text)
    name: Mapped[str | None] = mapped_column(Text)
    storage: Mapped[str] = mapped_column(Text)
    sha256: Mapped[str | None] = mapped_column(Text)
    size_bytes: Mapped[int | None] = mapped_column(BigInteger)
    uri: Mapped[str | None] = mapped_column(Text)
    tensors: Mapped[SafetensorsSummary | None] = mapped_column(JSONB)
    job_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("job.id", ondelete="CASCADE"))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())

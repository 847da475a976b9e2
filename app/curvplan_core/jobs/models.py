"""The job row is the queue (docs/layout.md) and ``job_attempt`` proves each claim."""

from __future__ import annotations

import uuid
from datetime import datetime

from pydantic import JsonValue
from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Identity,
    Index,
    Integer,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from curvplan.types.jobs import (  # the registry: kinds and queues are validated by the API
    JOB_STATUSES,
    JobStatus,
)
from curvplan_core.db import Base
from curvplan_core.jobs.records import ErrorRecord, ProgressRecord

ATTEMPT_OUTCOMES = (
    "succeeded",
    "failed",
    "cancelled",
    "lease-lost",
    "released",
    "crashed",
    "fanned-out",  # the attempt created child jobs; the job waits for them (migration 0005)
)


def _sql_in(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{v}'" for v in values)


class Job(Base):
    """One unit of work of a project; its lifecycle is queued → running → terminal."""

    __tablename__ = "job"
    __table_args__ = (
        CheckConstraint(f"status IN ({_sql_in(JOB_STATUSES)})", name="status"),
        CheckConstraint("attempt >= 0", name="attempt_non_negative"),
        CheckConstraint("max_attempts >= 1", name="max_attempts_positive"),
        UniqueConstraint("project_id", "idempotency_key", name="uq_job_project_id_idempotency_key"),
        # In the claim's ORDER BY order, so a claim stops at the first runnable row
        # instead of sorting the whole backlog (migration 0003).
        Index(
            "ix_job_claim_order",
            text("priority DESC"),
            "created_at",
            postgresql_where=text("status = 'queued'"),
        ),
        # Each project's head job, for the claim's fairness across projects (migration 0011).
        Index(
            "ix_job_project_claim",
            "project_id",
            "queue",
            text("priority DESC"),
            "created_at",
            postgresql_where=text("status = 'queued'"),
        ),
        Index("ix_job_project_id_created_at_id", "project_id", "created_at", "id"),
        Index(
            "ix_job_lease_expires_at",
            "lease_expires_at",
            postgresql_where=text("status IN ('running', 'cancelling')"),
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    project_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("project.id", ondelete="CASCADE"), index=True
    )
    #: The job that fanned this one out (None for a job a client created); see
    #: curvplan_core.jobs.fanout. Deleting a parent deletes its children.
    parent_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("job.id", ondelete="CASCADE"), index=True
    )
    kind: Mapped[str] = mapped_column(Text)
    queue: Mapped[str] = mapped_column(Text)
    name: Mapped[str | None] = mapped_column(Text, index=True)
    tags: Mapped[dict[str, str]] = mapped_column(
        JSONB, default=dict, server_default=text("'{}'::jsonb")
    )
    status: Mapped[str] = mapped_column(
        Text, default=JobStatus.QUEUED.value, server_default=JobStatus.QUEUED.value
    )
    request: Mapped[dict[str, JsonValue]] = mapped_column(JSONB)
    result: Mapped[dict[str, JsonValue] | None] = mapped_column(JSONB)
    error: Mapped[ErrorRecord | None] = mapped_column(JSONB)
    progress: Mapped[ProgressRecord | None] = mapped_column(JSONB)
    idempotency_key: Mapped[str | None] = mapped_column(Text)
    request_hash: Mapped[str | None] = mapped_column(Text)
    attempt: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    max_attempts: Mapped[int] = mapped_column(Integer, default=3, server_default="3")
    worker_id: Mapped[str | None] = mapped_column(Text)
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    run_after: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    cancel_requested: Mapped[bool] = mapped_column(
        Boolean, default=False, server_default=text("false")
    )
    priority: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class JobAttempt(Base):
    """One row per claim of a job: the proof that an attempt ran (and how it ended)."""

    __tablename__ = "job_attempt"
    __table_args__ = (
        UniqueConstraint("job_id", "attempt", name="uq_job_attempt_job_id_attempt"),
        CheckConstraint(
            f"outcome IS NULL OR outcome IN ({_sql_in(ATTEMPT_OUTCOMES)})", name="outcome"
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("job.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    worker_id: Mapped[str] = mapped_column(Text)
    claimed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    outcome: Mapped[str | None] = mapped_column(Text)


class JobArtifact(Base):
    """An artifact a job's body names, at ``field`` (its dotted path, e.g. ``checkpoint.1``):
    what keeps the artifact from deletion while the job is live (curvplan_core.jobs.links,
    migration 0013)."""

    __tablename__ = "job_artifact"

    job_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("job.id", ondelete="CASCADE"), primary_key=True
    )
    field: Mapped[str] = mapped_column(Text, primary_key=True)
    artifact_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("artifact.id", ondelete="CASCADE"), index=True
    )

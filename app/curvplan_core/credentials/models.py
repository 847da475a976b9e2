"""Projects and their API keys (only the sha256 of a key is stored)."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import CheckConstraint, DateTime, ForeignKey, Text, func
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Mapped, mapped_column

from curvplan_core.db import Base


class Project(Base):
    """Every job (and later artifact) belongs to a project; a key sees only its project."""

    __tablename__ = "project"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    name: Mapped[str] = mapped_column(Text, unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    #: When a worker last claimed one of the project's jobs (the claim's round robin).
    last_claimed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class ApiKey(Base):
    """A bearer key of a project: ``cp_<urlsafe 32 bytes>``, stored as its sha256 hex digest."""

    __tablename__ = "api_key"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    project_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("project.id", ondelete="CASCADE"), index=True
    )
    prefix: Mapped[str] = mapped_column(Text)
    key_hash: Mapped[str] = mapped_column(Text, unique=True)
    name: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    #: After this instant the key is refused like a revoked one; None: it never expires.
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class ServiceCredential(Base):
    """A key of no project, with scopes: an operator's, or a worker's own (``worker_id``)."""

    __tablename__ = "service_credential"
    __table_args__ = (CheckConstraint("cardinality(scopes) > 0", name="scopes"),)

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    name: Mapped[str | None] = mapped_column(Text)
    prefix: Mapped[str] = mapped_column(Text)
    key_hash: Mapped[str] = mapped_column(Text, unique=True)
    scopes: Mapped[list[str]] = mapped_column(ARRAY(Text))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    #: The worker row a ``worker`` credential belongs to (revoked when the worker stops or is
    #: marked stale); None for an operator's credential.
    worker_id: Mapped[str | None] = mapped_column(
        ForeignKey("worker.id", ondelete="CASCADE"), index=True
    )

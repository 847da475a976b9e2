"""The ``worker`` table: one row per worker process, kept fresh by its heartbeat."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import CheckConstraint, DateTime, Integer, Text, func
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Mapped, mapped_column

from curvplan_core.db import Base

WORKER_STATUSES = ("running", "stopping", "stopped")


class Worker(Base):
    """A worker process (id ``<hostname>-<pid>-<random4>``) and the job it runs now."""

    __tablename__ = "worker"
    __table_args__ = (
        CheckConstraint("status IN ('running', 'stopping', 'stopped')", name="status"),
    )

    id: Mapped[str] = mapped_column(Text, primary_key=True)
    hostname: Mapped[str] = mapped_column(Text)
    pid: Mapped[int] = mapped_column(Integer)
    queues: Mapped[list[str]] = mapped_column(ARRAY(Text))
    #: Devices the worker gives one job; it claims jobs with resources.devices ≤ this.
    devices: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    status: Mapped[str] = mapped_column(Text, default="running", server_default="running")
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    last_heartbeat_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    current_job_id: Mapped[uuid.UUID | None] = mapped_column()

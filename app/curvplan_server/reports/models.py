"""The figures of a succeeded job, drawn once and kept (``curvplan_server.reports.cache``)."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import DateTime, ForeignKey, Integer, LargeBinary, Text, func
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from curvplan_core.db import Base


class JobPlot(Base):
    """One figure of one job: its SVG and PNG, or the reason it is empty."""

    __tablename__ = "job_plot"

    job_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("job.id", ondelete="CASCADE"), primary_key=True
    )
    name: Mapped[str] = mapped_column(Text, primary_key=True)
    position: Mapped[int] = mapped_column(Integer)
    renderer: Mapped[str] = mapped_column(Text)  # plots.RENDERER that drew it
    title: Mapped[str] = mapped_column(Text)
    caption: Mapped[str] = mapped_column(Text)
    empty_reason: Mapped[str | None] = mapped_column(Text)
    numbers: Mapped[dict[str, object]] = mapped_column(JSONB)
    svg: Mapped[str | None] = mapped_column(Text)
    png: Mapped[bytes | None] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())

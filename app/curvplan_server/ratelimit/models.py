"""The rate-limit buckets: one row per limited subject, shared by every API process."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, Text
from sqlalchemy.orm import Mapped, mapped_column

from curvplan_core.db import Base


class RateLimitBucket(Base):
    """GCRA state of one subject (``submit:project:<id>``, ``auth:addr:<ip>`` …): its
    theoretical arrival time, the moment the bucket would be empty again."""

    __tablename__ = "rate_limit"

    bucket: Mapped[str] = mapped_column(Text, primary_key=True)
    tat: Mapped[datetime] = mapped_column(DateTime(timezone=True))

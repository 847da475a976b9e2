"""Response models of ``GET /v1/recommendations`` (no FastAPI or SQLAlchemy: the client
imports them)."""

from __future__ import annotations

import uuid
from datetime import datetime

from pydantic import BaseModel, Field

from curvplan.types.planner import Budget, Recommendation


class RecommendationLinks(BaseModel):
    job: str
    recommendation: str


class LatestRecommendation(BaseModel):
    """The current recommendation for one job name."""

    name: str
    job_id: uuid.UUID
    kind: str
    tags: dict[str, str]
    finished_at: datetime | None
    budget: Budget | None = Field(
        default=None,
        description="recommendation.budget, first: how much data, which batch size, the "
        "sharpness threshold (null for recommendations stored before the budget existed).",
    )
    recommendation: Recommendation
    links: RecommendationLinks


class RecommendationPage(BaseModel):
    items: list[LatestRecommendation]
    next_page_token: str | None

"""Typed results of the client: the API's own pydantic models where they exist.

``Job``/``JobPage`` are :mod:`curvplan.types.jobs`' ``JobOut``/``JobPage``, ``Artifact`` is
:mod:`curvplan.types.artifacts`' ``ArtifactOut`` and ``Recommendation`` is the planner's
output model, so a field renamed on the server is renamed here too. A
recommendation-listing row is the API's ``LatestRecommendation``; a job's ``result`` is
``PlanResult`` or ``AnalyzeResult``; the report-link model mirrors its endpoint's JSON and
accepts extra fields.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

from curvplan.types.artifacts import ArtifactOut, ArtifactPage
from curvplan.types.jobs import TERMINAL_STATUSES, JobError, JobOut, JobPage, JobStatus, Progress
from curvplan.types.planner import Measurements, Recommendation, Targets
from curvplan.types.recommendations import LatestRecommendation, RecommendationPage
from curvplan.types.reports import PlotFiles, PlotInfo, PlotList
from curvplan.types.results import AnalyzeResult, PlanResult
from curvplan.types.webhooks import WebhookDeliveryList, WebhookDeliveryOut, WebhookSecretOut

Job = JobOut
Artifact = ArtifactOut


def job_recommendation(job: JobOut) -> Recommendation | None:
    """The recommendation of a succeeded job; None before it succeeded or when its result has
    none. A result stored as a plain dict is validated (ValueError if it does not fit)."""
    result = job.result
    if job.status != JobStatus.SUCCEEDED or result is None:
        return None
    if isinstance(result, dict):
        rec = result.get("recommendation")
        return Recommendation.model_validate(rec) if isinstance(rec, dict) else None
    return getattr(result, "recommendation", None)  # an analyze_blocks child has none


def is_terminal(job: JobOut) -> bool:
    """True once the job can no longer change (succeeded, failed or cancelled)."""
    return job.status in TERMINAL_STATUSES


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


#: One row of ``GET /v1/recommendations`` (the API's model, its recommendation typed).
RecommendationEntry = LatestRecommendation


class ReportLink(_Open):
    """A short-lived signed URL of a job's report page (``POST /v1/jobs/{id}/report-link``)."""

    url: str
    path: str | None = None
    expires_at: datetime


__all__ = [
    "AnalyzeResult",
    "Artifact",
    "ArtifactOut",
    "ArtifactPage",
    "Job",
    "JobError",
    "JobOut",
    "JobPage",
    "Measurements",
    "PlanResult",
    "PlotFiles",
    "PlotInfo",
    "PlotList",
    "Progress",
    "Recommendation",
    "RecommendationEntry",
    "RecommendationPage",
    "ReportLink",
    "Targets",
    "WebhookDeliveryList",
    "WebhookDeliveryOut",
    "WebhookSecretOut",
    "is_terminal",
]


def dump_json(model: BaseModel | Any) -> Any:
    """JSON-ready form of a model (or a value returned as is)."""
    return model.model_dump(mode="json") if isinstance(model, BaseModel) else model

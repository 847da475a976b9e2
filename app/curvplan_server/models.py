"""Import every table module so that ``Base.metadata`` is complete (Alembic, tests)."""

from __future__ import annotations

from curvplan_core.credentials.models import ApiKey, Project, ServiceCredential
from curvplan_core.db import Base
from curvplan_core.jobs.models import Job, JobArtifact, JobAttempt
from curvplan_server.artifacts.models import Artifact
from curvplan_server.ratelimit.models import RateLimitBucket
from curvplan_server.reports.models import JobPlot
from curvplan_server.webhooks.models import (
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookSecret,
)
from curvplan_server.workers.models import Worker

__all__ = [
    "ApiKey",
    "Artifact",
    "Base",
    "Job",
    "JobArtifact",
    "JobAttempt",
    "JobPlot",
    "Project",
    "RateLimitBucket",
    "ServiceCredential",
    "WebhookAttempt",
    "WebhookDelivery",
    "WebhookEndpoint",
    "WebhookSecret",
    "Worker",
]

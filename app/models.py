"""Import every table module so that ``Base.metadata`` is complete (Alembic, tests)."""

from __future__ import annotations

from app.artifacts.models import Artifact
from app.auth.models import ApiKey, Project
from app.db import Base
from app.jobs.models import Job, JobAttempt
from app.workers_api.models import Worker

__all__ = ["ApiKey", "Artifact", "Base", "Job", "JobAttempt", "Project", "Worker"]

"""Helpers of the in-process slot tests: worker options with short timings, a claimed job.

The attempt children run the test-only kind ``test`` (``attempt_test_kinds``), started with
the ``fork`` context so that they see its registration in ``KINDS``.
"""

from __future__ import annotations

import multiprocessing
import uuid
from pathlib import Path
from typing import Any

from queue_helpers import insert_jobs
from sqlalchemy import Engine

from curvplan_core.jobs import lifecycle, store
from curvplan_worker.options import WorkerOptions

FORK = multiprocessing.get_context("fork")


def slot_options(db_url: str, tmp_path: Path, **overrides: Any) -> WorkerOptions:
    """Options of a fast slot: beats every 0.1 s, retries after 0.1 s."""
    values: dict[str, Any] = {
        "database_url": db_url,
        "queues": ("cpu",),
        "data_dir": tmp_path,
        "lease_seconds": 5.0,
        "heartbeat_seconds": 0.1,
        "poll_interval": 0.05,
        "reaper_interval": 0.2,
        "backoff_base": 0.1,
        "backoff_max": 0.2,
        "cancel_grace_seconds": 1.0,
        "log_format": "json",
        "log_level": "WARNING",
        "notify": False,
        **overrides,
    }
    return WorkerOptions(**values)


def claim_test_job(
    db: Engine,
    project_id: uuid.UUID,
    worker_id: str,
    request: dict[str, Any],
    *,
    kind: str = "test",
    max_attempts: int = 3,
    lease_seconds: float = 5.0,
) -> store.ClaimedJob:
    """Queue one job of ``kind`` and claim it as ``worker_id``."""
    (job_id,) = insert_jobs(db, project_id, [request], kind=kind, max_attempts=max_attempts)
    with db.begin() as conn:
        claimed = lifecycle.claim(conn, worker_id, ["cpu"], lease_seconds)
    assert claimed is not None and claimed.fence.job_id == job_id
    return claimed

"""Helpers of the queue tests: jobs inserted as the API does, real worker processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

# The console script users run (as in production), else the module.
_SCRIPT = Path(sys.executable).parent / "curvplan"
CURVPLAN = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "curvplan.cli"]

# Short timings so that lease expiry, backoff and cancel happen within seconds.
FAST = [
    "--lease-seconds",
    "1.5",
    "--heartbeat-seconds",
    "0.2",
    "--poll-interval",
    "0.05",
    "--cancel-grace-seconds",
    "1.0",
]


def plan_request(n_losses: int = 40, *, orderings: int = 4, bootstrap: int = 0) -> dict[str, Any]:
    """A real (small) plan body: per-sample losses of a decaying-loss model and a tolerance."""
    losses = [0.2 + 0.8 * ((i * 7919) % 1000) / 1000.0 for i in range(n_losses)]
    return {
        "measurements": {"per_sample_losses": losses, "loss_bound": 1.0},
        "targets": {"tolerances": [0.05], "orderings": orderings, "bootstrap": bootstrap},
    }


def insert_jobs(
    engine: Engine,
    project_id: uuid.UUID,
    requests: list[dict[str, Any]],
    *,
    max_attempts: int = 3,
    kind: str = "plan",
) -> list[uuid.UUID]:
    """Queue jobs of ``kind`` (plan) the way the API does (status queued, queue cpu)."""
    ids = [uuid.uuid4() for _ in requests]
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO job (id, project_id, kind, queue, status, request, max_attempts)"
                " VALUES (:id, :project_id, :kind, 'cpu', 'queued', CAST(:request AS jsonb),"
                " :max_attempts)"
            ),
            [
                {
                    "id": job_id,
                    "project_id": project_id,
                    "request": json.dumps(request),
                    "max_attempts": max_attempts,
                    "kind": kind,
                }
                for job_id, request in zip(ids, requests, strict=True)
            ],
        )
    return ids


def job_row(engine: Engine, job_id: uuid.UUID) -> Any:
    with engine.connect() as conn:
        return conn.execute(text("SELECT * FROM job WHERE id = :id"), {"id": job_id}).one()


def attempt_rows(engine: Engine, job_id: uuid.UUID) -> list[Any]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                text("SELECT * FROM job_attempt WHERE job_id = :id ORDER BY attempt"),
                {"id": job_id},
            )
        )


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, every: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)


class WorkerProcess:
    """A real ``curvplan worker`` process; its log goes to a file the test can read."""

    def __init__(self, database_url: str, log_path: Path, args: list[str]) -> None:
        self.log_path = log_path
        env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "CURVPLAN_DATA_DIR": str(log_path.parent / "data"),
            "CURVPLAN_LOG_FORMAT": "json",
            "CURVPLAN_RETRY_BACKOFF_BASE_SECONDS": "0.2",
            "CURVPLAN_RETRY_BACKOFF_MAX_SECONDS": "1.0",
            "CURVPLAN_WORKER_STALE_SECONDS": "3",
        }
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(
            [*CURVPLAN, "worker", "--queues", "cpu", *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_records(self) -> list[dict[str, Any]]:
        records = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        return records

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

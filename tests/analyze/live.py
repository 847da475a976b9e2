"""Real processes for the analyze end-to-end tests: ``curvplan serve`` and ``curvplan worker``
on a database of their own (a worker claims every gpu job of its database)."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from live_plugin import Proc, free_port, make_api_key

FAST_WORKER = [
    "--lease-seconds",
    "2",
    "--heartbeat-seconds",
    "0.3",
    "--poll-interval",
    "0.1",
    "--cancel-grace-seconds",
    "60",
    "--shutdown-grace-seconds",
    "1",
]


def service_env(database_url: str, data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CURVPLAN_")}
    env.update(
        DATABASE_URL=database_url,
        CURVPLAN_DATA_DIR=str(data_dir),
        CURVPLAN_WORKER_SELF_TEST="false",  # the engine tests check HVPs; keep jobs short
        CURVPLAN_WORKER_THREADS="1",  # cores are shared with the API and the tests
        CURVPLAN_LOG_LEVEL="INFO",
        CURVPLAN_LONG_POLL_INTERVAL_SECONDS="0.05",
        CURVPLAN_RETRY_BACKOFF_BASE_SECONDS="0.2",
        CURVPLAN_RETRY_BACKOFF_MAX_SECONDS="0.5",
        CURVPLAN_WORKER_STALE_SECONDS="4",
        CURVPLAN_MAX_ARTIFACT_BYTES=str(256 * 1024),
        # file:// artifacts are refused unless the operator names roots: one under the data dir.
        CURVPLAN_ARTIFACT_URI_ROOTS=json.dumps([str(data_dir / "files")]),
        PYTHONUNBUFFERED="1",
    )
    (data_dir / "files").mkdir(parents=True, exist_ok=True)
    return env


@dataclass
class Service:
    """API + one gpu worker sharing a data directory (the blob store)."""

    database_url: str
    data_dir: Path
    env: dict[str, str]
    server: Proc
    worker: Proc
    port: int = field(default_factory=free_port)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def new_worker(self, log_name: str) -> Proc:
        worker = Proc(
            ["worker", "--queues", "gpu,cpu", *FAST_WORKER],
            self.env,
            self.data_dir.parent / log_name,
        )
        worker.start()
        return worker

    def logs(self) -> str:
        return "SERVER:\n" + self.server.tail() + "\nWORKER:\n" + self.worker.tail()


def start_service(database_url: str, tmp: Path, **extra_env: str) -> Service:
    data_dir = tmp / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    env = {**service_env(database_url, data_dir), **extra_env}
    port = free_port()
    server = Proc(["serve", "--port", str(port)], env, tmp / "server.log")
    worker = Proc(["worker", "--queues", "gpu,cpu", *FAST_WORKER], env, tmp / "worker.log")
    worker.start()
    server.start()
    service = Service(database_url, data_dir, env, server, worker, port)
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(service.url + "/healthz", timeout=1.0).status_code == 200:
                return service
        except httpx.TransportError:
            pass
        if (
            server.proc is not None and server.proc.poll() is not None
        ) or time.monotonic() > deadline:
            raise RuntimeError("the API did not come up:\n" + server.tail())
        time.sleep(0.1)


def wait_terminal(client: httpx.Client, job_id: str, timeout: float) -> dict[str, Any]:
    """Long-poll ``GET /v1/jobs/{id}?wait=`` until the job is terminal."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"job {job_id} not terminal after {timeout} s")
        response = client.get(f"/v1/jobs/{job_id}", params={"wait": min(10.0, remaining)})
        response.raise_for_status()
        job = response.json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            return job


@contextmanager
def project_client(service: Service, prefix: str) -> Iterator[httpx.Client]:
    """An HTTP client of ``service`` with the key of a new project named ``prefix-<random>``."""
    key = make_api_key(service.database_url, f"{prefix}-{uuid.uuid4().hex[:6]}")
    with httpx.Client(
        base_url=service.url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    ) as client:
        yield client

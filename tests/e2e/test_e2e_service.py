"""End to end with real processes: `curvplan dev` (the `make run` command) and
`curvplan serve` + `curvplan worker`, a plan job over HTTP long-polled to `succeeded`."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import live_plugin
import pytest
from live_plugin import free_port
from sqlalchemy import text

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(240)]

CURVPLAN = [str(Path(sys.executable).with_name("curvplan"))]
if not Path(CURVPLAN[0]).exists():
    CURVPLAN = [sys.executable, "-c", "from curvplan.cli import main; main()"]


def plan_body(n_losses: int = 40) -> dict[str, Any]:
    """A plan job with enough per-sample losses for the Δ_k fit and a batch-size table."""
    losses = [0.5 + 0.4 * ((i * 37) % 23) / 23 for i in range(n_losses)]
    return {
        "kind": "plan",
        "name": f"e2e-{uuid.uuid4().hex[:6]}",
        "tags": {"suite": "e2e"},
        "measurements": {
            "per_sample_losses": losses,
            "loss_bound": 5.0,
            "hessian_norm_bound": 12.3,
            "steps_to_target": [
                {"batch_size": 32, "steps": 90000},
                {"batch_size": 64, "steps": 46000},
                {"batch_size": 256, "steps": 14000},
                {"batch_size": 1024, "steps": 6000},
            ],
        },
        "targets": {"tolerances": [0.05, 0.01], "radius": 0.1},
    }


def wait_until(predicate: Any, timeout: float, what: str, proc: Any = None) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited ({proc.returncode}) while waiting for {what}")
        try:
            value = predicate()
        except (httpx.TransportError, OSError):
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def expected_recommendation(request: dict[str, Any], seed: int) -> dict[str, Any]:
    """Oracle: the planner run in this process on the same validated input and seed."""
    from curvplan_core.planner import Measurements, Targets, make_plan

    measurements = Measurements.model_validate_json(json.dumps(request["measurements"]))
    targets = Targets.model_validate_json(json.dumps(request.get("targets") or {}))
    return make_plan(measurements, targets, seed=seed).model_dump(mode="json")


def submit_and_wait(
    base: str, key: str, operator_key: str | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """POST a plan job, long-poll it to a terminal status; return (job, submitted body)."""
    body = plan_body()
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=base, headers=headers, timeout=90) as client:
        created = client.post("/v1/jobs", json=body, headers={"Idempotency-Key": body["name"]})
        assert created.status_code == 202, created.text
        location = created.headers["location"]
        deadline = time.monotonic() + 120
        job = created.json()
        while job["status"] not in ("succeeded", "failed", "cancelled"):
            assert time.monotonic() < deadline, f"job stuck in {job['status']}"
            job = client.get(location, params={"wait": 30}).json()
        recommendation = client.get(f"{location}/recommendation")
        job["_recommendation_status"] = recommendation.status_code
        job["_recommendation"] = recommendation.json()
        if operator_key is not None:  # /v1/workers is an operator route
            workers = client.get("/v1/workers", headers={"Authorization": f"Bearer {operator_key}"})
            job["_workers"] = workers.json()["items"]
    return job, body


def check_succeeded(job: dict[str, Any], body: dict[str, Any]) -> None:
    assert job["status"] == "succeeded", job.get("error")
    assert job["attempt"] == 1 and job["progress"]["fraction"] == 1.0
    assert job["_recommendation_status"] == 200
    recommendation = job["_recommendation"]
    assert recommendation == job["result"]["recommendation"]
    assert recommendation == expected_recommendation(body, recommendation["seed"])
    assert recommendation["sample_size"]["status"] == "computed"


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 60) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(f"{proc.args} did not stop within {timeout}s") from None
    return proc.returncode


# --------------------------------------------------------------------------- serve + worker
@pytest.fixture(scope="module")
def database_url(pg_admin_url: str) -> Iterator[str]:
    """A migrated database of this module alone (overrides the session's shared one).

    Its worker claims every queued cpu job of its database, oldest first: on the shared one it
    also ran what other tests left queued (the API fuzzing left a plan job) before this test's
    own, within the same 120 s, and its reaper and collection acted on their rows."""
    with live_plugin.private_database(pg_admin_url, "curvplan_e2e") as url:
        yield url


@pytest.fixture
def e2e_key(database_url: str) -> Iterator[str]:
    from curvplan_core.credentials.keys import create_key
    from curvplan_core.db import make_engine, make_sessionmaker

    engine = make_engine(database_url)
    project = f"e2e-{uuid.uuid4().hex[:8]}"
    with make_sessionmaker(engine)() as session:
        key = create_key(session, project)
        session.commit()
    yield key
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM project WHERE name = :n"), {"n": project})
    engine.dispose()


@pytest.fixture
def e2e_operator_key(database_url: str) -> Iterator[str]:
    from curvplan_core.credentials.service_keys import create_service_key
    from curvplan_core.db import make_engine, make_sessionmaker

    engine = make_engine(database_url)
    name = f"e2e-operator-{uuid.uuid4().hex[:8]}"
    with make_sessionmaker(engine)() as session:
        key = create_service_key(session, ["workers:read"], name)
        session.commit()
    yield key
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM service_credential WHERE name = :n"), {"n": name})
    engine.dispose()


def test_serve_and_worker_run_a_plan_job(
    database_url: str, e2e_key: str, e2e_operator_key: str, tmp_path
) -> None:
    port = free_port()
    env = {**os.environ, "DATABASE_URL": database_url, "CURVPLAN_DATA_DIR": str(tmp_path)}
    logs = {name: (tmp_path / f"{name}.log").open("wb") for name in ("api", "worker")}
    api = subprocess.Popen(
        [*CURVPLAN, "serve", "--port", str(port)],
        env=env,
        stdout=logs["api"],
        stderr=subprocess.STDOUT,
    )
    worker = subprocess.Popen(
        [*CURVPLAN, "worker", "--queues", "cpu"],
        env=env,
        stdout=logs["worker"],
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: httpx.get(f"{base}/readyz").status_code == 200, 90, "/readyz", api)
        job, body = submit_and_wait(base, e2e_key, e2e_operator_key)
        check_succeeded(job, body)
        assert any(w["live"] and w["pid"] == worker.pid for w in job["_workers"])
        from curvplan_core.db import make_engine

        engine = make_engine(database_url)
        with engine.connect() as conn:
            attempts = conn.execute(
                text("SELECT attempt, outcome FROM job_attempt WHERE job_id = :id"),
                {"id": job["id"]},
            ).all()
        engine.dispose()
        assert [tuple(a) for a in attempts] == [(1, "succeeded")]
    finally:
        worker_rc = stop(worker)
        api_rc = stop(api)
        for f in logs.values():
            f.close()
    assert worker_rc == 0, (tmp_path / "worker.log").read_text()[-3000:]
    assert api_rc == 0, (tmp_path / "api.log").read_text()[-3000:]


# --------------------------------------------------------------------------- curvplan dev
@pytest.fixture
def dev_data_dir() -> Iterator[Path]:
    """A data dir the embedded server's unprivileged user can enter (pytest's tmp is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="curvplan-e2e-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_dev_command_embedded_postgres_end_to_end(dev_data_dir: Path) -> None:
    """`make run`'s command with DATABASE_URL unset: embedded PostgreSQL, dev key, a worker."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["CURVPLAN_DATA_DIR"] = str(dev_data_dir)
    log_path = dev_data_dir / "dev.log"
    with log_path.open("wb") as log:
        dev = subprocess.Popen(
            [*CURVPLAN, "dev", "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT
        )
        base = f"http://127.0.0.1:{port}"
        try:
            wait_until(lambda: httpx.get(f"{base}/readyz").status_code == 200, 120, "dev", dev)
            key = (dev_data_dir / "dev-api-key").read_text().strip()
            assert key in log_path.read_text()  # printed for the user
            job, body = submit_and_wait(base, key)
            check_succeeded(job, body)
            assert (dev_data_dir / "pg" / "postmaster.pid").exists()
        finally:
            rc = stop(dev, signal.SIGINT)  # what Ctrl-C sends
    output = log_path.read_text()
    assert rc in (0, 130), output[-3000:]
    # Ctrl-C stopped the worker and the embedded server too.
    assert not (dev_data_dir / "pg" / "postmaster.pid").exists(), output[-3000:]

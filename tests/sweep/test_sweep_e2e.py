"""A batch sweep end to end over HTTP: the parent fans out, real workers train the points,
and a worker SIGKILLed in the middle loses nothing and duplicates nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from live import Service, start_service, wait_terminal
from sqlalchemy import create_engine, text
from sweep_helpers import TINY_SPEC, api_key, counting_data

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def service(sweep_database: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    svc = start_service(sweep_database, tmp_path_factory.mktemp("sweep-e2e"))
    try:
        yield svc
    finally:
        svc.server.stop()
        svc.worker.stop()


@pytest.fixture(scope="module")
def client(service: Service) -> Iterator[httpx.Client]:
    key = api_key(service.database_url)
    with httpx.Client(
        base_url=service.url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    ) as c:
        yield c


def upload(client: httpx.Client, path: Path, kind: str) -> str:
    with path.open("rb") as fh:
        response = client.post(
            "/v1/artifacts",
            files={"file": (path.name, fh, "application/octet-stream")},
            data={"kind": kind},
        )
    assert response.status_code in (200, 201), response.text
    return response.json()["id"]


@pytest.fixture(scope="module")
def data_ids(client: httpx.Client, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from curvplan_worker.curvature.data import save_dataset

    out = tmp_path_factory.mktemp("sweep-files")
    save_dataset(counting_data(128, 0), out / "train.safetensors")
    save_dataset(counting_data(32, 1), out / "eval.safetensors")
    return {
        "train_data": upload(client, out / "train.safetensors", "dataset"),
        "eval_data": upload(client, out / "eval.safetensors", "dataset"),
    }


def _sweep_body(data_ids: dict[str, str]) -> dict[str, Any]:
    return {
        "kind": "sweep",
        "name": "tiny-batch-sweep",
        "model": TINY_SPEC,
        **data_ids,
        "optimizer": {"name": "adamw", "lr": 0.03, "base_batch_size": 8, "warmup_steps": 5},
        "sweep": {
            "type": "batch",
            "target_loss": 0.3,
            "batch_sizes": [4, 8, 16, 32],
            "max_steps": 400,
            "eval_every": 2,
        },
    }


def _job(client: httpx.Client, job_id: str) -> dict[str, Any]:
    response = client.get(f"/v1/jobs/{job_id}")
    response.raise_for_status()
    return response.json()


def test_sigkill_during_a_sweep_finishes_every_point_and_the_parent_exactly_once(
    client: httpx.Client, service: Service, data_ids: dict[str, str]
) -> None:
    response = client.post("/v1/jobs", json=_sweep_body(data_ids))
    assert response.status_code == 202, response.text
    parent_id = response.json()["id"]
    deadline = time.monotonic() + 120
    while True:  # kill while the parent waits and a point trains
        job = _job(client, parent_id)
        children = job.get("children") or []
        if any(c["status"] == "running" for c in children):
            break
        assert job["status"] in ("queued", "running"), (job, service.logs())
        assert time.monotonic() < deadline, service.logs()
        time.sleep(0.05)
    assert job["progress"]["stage"] == "waiting for children"
    assert job["progress"]["points_total"] == 4
    service.worker.kill()
    service.worker = service.new_worker("worker-2.log")
    done = wait_terminal(client, parent_id, timeout=240)
    assert done["status"] == "succeeded", (done["error"], service.logs())

    engine = create_engine(service.database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT j.id, j.parent_id, j.status, a.outcome FROM job j"
                    " JOIN job_attempt a ON a.job_id = j.id"
                    " WHERE j.id = :p OR j.parent_id = :p ORDER BY j.id, a.attempt"
                ),
                {"p": parent_id},
            ).all()
    finally:
        engine.dispose()
    by_job: dict[str, list[str]] = {}
    for row in rows:
        by_job.setdefault(str(row.id), []).append(row.outcome)
    assert len(by_job) == 5  # the parent and its four points, nothing duplicated
    for job_id, outcomes in by_job.items():
        assert outcomes.count("succeeded") == 1, (job_id, outcomes)
        assert outcomes[-1] == "succeeded"
    assert by_job[parent_id][0] == "fanned-out"
    assert by_job[parent_id].count("fanned-out") == 1  # the fan-out happened once

    sweep = done["result"]["sweep"]
    assert sweep["points_total"] == 4 and len(done["children"]) == 4
    assert {c["status"] for c in done["children"]} == {"succeeded"}
    used = [p for p in sweep["points"] if p["used_in_fit"]]
    steps = {p["result"]["batch_size"]: p["result"]["steps"] for p in used}
    assert len(steps) >= 3
    # More examples per step never needs more steps to the same loss (within noise).
    ordered = [steps[b] for b in sorted(steps)]
    assert ordered[0] > ordered[-1]
    fit = sweep["batch"]["fit"]
    assert fit["value"] > 0 and fit["s_min"] > 0
    assert sweep["b_simple_trend"], sweep

"""Worker limits on real analyses over HTTP (real ``curvplan serve`` and ``curvplan worker``
processes, real PostgreSQL, the real engine): a failed block group fails its analysis at once and
cancels the other group; cancel stops a running analysis within seconds; the cost estimate and
the ETA; an analysis that cannot fit the workers' memory or time is refused before it is queued,
naming why.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import live_plugin
import pytest
from live import Service, project_client, start_service, wait_terminal
from live_plugin import Proc
from sqlalchemy import create_engine, text

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SPEC: dict[str, Any] = {
    "d_model": 32,
    "n_heads": 2,
    "d_ff": 64,
    "n_layers": 1,
    "task": {"type": "causal_lm", "vocab_size": 16, "seq_len": 8},
}
# One block of ~2k products (exact trace), so the work lasts long enough to cancel or fail in.
SLOW: dict[str, Any] = {
    "precision": "float64",
    "seed": 3,
    "dense": "off",
    "tolerance": 1e-6,
    "max_iter": 80,
    "trace_probes": 5000,
    "off_diagonal": False,
    "per_sample": False,
    "gradient_noise": False,
    "bounds": False,
}
# A block of 262k parameters (ffn_in): thousands of products of milliseconds each.
WIDE_SPEC: dict[str, Any] = {**SPEC, "d_model": 256, "d_ff": 1024}
MEMORY_LIMIT = "4GiB"
TIME_LIMIT = 60.0  # analyze jobs; the fan-out's analyze_blocks children get an hour
# Workers as deployed: the default (short) cancel grace; fast polling and leases for a test.
WORKER_FLAGS = [
    "--lease-seconds",
    "2",
    "--heartbeat-seconds",
    "0.3",
    "--poll-interval",
    "0.1",
    "--shutdown-grace-seconds",
    "1",
]


@pytest.fixture(scope="module")
def database(pg_admin_url: str) -> Iterator[str]:
    with live_plugin.private_database(pg_admin_url, "curvplan_limits") as url:
        yield url


@pytest.fixture(scope="module")
def service(database: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    svc = start_service(
        database,
        tmp_path_factory.mktemp("limits-e2e"),
        CURVPLAN_WORKER_MEMORY_LIMIT=MEMORY_LIMIT,
        CURVPLAN_JOB_TIME_LIMITS=json.dumps({"analyze": TIME_LIMIT, "analyze_blocks": 3600}),
        CURVPLAN_MAX_ARTIFACT_BYTES=str(16 * 2**20),
    )
    # The service's own worker runs with the test flags above (the default cancel grace).
    svc.worker.stop()
    svc.worker = worker(svc, "worker-1.log")
    try:
        yield svc
    finally:
        svc.server.stop()
        svc.worker.stop()


def worker(svc: Service, log_name: str) -> Proc:
    proc = Proc(
        ["worker", "--queues", "gpu,cpu", *WORKER_FLAGS], svc.env, svc.data_dir.parent / log_name
    )
    proc.start()
    return proc


@pytest.fixture(scope="module")
def client(service: Service) -> Iterator[httpx.Client]:
    with project_client(service, "limits") as c:
        yield c


@pytest.fixture(scope="module")
def artifacts(client: httpx.Client, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    import torch
    from safetensors.torch import save_file

    from curvplan_worker.curvature.checkpoint import save_checkpoint
    from curvplan_worker.curvature.data import Dataset, save_dataset
    from curvplan_worker.curvature.model import build_model

    out = tmp_path_factory.mktemp("limits-files")
    save_checkpoint(build_model(SPEC, seed=1), out / "slow.safetensors")
    save_checkpoint(build_model(WIDE_SPEC, seed=1), out / "wide.safetensors")
    tokens = torch.randint(0, 16, (16, 9), generator=torch.Generator().manual_seed(0))
    save_dataset(Dataset(tokens[:, :-1], tokens[:, 1:]), out / "data.safetensors")
    save_file({"input_ids": tokens.contiguous()}, str(out / "hf_data.safetensors"))
    ids = {}
    for stem, kind in (
        ("slow", "checkpoint"),
        ("wide", "checkpoint"),
        ("data", "dataset"),
        ("hf_data", "dataset"),
    ):
        with (out / f"{stem}.safetensors").open("rb") as fh:
            response = client.post(
                "/v1/artifacts",
                files={"file": (fh.name, fh, "application/octet-stream")},
                data={"kind": kind},
            )
        assert response.status_code in (200, 201), response.text
        ids[stem] = response.json()["id"]
    return ids


def submit(client: httpx.Client, artifacts: dict[str, str], **fields: Any) -> dict[str, Any]:
    body = {
        "kind": "analyze",
        "model": SPEC,
        "checkpoint": artifacts["slow"],
        "dataset": artifacts["data"],
        "options": SLOW,
        "targets": {"tolerances": [0.05]},
        **fields,
    }
    response = client.post("/v1/jobs", json=body)
    assert response.status_code == 202, response.text
    return response.json()


def wait_stage(client: httpx.Client, job_id: str, prefix: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if ((job.get("progress") or {}).get("stage") or "").startswith(prefix):
            return job
        assert job["status"] in ("queued", "running"), job
        time.sleep(0.05)
    pytest.fail(f"job {job_id} never reached stage {prefix!r}")


def rows(service: Service, sql: str, **params: Any) -> list[Any]:
    engine = create_engine(service.database_url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(text(sql), params))
    finally:
        engine.dispose()


def test_cancel_stops_a_running_analysis_within_seconds_and_it_reported_an_eta(
    client: httpx.Client, service: Service, artifacts: dict[str, str]
) -> None:
    job = submit(
        client, artifacts, options={**SLOW, "blocks": ["layers.0.ffn_in"], "fan_out": False}
    )
    running = wait_stage(client, job["id"], "block spectra", timeout=120)
    eta = running["progress"].get("eta_seconds")
    assert eta is not None and eta > 0, running["progress"]  # ~2k products still to go
    time.sleep(0.5)
    asked = time.monotonic()
    assert client.post(f"/v1/jobs/{job['id']}/cancel").status_code == 202
    done = wait_terminal(client, job["id"], timeout=60)
    took = time.monotonic() - asked
    assert done["status"] == "cancelled", service.logs()
    # The goal is 2 s (heartbeat 0.3 s + one product + the long poll); generous for a busy box.
    assert took < 5.0, (took, service.logs())
    outcomes = rows(service, "SELECT outcome FROM job_attempt WHERE job_id = :id", id=job["id"])
    assert [r.outcome for r in outcomes] == ["cancelled"]


def test_the_cost_estimate_is_recorded_stage_by_stage(
    client: httpx.Client, service: Service, artifacts: dict[str, str]
) -> None:
    options = {**SLOW, "trace_probes": 20, "blocks": ["layers.0.q", "head"], "fan_out": False}
    done = wait_terminal(client, submit(client, artifacts, options=options)["id"], timeout=120)
    assert done["status"] == "succeeded", (done["error"], service.logs())
    measured = done["result"]["measurements"]
    estimate = measured["cost_estimate"]
    assert estimate["ms_source"] == "measured" and estimate["ms_per_product"] > 0
    assert [s["stage"] for s in estimate["stages"]] == ["blocks", "full_model"]
    blocks = estimate["stages"][0]
    assert set(blocks["items"]) == {"layers.0.q", "head"}
    # each block priced at its own warm product, timed before the spectra, and each of its
    # Lanczos products (all but the 20 trace probes) also at the iteration's own cost
    timing = measured["cost_inputs"]["spectra"]
    assert set(timing["item_ms"]) == set(timing["step_ms"]) == {"layers.0.q", "head"}
    assert blocks["item_seconds"] == pytest.approx(
        {
            k: (p * timing["item_ms"][k] + (p - 20) * timing["step_ms"][k]) / 1000
            for k, p in blocks["items"].items()
        }
    )
    # Prior products of a block: its Lanczos run (at most max_iter) plus the 20 trace probes.
    assert 20 < blocks["products"] <= 2 * (80 + 20) == blocks["worst_products"]
    actual = sum(b["n_products"] for b in measured["blocks"])
    assert actual <= blocks["worst_products"]
    assert estimate["first_eta_seconds"] is not None and "eta_relative_error" in estimate
    assert measured["cost_inputs"]["blocks"] == {
        b["name"]: b["n_params"] for b in measured["blocks"]
    }


def _refused(response: httpx.Response, error_type: str) -> dict[str, Any]:
    assert response.status_code == 422, response.text
    errors = {e["type"]: e for e in response.json()["errors"]}
    assert error_type in errors, errors
    assert errors[error_type]["field"] == "body.options"
    return errors[error_type]


def test_an_analysis_that_cannot_fit_the_workers_memory_is_refused_before_it_is_queued(
    client: httpx.Client, service: Service, artifacts: dict[str, str]
) -> None:
    """The API knows the workers' limit (CURVPLAN_WORKER_MEMORY_LIMIT, set for both): a model
    whose parameters and bounded Lanczos basis alone exceed it is a 422, nothing queued. (The
    worker's own check at its first step stays for what only a measured product shows.)"""
    # a Hugging Face config names its 1.3 B parameters without a checkpoint: 19 GiB of
    # weights, gradient and product vectors alone
    big = {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "n_embd": 2048,
        "n_layer": 24,
        "n_head": 16,
        "n_positions": 64,
    }
    count = len(rows(service, "SELECT id FROM job"))
    error = _refused(
        client.post(
            "/v1/jobs",
            json={
                "kind": "analyze",
                "model": {"source": "huggingface", "config": big},
                "checkpoint": artifacts["slow"],
                "dataset": artifacts["hf_data"],
            },
        ),
        "too-large",
    )
    assert "Lanczos basis" in error["message"] and "GiB" in error["message"]
    assert "4.00 GiB (CURVPLAN_WORKER_MEMORY_LIMIT)" in error["message"]
    assert len(rows(service, "SELECT id FROM job")) == count  # nothing queued


def test_an_analysis_estimated_past_its_time_limit_is_refused_naming_the_estimate(
    client: httpx.Client, service: Service, artifacts: dict[str, str]
) -> None:
    # Every block of the wide model traced with 10k products: tens of thousands of products of
    # milliseconds each (at the prior), far past the 60 s limit.
    options = {**SLOW, "trace_probes": 10000, "fan_out": False}
    count = len(rows(service, "SELECT id FROM job"))
    error = _refused(
        client.post(
            "/v1/jobs",
            json={
                "kind": "analyze",
                "model": WIDE_SPEC,
                "checkpoint": artifacts["wide"],
                "dataset": artifacts["data"],
                "options": options,
            },
        ),
        "over-time-limit",
    )
    assert "products ×" in error["message"] and "ms per product" in error["message"]
    assert f"{TIME_LIMIT:g} s limit" in error["message"]
    for option in ("max_iter", "tolerance", "blocks", "trace_probes"):
        assert option in error["message"], error["message"]
    assert len(rows(service, "SELECT id FROM job")) == count  # nothing queued


def test_a_failed_block_group_fails_its_analysis_at_once_and_cancels_the_other_group(
    client: httpx.Client, service: Service, artifacts: dict[str, str]
) -> None:
    """Two workers; the slow group runs on the first while the second group is made to fail
    (its request names an unknown block, as a hand-edited row would): the analysis fails as soon
    as that child fails, and the running group is cancelled instead of running to its end."""
    second = worker(service, "worker-2.log")
    deadline = time.monotonic() + 120
    while len(rows(service, "SELECT id FROM worker WHERE status = 'running'")) < 2:
        assert time.monotonic() < deadline, second.tail()
        time.sleep(0.1)
    # Registered, then paused: the first worker takes the slow group (the first child).
    assert second.proc is not None
    second.proc.send_signal(signal.SIGSTOP)
    try:
        # The wide model's ffn_in block traced with 5000 products: minutes of work.
        options = {
            **SLOW,
            "blocks": ["layers.0.ffn_in", "head"],
            "fan_out": True,
            "fan_out_groups": 2,
        }
        parent = submit(
            client, artifacts, model=WIDE_SPEC, checkpoint=artifacts["wide"], options=options
        )
        deadline = time.monotonic() + 120
        while True:
            children = rows(
                service,
                "SELECT id, status, request FROM job WHERE parent_id = :p ORDER BY created_at, id",
                p=parent["id"],
            )
            if len(children) == 2 and children[0].status == "running":
                break
            assert time.monotonic() < deadline, service.logs()
            time.sleep(0.05)
        slow, doomed = children
        assert doomed.status == "queued"
        broken = {**doomed.request, "blocks": ["no.such.block"]}
        engine = create_engine(service.database_url)
        try:
            with engine.begin() as conn:
                conn.execute(
                    text("UPDATE job SET request = CAST(:r AS jsonb) WHERE id = :id"),
                    {"r": json.dumps(broken), "id": doomed.id},
                )
        finally:
            engine.dispose()
    finally:
        second.proc.send_signal(signal.SIGCONT)
    try:
        done = wait_terminal(client, parent["id"], timeout=120)
        failed_at = time.monotonic()
        assert done["status"] == "failed", (done, service.logs())
        error = done["error"]
        assert error["type"] == "block-group-failed", error
        assert str(doomed.id) in error["detail"] and "invalid-options" in error["detail"]
        assert "1 other child job(s) cancelled" in error["detail"]
        sibling = wait_terminal(client, str(slow.id), timeout=30)
        assert sibling["status"] == "cancelled", sibling
        assert time.monotonic() - failed_at < 10  # cancelled, not run through its 5k products
        outcomes = rows(service, "SELECT outcome FROM job_attempt WHERE job_id = :id", id=slow.id)
        assert [r.outcome for r in outcomes] == ["cancelled"]
        # The parent never ran an attempt: fanned out at submission, failed before its fan-in.
        attempts = rows(
            service, "SELECT outcome FROM job_attempt WHERE job_id = :id", id=parent["id"]
        )
        assert attempts == [] and done["attempt"] == 0
    finally:
        second.stop()


def test_worker_logs_have_no_traceback(service: Service) -> None:
    logs = Path(service.data_dir.parent / "worker-1.log").read_text(errors="replace")
    assert "Traceback" not in logs, logs[-4000:]

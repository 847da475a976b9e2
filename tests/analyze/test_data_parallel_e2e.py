"""Several devices per job, end to end: a worker with ``--devices 2`` (CURVPLAN_WORKER_DEVICES),
analyze jobs with ``resources.devices = 2`` on 2 gloo ranks (one thread each), real processes.

A rank SIGKILLed in the middle of the block spectra fails the attempt as a crash: every rank of
the attempt is gone, the job is retried whole and succeeds, and its spectra equal those of the
same job on one device (fp64, 1e-10).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import live_plugin
import pytest
from live import Service, project_client, start_service, wait_terminal
from record_compare import assert_records_close
from sqlalchemy import create_engine, text

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

SPEC: dict[str, Any] = {
    "d_model": 32,
    "n_heads": 2,
    "d_ff": 64,
    "n_layers": 1,
    "task": {"type": "causal_lm", "vocab_size": 16, "seq_len": 8},
}
OPTIONS: dict[str, Any] = {
    "precision": "float64",
    "seed": 3,
    "dense": "off",
    "tolerance": 1e-8,
    "max_iter": 60,
    "trace_probes": 150,
    "blocks": ["layers.0.q", "layers.0.ffn_in", "head"],
    "off_diagonal": [["layers.0.q", "layers.0.ffn_in"]],
    "eval_batch_size": 4,
    "hessian_subsample": 2,
    "per_sample_max_iter": 20,
    "n_directions": 2,
    "gradient_noise": False,
    "fan_out": False,  # one job on its ranks (block fan-out with ranks: test_analyze_e2e.py)
}
RANK_MODULE = b"curvplan_worker.analyze.ranks"


@pytest.fixture(scope="module")
def service(pg_admin_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with live_plugin.private_database(pg_admin_url, "curvplan_dp") as url:
        svc = start_service(
            url,
            tmp_path_factory.mktemp("dp-e2e"),
            CURVPLAN_WORKER_DEVICES="2",
            CURVPLAN_MAX_JOB_DEVICES="4",
        )
        try:
            yield svc
        finally:
            svc.server.stop()
            svc.worker.stop()


@pytest.fixture(scope="module")
def client(service: Service) -> Iterator[httpx.Client]:
    with project_client(service, "dp") as c:
        yield c


@pytest.fixture(scope="module")
def inputs(client: httpx.Client, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    import torch

    from curvplan_worker.curvature.checkpoint import save_checkpoint
    from curvplan_worker.curvature.data import Dataset, save_dataset
    from curvplan_worker.curvature.model import build_model

    out = tmp_path_factory.mktemp("dp-files")
    save_checkpoint(build_model(SPEC, seed=1), out / "checkpoint.safetensors")
    tokens = torch.randint(0, 16, (16, 9), generator=torch.Generator().manual_seed(0))
    save_dataset(Dataset(tokens[:, :-1], tokens[:, 1:]), out / "data.safetensors")
    return {
        "checkpoint": _upload(client, out / "checkpoint.safetensors", "checkpoint"),
        "dataset": _upload(client, out / "data.safetensors", "dataset"),
    }


def _upload(client: httpx.Client, path: Path, kind: str) -> str:
    with path.open("rb") as fh:
        response = client.post(
            "/v1/artifacts",
            files={"file": (path.name, fh, "application/octet-stream")},
            data={"kind": kind},
        )
    assert response.status_code in (200, 201), response.text
    return str(response.json()["id"])


def _body(inputs: dict[str, str], devices: int | None) -> dict[str, Any]:
    body: dict[str, Any] = {"kind": "analyze", "model": SPEC, "options": OPTIONS, **inputs}
    if devices is not None:
        body["resources"] = {"devices": devices}
    return body


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _ranks_of(worker_pid: int) -> list[int]:
    """Pids of the data-parallel rank processes descending from the worker."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if RANK_MODULE not in cmdline:
            continue
        pid, ancestor = int(entry), int(entry)
        while ancestor not in (None, 0, 1) and ancestor != worker_pid:
            ancestor = _parent(ancestor)  # type: ignore[assignment]
        if ancestor == worker_pid:
            found.append(pid)
    return found


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def _ranks_in_block_spectra(client: httpx.Client, service: Service, job_id: str) -> list[int]:
    """Wait until the job measures its block spectra on its ranks; their pids."""
    assert service.worker.proc is not None
    worker_pid = service.worker.proc.pid
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        stage = (client.get(f"/v1/jobs/{job_id}").json().get("progress") or {}).get("stage")
        ranks = _ranks_of(worker_pid)
        if stage and stage.startswith("block spectra") and ranks:
            return ranks
        time.sleep(0.05)
    pytest.fail("the 2-device job never reached its block spectra:\n" + service.logs())


def test_more_devices_than_the_service_allows_is_a_422_naming_the_field(
    client: httpx.Client, inputs: dict[str, str]
) -> None:
    response = client.post("/v1/jobs", json=_body(inputs, 5))
    assert response.status_code == 422, response.text
    assert [e["field"] for e in response.json()["errors"]] == ["body.resources.devices"]
    response = client.post("/v1/jobs", json=_body(inputs, 0))
    assert response.status_code == 422, response.text
    assert "resources" in response.json()["errors"][0]["field"]


@pytest.mark.slow
def test_a_killed_rank_fails_the_attempt_and_the_job_is_retried_whole(
    client: httpx.Client, service: Service, inputs: dict[str, str]
) -> None:
    started = time.monotonic()
    response = client.post("/v1/jobs", json=_body(inputs, 2))
    assert response.status_code == 202, response.text
    job = response.json()
    assert job["request"]["resources"] == {"devices": 2}
    single = client.post("/v1/jobs", json=_body(inputs, None)).json()  # runs after it
    ranks = _ranks_in_block_spectra(client, service, job["id"])
    assert len(ranks) == 1  # world size 2: rank 0 is the attempt process itself
    rank_zero = _parent(ranks[0])
    assert rank_zero is not None
    os.kill(ranks[0], signal.SIGKILL)

    done = wait_terminal(client, job["id"], timeout=90)
    assert done["status"] == "succeeded", (done["error"], service.logs())
    assert done["attempt"] == 2
    assert _gone(ranks[0]) and _gone(rank_zero)  # no rank outlived its attempt
    engine = create_engine(service.database_url)
    try:
        with engine.connect() as conn:
            outcomes = conn.execute(
                text("SELECT outcome FROM job_attempt WHERE job_id = :id ORDER BY attempt"),
                {"id": job["id"]},
            ).scalars()
            assert list(outcomes) == ["crashed", "succeeded"]
    finally:
        engine.dispose()
    assert "a data-parallel rank of the job died" in service.worker.tail(200_000)
    measured = done["result"]["measurements"]
    assert measured["data_parallel"] == {"world_size": 2, "backend": "gloo"}

    reference = wait_terminal(client, single["id"], timeout=60)
    assert reference["status"] == "succeeded", (reference["error"], service.logs())
    expected = reference["result"]["measurements"]
    assert "data_parallel" not in expected
    assert measured["loss"] == pytest.approx(expected["loss"], rel=1e-12)
    pairs = zip(measured["blocks"], expected["blocks"], strict=True)
    for got, want in pairs:
        assert got["name"] == want["name"]
        scale = max(abs(want["lambda_max"]), abs(want["lambda_min"]))
        for key in ("lambda_max", "lambda_min"):
            assert abs(got[key] - want[key]) <= 1e-10 * scale, (want["name"], key)
        assert got["trace"]["value"] == pytest.approx(want["trace"]["value"], rel=1e-10)
    got_off, want_off = measured["off_diagonal"][0], expected["off_diagonal"][0]
    assert got_off["sigma_max"] == pytest.approx(want_off["sigma_max"], rel=1e-10)
    assert time.monotonic() - started < 60


@pytest.mark.slow
def test_a_block_fan_out_of_a_two_device_job_runs_every_child_on_two_ranks(
    client: httpx.Client, service: Service, inputs: dict[str, str]
) -> None:
    """Each child and the fan-in run on the job's 2 ranks with the same share of the work on
    every rank (a mismatch would hang the collectives); the assembled blocks equal the same
    2-device job run as one process, to the rounding of the batched products."""
    light = {
        **OPTIONS,
        "blocks": ["layers.0.q", "head"],
        "off_diagonal": [["layers.0.q", "head"]],
        "trace_probes": 4,
        "max_iter": 12,
        "tolerance": 1e-6,
        "per_sample": False,
        "bounds": False,
    }
    fanned = client.post(
        "/v1/jobs",
        json={**_body(inputs, 2), "options": {**light, "fan_out": True, "fan_out_groups": 2}},
    ).json()
    single = client.post("/v1/jobs", json={**_body(inputs, 2), "options": light}).json()
    done = wait_terminal(client, fanned["id"], timeout=90)
    reference = wait_terminal(client, single["id"], timeout=60)
    assert done["status"] == "succeeded", (done["error"], service.logs())
    assert reference["status"] == "succeeded", (reference["error"], service.logs())
    got, want = done["result"]["measurements"], reference["result"]["measurements"]
    assert got["data_parallel"] == want["data_parallel"] == {"world_size": 2, "backend": "gloo"}
    # batched lockstep products may differ in their last bits with the batch's width
    # (docs/numerics.md#lockstep): floats to 1e-8 relative (residuals at the rounding level,
    # ~1e-14, to 1e-12 absolute), everything else exactly
    assert_records_close(got["blocks"], want["blocks"], "blocks")
    assert_records_close(got["off_diagonal"], want["off_diagonal"], "off_diagonal")
    children = client.get(f"/v1/jobs/{fanned['id']}").json()
    assert [c["status"] for c in children["children"]] == ["succeeded", "succeeded"]
    for child in children["children"]:
        request = client.get(f"/v1/jobs/{child['id']}").json()["request"]
        assert request["resources"] == {"devices": 2}


@pytest.mark.slow
def test_cancelling_a_two_device_job_ends_every_rank(
    client: httpx.Client, service: Service, inputs: dict[str, str]
) -> None:
    """Cancel reaches a job running on its ranks: the job ends ``cancelled`` (no retry), and
    neither rank 0 (the attempt process) nor the other rank outlives it."""
    job = client.post("/v1/jobs", json=_body(inputs, 2)).json()
    ranks = _ranks_in_block_spectra(client, service, job["id"])
    rank_zero = _parent(ranks[0])
    assert rank_zero is not None
    response = client.post(f"/v1/jobs/{job['id']}/cancel")
    assert response.status_code in (200, 202), response.text
    done = wait_terminal(client, job["id"], timeout=60)
    assert done["status"] == "cancelled", (done["error"], service.logs())
    assert done["attempt"] == 1
    deadline = time.monotonic() + 10
    while not (_gone(ranks[0]) and _gone(rank_zero)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(ranks[0]) and _gone(rank_zero)
    assert service.worker.proc is not None
    assert _ranks_of(service.worker.proc.pid) == []

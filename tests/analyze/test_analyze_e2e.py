"""Analyze jobs end to end over HTTP: real ``curvplan serve`` + ``curvplan worker`` processes,
real PostgreSQL, the real curvature engine on a tiny Transformer."""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import live_plugin
import numpy as np
import pytest
from live import Service, start_service, wait_terminal
from record_compare import assert_records_close
from sqlalchemy import create_engine, text

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SPEC: dict[str, Any] = {
    "d_model": 8,
    "n_heads": 2,
    "d_ff": 16,
    "n_layers": 1,
    "task": {"type": "causal_lm", "vocab_size": 11, "seq_len": 6},
}
# Small enough for a shared 2-core machine; float64 so the comparison is tight.
OPTIONS: dict[str, Any] = {
    "precision": "float64",
    "seed": 3,
    "dense": "off",
    "tolerance": 1e-6,
    "max_iter": 80,
    "trace_probes": 9,
    "off_diagonal": [["layers.0.q", "layers.0.k"]],
    "hessian_subsample": 2,
    "per_sample_max_iter": 40,
    "n_directions": 3,
    "perturbation_radius": 0.05,
    "gradient_noise": False,
}
# A wider model whose blocks cost a predictable ~1k-2k Hessian products each (exact traces:
# trace_probes above the block size), so that cancel and kill land in the middle of the work.
SLOW_SPEC: dict[str, Any] = {
    "d_model": 32,
    "n_heads": 2,
    "d_ff": 64,
    "n_layers": 1,
    "task": {"type": "causal_lm", "vocab_size": 16, "seq_len": 8},
}
# One process measures every block (no fan-out): cancel and kill land in its block loops.
SLOW_OPTIONS: dict[str, Any] = {
    **OPTIONS,
    "trace_probes": 5000,
    "off_diagonal": False,
    "fan_out": False,
}
TARGETS: dict[str, Any] = {"tolerances": [0.05], "radius": 0.05, "orderings": 8, "bootstrap": 20}
N_EXAMPLES = 12


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def e2e_database(pg_admin_url: str) -> Iterator[str]:
    """A migrated database of this module alone (its worker claims every gpu job in it)."""
    with live_plugin.private_database(pg_admin_url, "curvplan_analyze") as url:
        yield url


@pytest.fixture(scope="module")
def service(e2e_database: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    svc = start_service(e2e_database, tmp_path_factory.mktemp("analyze-e2e"))
    try:
        yield svc
    finally:
        svc.server.stop()
        svc.worker.stop()


def _key(database_url: str, project: str) -> str:
    from curvplan_core.credentials.keys import create_key
    from curvplan_core.db import make_engine, make_sessionmaker

    engine = make_engine(database_url)
    try:
        with make_sessionmaker(engine)() as session:
            key = create_key(session, project)
            session.commit()
    finally:
        engine.dispose()
    return key


@pytest.fixture(scope="module")
def client(service: Service) -> Iterator[httpx.Client]:
    key = _key(service.database_url, f"analyze-{uuid.uuid4().hex[:6]}")
    with httpx.Client(
        base_url=service.url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    ) as c:
        yield c


@pytest.fixture(scope="module")
def other_client(service: Service) -> Iterator[httpx.Client]:
    key = _key(service.database_url, f"other-{uuid.uuid4().hex[:6]}")
    with httpx.Client(
        base_url=service.url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    ) as c:
        yield c


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Checkpoints and samples written with the engine's own writers."""
    import torch

    from curvplan_worker.curvature.checkpoint import save_checkpoint
    from curvplan_worker.curvature.data import Dataset, save_dataset
    from curvplan_worker.curvature.model import build_model

    out = tmp_path_factory.mktemp("analyze-files")
    save_checkpoint(build_model(SPEC, seed=1), out / "checkpoint.safetensors")
    save_checkpoint(build_model(SPEC, seed=2), out / "intermediate.safetensors")
    wider = {**SPEC, "d_model": 12}
    save_checkpoint(build_model(wider, seed=1), out / "wider.safetensors")
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 11, (N_EXAMPLES, 7), generator=gen)
    save_dataset(Dataset(tokens[:, :-1], tokens[:, 1:]), out / "data.safetensors")
    floats = torch.randn(N_EXAMPLES, 6, generator=gen)
    save_checkpoint(build_model(SLOW_SPEC, seed=1), out / "slow-checkpoint.safetensors")
    slow_tokens = torch.randint(0, 16, (16, 9), generator=gen)
    save_dataset(Dataset(slow_tokens[:, :-1], slow_tokens[:, 1:]), out / "slow-data.safetensors")
    save_dataset(Dataset(floats, tokens[:, 1:]), out / "float-inputs.safetensors")
    return {p.stem: p for p in out.iterdir()}


def upload(client: httpx.Client, path: Path, kind: str) -> str:
    with path.open("rb") as fh:
        response = client.post(
            "/v1/artifacts",
            files={"file": (path.name, fh, "application/octet-stream")},
            data={"kind": kind},
        )
    assert response.status_code in (200, 201), response.text
    return response.json()["id"]


def submit(client: httpx.Client, **fields: Any) -> dict[str, Any]:
    body = {
        "kind": "analyze",
        "name": "tiny-lm",
        "tags": {"suite": "analyze-e2e"},
        "model": SPEC,
        "options": OPTIONS,
        "targets": TARGETS,
        **fields,
    }
    response = client.post("/v1/jobs", json=body)
    assert response.status_code == 202, response.text
    return response.json()


def _engine(service: Service) -> Any:
    return create_engine(service.database_url)


# --------------------------------------------------------------------------- tests
@pytest.mark.slow
def test_analyze_over_http_matches_the_engine_and_plans(
    client: httpx.Client, service: Service, files: dict[str, Path]
) -> None:
    from curvplan_worker.curvature import analyze as curvature_analysis

    ckpt = upload(client, files["checkpoint"], "checkpoint")
    data = upload(client, files["data"], "dataset")
    intermediate = upload(client, files["intermediate"], "checkpoint")
    job = submit(client, checkpoint=ckpt, dataset=data, intermediate_checkpoints=[intermediate])
    assert (job["queue"], job["status"]) == ("gpu", "queued")
    done = wait_terminal(client, job["id"], timeout=150)
    assert done["status"] == "succeeded", (done["error"], service.logs())
    assert done["progress"]["stage"] == "planning"
    result = done["result"]

    # Block spectra equal the engine's direct output for the same seed and options.
    direct = curvature_analysis.analyze(
        SPEC,
        str(files["checkpoint"]),
        str(files["data"]),
        {**OPTIONS, "per_sample": False, "bounds": False},
    )
    measured = {b["name"]: b for b in result["measurements"]["blocks"]}
    assert list(measured) == [b["name"] for b in direct["blocks"]]
    for block in direct["blocks"]:
        got = measured[block["name"]]
        for key in ("lambda_max", "lambda_min", "spectral_norm"):
            assert got[key] == pytest.approx(block[key], rel=1e-6, abs=1e-10), block["name"]
        assert got["trace"]["value"] == pytest.approx(block["trace"]["value"], rel=1e-6, abs=1e-10)
    # The memory plan and the peak memory are in the result (a CPU worker: its RSS).
    plan = result["measurements"]["memory_plan"]
    assert plan["source"] == "saved-tensors" and plan["per_example_bytes"] > 0
    assert result["peak_memory_source"] == "process-max-rss"
    assert result["peak_memory_bytes"] >= result["measurements"]["peak_memory_bytes"] > 2**20
    off = result["measurements"]["off_diagonal"][0]
    assert off["sigma_max"] == pytest.approx(direct["off_diagonal"][0]["sigma_max"], rel=1e-6)

    # Bulky arrays are artifacts of the job, referenced from the result, not inline.
    per_sample = result["measurements"]["per_sample"]
    assert per_sample["losses"] == {
        "artifact": "per_sample_losses",
        "tensor": "per_sample.losses",
        "shape": [N_EXAMPLES],
    }
    listed = client.get("/v1/artifacts", params={"job_id": job["id"]}).json()["items"]
    by_name = {a["name"]: a for a in listed}
    assert set(by_name) == set(result["artifacts"]) >= {"per_sample_losses", "perturbed_losses"}
    assert all(a["kind"] == "job-output" and a["job_id"] == job["id"] for a in listed)
    content = client.get(f"/v1/artifacts/{result['artifacts']['per_sample_losses']}/content")
    from safetensors.numpy import load as st_load

    losses = st_load(content.content)["per_sample.losses"]
    assert losses.shape == (N_EXAMPLES,)
    assert float(np.mean(losses)) == pytest.approx(direct["loss"], rel=1e-9)

    # Every section the inputs support: sample size (losses, perturbed losses, M, radius),
    # batch size (gradient noise at the intermediate checkpoint), curvature (blocks).
    recommendation = client.get(f"/v1/jobs/{job['id']}/recommendation").json()
    assert recommendation == result["recommendation"]
    assert recommendation["sample_size"]["status"] == "computed"
    assert recommendation["sample_size"]["n_losses"] == N_EXAMPLES
    tolerance = recommendation["sample_size"]["per_tolerance"][0]
    assert tolerance["theoretical"].get("status") != "not_computed", tolerance
    assert recommendation["batch_size"]["status"] == "computed"
    assert recommendation["curvature"]["status"] == "computed"
    assert recommendation["scaling"]["status"] == "not_computed"  # no loss_vs_data given
    # No data sweep: no training-set size, the sweep command instead; the evaluation-set size
    # beside it; the sharpness threshold from the whole-model λ_max the analysis measured.
    data = recommendation["budget"]["data"]
    assert data["source"] == "not_available" and data["recommended_examples"] is None
    assert data["next_step"]["command"].startswith("curvplan sweep --type data")
    assert data["evaluation_set_size"]["examples"] == tolerance["evaluation_set_size"]["k"]
    full = result["measurements"]["full_model"]
    assert full["available"] and full["n_products"] > 0
    lr = recommendation["budget"]["learning_rate"]
    assert lr["gd_sharpness_threshold"] == pytest.approx(2 / full["lambda_max"])
    assert lr["block_threshold"] >= lr["gd_sharpness_threshold"]
    noise = result["intermediate_gradient_noise"]
    assert [n["checkpoint_artifact"] for n in noise] == [intermediate]
    # named as the user gave it (the uploaded file; no step in its metadata), not by its id
    assert [n["checkpoint"] for n in noise] == ["intermediate.safetensors"]
    trend = recommendation["batch_size"]["trend"]
    assert [t["checkpoint"] for t in trend] == ["intermediate.safetensors"]

    # Re-plan the finished analysis with other targets (a plain plan job on the cpu queue).
    replan = client.post(
        "/v1/jobs",
        json={
            "kind": "plan",
            "name": "tiny-lm",
            "from_job": job["id"],
            "targets": {**TARGETS, "tolerances": [0.2, 0.1]},
        },
    )
    assert replan.status_code == 202, replan.text
    assert replan.json()["queue"] == "cpu"
    copied = replan.json()["request"]["measurements"]
    assert copied["per_sample_losses"] == pytest.approx(losses.tolist(), rel=1e-12)
    assert len(copied["perturbed_losses"]["losses"]) == OPTIONS["n_directions"]
    assert copied["blocks"] == result["planner_inputs"]["fields"]["blocks"]
    replanned = wait_terminal(client, replan.json()["id"], timeout=60)
    assert replanned["status"] == "succeeded", (replanned["error"], service.logs())
    new = replanned["result"]["recommendation"]["sample_size"]["per_tolerance"]
    assert [t["tolerance"] for t in new] == [0.2, 0.1]
    latest = client.get("/v1/recommendations", params={"name": "tiny-lm"}).json()["items"]
    assert [item["job_id"] for item in latest] == [replan.json()["id"]]

    # With the analysis's own targets and the seed its plan states, the re-plan is that plan:
    # the measurements read back from the stored fields and artifacts are the ones it used.
    same = client.post(
        "/v1/jobs",
        json={
            "kind": "plan",
            "from_job": job["id"],
            "targets": {**TARGETS, "seed": recommendation["seed"]},
        },
    )
    assert same.status_code == 202, same.text
    again = wait_terminal(client, same.json()["id"], timeout=60)
    assert again["status"] == "succeeded", (again["error"], service.logs())
    assert _flagless(again["result"]["recommendation"]) == _flagless(recommendation)


def _flagless(recommendation: dict[str, Any]) -> dict[str, Any]:
    """The recommendation without the next-step command's file flags: an analysis's
    commands name its uploaded files, a plan job's (no model, no data) the placeholders."""
    out = copy.deepcopy(recommendation)
    step = out["budget"]["data"]["next_step"]
    assert step["command"].startswith("curvplan sweep --type data"), step
    del step["command"], step["estimated_cost"]
    return out


def test_checkpoint_that_does_not_match_the_spec_fails_naming_the_tensor(
    client: httpx.Client, service: Service, files: dict[str, Path]
) -> None:
    job = submit(
        client,
        checkpoint=upload(client, files["wider"], "checkpoint"),
        dataset=upload(client, files["data"], "dataset"),
    )
    done = wait_terminal(client, job["id"], timeout=60)
    assert done["status"] == "failed", service.logs()
    assert done["error"]["type"] == "checkpoint-mismatch"
    assert "embed.weight" in done["error"]["detail"]
    assert "(11, 8)" in done["error"]["detail"] and "(11, 12)" in done["error"]["detail"]
    assert "Traceback" not in str(done["error"])
    assert done["attempt"] == 1  # a diagnosed error is not retried


def test_float_inputs_for_a_causal_lm_fail_naming_the_tensor(
    client: httpx.Client, service: Service, files: dict[str, Path]
) -> None:
    job = submit(
        client,
        checkpoint=upload(client, files["checkpoint"], "checkpoint"),
        dataset=upload(client, files["float-inputs"], "dataset"),
    )
    done = wait_terminal(client, job["id"], timeout=60)
    assert done["status"] == "failed", service.logs()
    assert done["error"]["type"] == "dataset-mismatch"
    assert "'inputs'" in done["error"]["detail"] and "int64" in done["error"]["detail"]


def test_replan_refuses_unfinished_foreign_and_non_analyze_jobs(
    client: httpx.Client, other_client: httpx.Client, files: dict[str, Path]
) -> None:
    failed = submit(
        client,
        checkpoint=upload(client, files["wider"], "checkpoint"),
        dataset=upload(client, files["data"], "dataset"),
    )
    wait_terminal(client, failed["id"], timeout=60)
    response = client.post("/v1/jobs", json={"kind": "plan", "from_job": failed["id"]})
    assert response.status_code == 409, response.text
    assert response.json()["job_status"] == "failed"
    foreign = other_client.post("/v1/jobs", json={"kind": "plan", "from_job": failed["id"]})
    assert foreign.status_code == 422
    assert [e["field"] for e in foreign.json()["errors"]] == ["body.from_job"]
    both = client.post(
        "/v1/jobs",
        json={"kind": "plan", "from_job": failed["id"], "measurements": {"loss_bound": 1.0}},
    )
    assert [e["field"] for e in both.json()["errors"]] == ["body.measurements"]


def test_file_uri_artifacts_are_validated_when_the_job_starts(
    client: httpx.Client, service: Service, files: dict[str, Path]
) -> None:
    import pickle

    root = service.data_dir / "files"  # the service's configured file:// root
    fake = root / f"checkpoint-{uuid.uuid4().hex[:6]}.safetensors"
    fake.write_bytes(pickle.dumps({"embed.weight": [0.0] * 88}))
    data = upload(client, files["data"], "dataset")
    outcomes = {}
    for label, uri in (("pickle", fake.as_uri()), ("missing", (root / "nope").as_uri())):
        registered = client.post("/v1/artifacts", json={"kind": "checkpoint", "uri": uri})
        assert registered.status_code == 201, registered.text
        job = submit(client, checkpoint=registered.json()["id"], dataset=data)
        outcomes[label] = wait_terminal(client, job["id"], timeout=60)
    assert outcomes["pickle"]["status"] == "failed"
    assert outcomes["pickle"]["error"]["type"] == "invalid-artifact"
    detail = outcomes["pickle"]["error"]["detail"]
    assert detail.startswith("checkpoint: ") and "not a valid safetensors" in detail
    assert "pickle" not in detail  # what the file holds stays in the worker's log
    assert outcomes["missing"]["error"]["type"] == "artifact-unreadable"


def test_another_projects_artifacts_cannot_be_used(
    client: httpx.Client, other_client: httpx.Client, files: dict[str, Path]
) -> None:
    theirs = upload(other_client, files["checkpoint"], "checkpoint")
    mine = upload(client, files["data"], "dataset")
    response = client.post(
        "/v1/jobs",
        json={"kind": "analyze", "model": SPEC, "checkpoint": theirs, "dataset": mine},
    )
    assert response.status_code == 422
    assert [e["field"] for e in response.json()["errors"]] == ["body.checkpoint"]
    assert client.get(f"/v1/artifacts/{theirs}").status_code == 404


def _block_index(stage: str) -> int | None:
    if stage.startswith("block spectra "):
        return int(stage.split()[-1].split("/")[0])
    return None


def _wait_for_block_spectra(client: httpx.Client, job_id: str, service: Service) -> int:
    """Poll until the job reports a ``block spectra i/n`` stage; return i."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        current = client.get(f"/v1/jobs/{job_id}").json()
        index = _block_index((current.get("progress") or {}).get("stage") or "")
        if index is not None:
            return index
        assert current["status"] in ("queued", "running"), current
        time.sleep(0.02)
    pytest.fail("the analysis never reached block spectra:\n" + service.logs())


def test_cancel_stops_inside_a_block_without_the_workers_kill(
    client: httpx.Client, service: Service, files: dict[str, Path]
) -> None:
    """One block of ~2k Hessian products (a minute or more of CPU here): cancel lands inside it,
    and the engine's loops stop within about one product, long before the block would end and
    long before the worker's kill after --cancel-grace-seconds 60."""
    job = submit(
        client,
        model=SLOW_SPEC,
        checkpoint=upload(client, files["slow-checkpoint"], "checkpoint"),
        dataset=upload(client, files["slow-data"], "dataset"),
        options={**SLOW_OPTIONS, "blocks": ["layers.0.ffn_in"]},
    )
    # the blocks run in lockstep: "block spectra 0/1" while none is certified yet; on a loaded
    # machine the first poll may already see the planning-grade Lanczos certified ("1/1"),
    # with the block's 5000-probe trace loop still ahead
    assert _wait_for_block_spectra(client, job["id"], service) in (0, 1)
    time.sleep(0.5)  # inside the block's Lanczos / trace loops
    asked = time.monotonic()
    assert client.post(f"/v1/jobs/{job['id']}/cancel").status_code == 202
    done = wait_terminal(client, job["id"], timeout=120)
    took = time.monotonic() - asked
    assert done["status"] == "cancelled", service.logs()
    # inside the block: its lockstep Lanczos (0/1 certified) or, at the planning-grade
    # tolerance, already its 5000-probe trace loop (1/1 certified, "trace of block …")
    progress = done["progress"]
    assert progress["stage"] in ("block spectra 0/1", "block spectra 1/1"), progress
    assert progress["stage"] == "block spectra 0/1" or "trace of block" in progress["message"]
    # Heartbeat (0.3 s) + one product + long-poll: seconds, not the block's minute.
    assert took < 10, (took, service.logs())
    logs = service.worker.tail(200_000)
    stopped = [line for line in logs.splitlines() if job["id"] in line and "attempt" in line]
    assert any("attempt stopped: cancellation requested" in line for line in stopped), logs
    assert "ignored cancellation" not in logs, logs
    engine = _engine(service)
    try:
        with engine.connect() as conn:
            outcomes = conn.execute(
                text("SELECT outcome FROM job_attempt WHERE job_id = :id"), {"id": job["id"]}
            ).scalars()
            assert list(outcomes) == ["cancelled"]
    finally:
        engine.dispose()
    assert client.get("/v1/artifacts", params={"job_id": job["id"]}).json()["items"] == []


@pytest.mark.slow
def test_worker_sigkill_during_analysis_is_retried_and_finishes_once(
    client: httpx.Client, service: Service, files: dict[str, Path]
) -> None:
    job = submit(
        client,
        model=SLOW_SPEC,
        checkpoint=upload(client, files["slow-checkpoint"], "checkpoint"),
        dataset=upload(client, files["slow-data"], "dataset"),
        options={**SLOW_OPTIONS, "blocks": ["layers.0.q", "layers.0.ffn_in", "head"]},
    )
    _wait_for_block_spectra(client, job["id"], service)
    service.worker.kill()
    replacement = service.new_worker("worker-2.log")
    service.worker = replacement
    done = wait_terminal(client, job["id"], timeout=180)
    assert done["status"] == "succeeded", (done["error"], service.logs())
    engine = _engine(service)
    try:
        with engine.connect() as conn:
            attempts = conn.execute(
                text(
                    "SELECT attempt, outcome FROM job_attempt WHERE job_id = :id ORDER BY attempt"
                ),
                {"id": job["id"]},
            ).all()
            outputs = conn.execute(
                text("SELECT name, count(*) FROM artifact WHERE job_id = :id GROUP BY name"),
                {"id": job["id"]},
            ).all()
    finally:
        engine.dispose()
    assert done["attempt"] == 2
    assert [a.outcome for a in attempts][-1] == "succeeded"
    assert [a.outcome for a in attempts].count("succeeded") == 1
    assert attempts[0].outcome != "succeeded"
    assert all(count == 1 for _, count in outputs)  # each output once, from the last attempt
    assert {name for name, _ in outputs} == set(done["result"]["artifacts"])


@pytest.mark.slow
def test_block_fan_out_over_two_workers_equals_the_single_process_run(
    client: httpx.Client, service: Service, files: dict[str, Path]
) -> None:
    """An analysis fanned out over two workers assembles, block by block and pair by pair,
    the numbers of the same request run in one process (``fan_out: false``), to the rounding
    of the batched products. The fan-out is made at submission: the parent waits from the
    start and runs one attempt, its fan-in (it never loads the model to plan the blocks)."""
    second = service.new_worker("fan-out-worker.log")
    try:
        ckpt = upload(client, files["checkpoint"], "checkpoint")
        data = upload(client, files["data"], "dataset")
        options = {
            **OPTIONS,
            "per_sample": False,
            "bounds": False,
            "off_diagonal": [["layers.0.q", "layers.0.k"], ["layers.0.v", "head"]],
            "fan_out": True,  # a small analysis would run in one process by cost
            "fan_out_groups": 2,  # not the live count: a killed worker may still look live
        }
        fanned = submit(client, checkpoint=ckpt, dataset=data, options=options)
        # decided at submission: the children exist and the parent waits, before any worker
        assert fanned["status"] == "running" and fanned["attempt"] == 0, fanned
        assert [c["kind"] for c in fanned["children"]] == ["analyze_blocks"] * 2
        single = submit(
            client, checkpoint=ckpt, dataset=data, options={**options, "fan_out": False}
        )
        fanned_done = wait_terminal(client, fanned["id"], timeout=150)
        single_done = wait_terminal(client, single["id"], timeout=150)
    finally:
        second.stop()
    assert fanned_done["status"] == "succeeded", (fanned_done["error"], service.logs())
    assert single_done["status"] == "succeeded", (single_done["error"], service.logs())
    got, want = fanned_done["result"]["measurements"], single_done["result"]["measurements"]
    assert [b["name"] for b in got["blocks"]] == [b["name"] for b in want["blocks"]]
    # batched lockstep products may differ in their last bits with the batch's width
    # (docs/numerics.md#lockstep): floats to 1e-8 relative (residuals at the rounding level,
    # ~1e-14, to 1e-12 absolute), everything else exactly
    for mine, theirs in zip(got["blocks"], want["blocks"], strict=True):
        assert_records_close(mine, theirs, mine["name"])
    assert_records_close(got["off_diagonal"], want["off_diagonal"], "off_diagonal")
    assert got["loss"] == want["loss"]
    assert "fan_out" not in want
    # The fan-in reports the same stages as one process (block spectra from the children).
    history = [mark["stage"] for mark in fanned_done["progress"]["stages"]]
    n_blocks = len(want["blocks"])
    assert f"block spectra {n_blocks}/{n_blocks}" in history and "off-diagonal" in history, history
    # Two analyze_blocks children, every block and pair exactly once.
    children = client.get(f"/v1/jobs/{fanned['id']}").json()["children"]
    assert [(c["kind"], c["status"]) for c in children] == [("analyze_blocks", "succeeded")] * 2
    record = got["fan_out"]["children"]
    assert sorted(c["job_id"] for c in record) == sorted(c["id"] for c in children)
    assert sorted(b for c in record for b in c["blocks"]) == sorted(
        b["name"] for b in want["blocks"]
    )
    assert sorted(tuple(p) for c in record for p in c["pairs"]) == sorted(
        tuple(p) for p in options["off_diagonal"]
    )
    assert all(c["estimated_cost"] > 0 and "est. cost" in c["name"] for c in record)
    child = client.get(f"/v1/jobs/{children[0]['id']}")
    assert child.status_code == 200, child.text
    assert child.json()["parent_id"] == fanned["id"]
    assert child.json()["result"]["measurements"]["blocks"], child.json()
    # The parent never loaded anything before its fan-in: one attempt (the fan-in), which
    # loads once and plans no blocks; G children + 1 model loads, not G + 2.
    engine = _engine(service)
    try:
        with engine.connect() as conn:
            attempts = conn.execute(
                text("SELECT outcome FROM job_attempt WHERE job_id = :id ORDER BY attempt"),
                {"id": fanned["id"]},
            ).all()
    finally:
        engine.dispose()
    assert [a.outcome for a in attempts] == ["succeeded"] and fanned_done["attempt"] == 1
    assert "planning blocks" not in history and history.count("loading") == 1, history
    assert fanned_done["max_attempts"] == single_done["max_attempts"]


def test_no_temp_files_and_no_orphan_blobs(client: httpx.Client, service: Service) -> None:
    """Runs last: every blob in the store is referenced by a row, nothing is left in tmp/."""
    from curvplan_core.artifacts.blobstore import default_store

    store = default_store(service.data_dir)
    engine = _engine(service)
    try:
        with engine.connect() as conn:
            referenced = {
                r[0]
                for r in conn.execute(
                    text("SELECT DISTINCT sha256 FROM artifact WHERE sha256 IS NOT NULL")
                )
            }
    finally:
        engine.dispose()
    assert store.temp_files() == []
    assert set(store.blobs()) == referenced

"""MLflow logging against a real ``mlflow server`` process, read back through MLflow's client:
metrics under their stable names equal the recommendation's values, params hold the inputs,
artifacts are the service's own figures (byte for byte), the page and numbers.json; the run
is the active one, $MLFLOW_RUN_ID's, or a new one named after the job."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from live_plugin import LiveService
from plan_bodies import B_CRIT, full_measurements, full_targets

import curvplan

pytestmark = pytest.mark.e2e

mlflow = pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

from curvplan.integrations.mlflow import log_job  # noqa: E402


@pytest.fixture(scope="module")
def finished(live: LiveService) -> dict[str, Any]:
    """A succeeded plan job with every plan-side section."""
    with curvplan.Client(live.url, live.api_key) as api:
        name = f"mlflow-{uuid.uuid4().hex[:6]}"
        job = api.submit_plan(full_measurements(), full_targets(), name=name, tags={"t": "a"})
        done = api.wait(job.id, timeout=90)
        assert done.status == "succeeded"
        return done.model_dump(mode="json")


@pytest.fixture
def tracking(mlflow_server: str, monkeypatch: pytest.MonkeyPatch) -> MlflowClient:
    for var in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    mlflow.set_tracking_uri(mlflow_server)
    return MlflowClient(mlflow_server)


def test_new_run_named_after_the_job_with_metrics_params_and_artifacts(
    live: LiveService, finished: dict[str, Any], tracking: MlflowClient,
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:  # fmt: skip
    experiment = f"exp-{uuid.uuid4().hex[:6]}"
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", experiment)
    with curvplan.Client(live.url, live.api_key) as api:
        run_id = log_job(api, finished["id"])
        png = api.get_plot(finished["id"], "batch-size", "png")
    run = tracking.get_run(run_id)
    assert tracking.get_experiment(run.info.experiment_id).name == experiment
    assert run.info.run_name == finished["name"] and run.info.status == "FINISHED"
    assert run.data.tags["curvplan.job_id"] == finished["id"]
    assert run.data.tags["curvplan.tag.t"] == "a"

    rec = finished["result"]["recommendation"]
    metrics = run.data.metrics
    assert metrics["budget.batch_size"] == rec["budget"]["batch"]["recommended"]
    assert metrics["batch.b_crit"] == pytest.approx(B_CRIT, rel=1e-3)
    assert metrics["budget.critical_batch_size"] == rec["budget"]["batch"]["critical"]
    assert metrics["batch.b_simple"] == rec["batch_size"]["b_simple"]["value"]
    assert metrics["batch.b_noise"] == rec["batch_size"]["b_noise"]["value"]
    assert metrics["sample_size.alpha"] == rec["sample_size"]["fit"]["alpha"]
    assert metrics["sample_size.C"] == rec["sample_size"]["fit"]["C"]
    assert metrics["budget.samples"] == rec["budget"]["data"]["recommended_examples"]
    for block in rec["curvature"]["blocks"]:
        assert metrics[f"curvature.lambda_max.{block['name']}"] == block["lambda_max"]
    first = rec["sample_size"]["per_tolerance"][0]
    assert (
        metrics[f"sample_size.k_empirical.tol_{first['tolerance']:g}"] == (first["empirical"]["k"])
    )

    params = run.data.params
    assert json.loads(params["curvplan.targets.tolerances"]) == full_targets()["tolerances"]
    assert params["curvplan.kind"] == "plan"
    n = len(full_measurements()["per_sample_losses"])
    assert params["curvplan.measurements.per_sample_losses.length"] == str(n)

    names = {a.path for a in tracking.list_artifacts(run_id, "curvplan")}
    drawn = ["delta-curve", "block-norms", "batch-size", "loss-vs-data"]
    assert {f"curvplan/{p}.{f}" for p in drawn for f in ("png", "svg")} <= names
    assert {"curvplan/report.html", "curvplan/numbers.json"} <= names
    got = Path(tracking.download_artifacts(run_id, "curvplan/batch-size.png", str(tmp_path)))
    assert got.read_bytes() == png  # the service's drawing, not a second one
    numbers = json.loads(
        Path(
            tracking.download_artifacts(run_id, "curvplan/numbers.json", str(tmp_path))
        ).read_text()
    )
    assert numbers["headline"] == pytest.approx(dict(metrics))


def test_active_run_and_mlflow_run_id_are_used(
    live: LiveService, finished: dict[str, Any], tracking: MlflowClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    experiment = tracking.create_experiment(f"exp-{uuid.uuid4().hex[:6]}")
    with curvplan.Client(live.url, live.api_key) as api:
        with mlflow.start_run(experiment_id=experiment, run_name="my-training") as active:
            mlflow.log_param("lr", "3e-4")
            assert log_job(api, finished["id"], artifacts=False) == active.info.run_id
            assert mlflow.active_run().info.run_id == active.info.run_id  # still open
        run = tracking.get_run(active.info.run_id)
        assert run.info.run_name == "my-training" and run.data.params["lr"] == "3e-4"
        assert "budget.batch_size" in run.data.metrics

        outer = tracking.create_run(experiment, run_name="pipeline")
        monkeypatch.setenv("MLFLOW_RUN_ID", outer.info.run_id)
        assert log_job(api, finished["id"], artifacts=False) == outer.info.run_id
        again = log_job(api, finished["id"], artifacts=False)  # twice: same params, fine
        assert again == outer.info.run_id
    outer_run = tracking.get_run(outer.info.run_id)
    assert "batch.b_crit" in outer_run.data.metrics
    assert outer_run.info.status == "RUNNING"  # the caller's run: left open
    assert len(tracking.search_runs([experiment])) == 2  # no extra run was made


def test_cli_jobs_wait_mlflow(
    live: LiveService, finished: dict[str, Any], mlflow_server: str
) -> None:
    experiment = f"cli-{uuid.uuid4().hex[:6]}"
    env = live.client_env(MLFLOW_TRACKING_URI=mlflow_server, MLFLOW_EXPERIMENT_NAME=experiment)
    cli = [sys.executable, "-m", "curvplan.cli"]
    out = subprocess.run([*cli, "jobs", "wait", finished["id"], "--mlflow", "--json"], env=env,
                         capture_output=True, text=True, timeout=180)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["id"] == finished["id"]
    tracking = MlflowClient(mlflow_server)
    (run,) = tracking.search_runs([tracking.get_experiment_by_name(experiment).experiment_id])
    assert run.data.tags["curvplan.job_id"] == finished["id"]
    assert run.data.metrics["batch.b_crit"] == pytest.approx(B_CRIT, rel=1e-3)
    bad = subprocess.run([*cli, "report", finished["id"], "--mlflow"],
                         env={**env, "MLFLOW_TRACKING_URI": "http://127.0.0.1:9",
                              "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"},
                         capture_output=True, text=True, timeout=180)  # fmt: skip
    assert bad.returncode == 3 and "MLflow" in bad.stderr  # the tracker is unreachable

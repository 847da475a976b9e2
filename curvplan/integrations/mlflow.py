"""Log a curvplan job to MLflow: the budget and main numbers as metrics, the inputs as
params, the report page, every figure (PNG and SVG) and ``numbers.json`` as artifacts.

    from curvplan.integrations.mlflow import log_job

    with curvplan.Client() as api:
        run_id = log_job(api, job_id)

Which run: the active run (``mlflow.start_run()`` around the call), else ``run_id``, else
``$MLFLOW_RUN_ID`` (those are logged into and left open), else a new run in
``experiment_name`` / ``$MLFLOW_EXPERIMENT_NAME`` (default ``curvplan``) named after the job
and tagged ``curvplan.job_id``, ended with the job's outcome. The tracking server is
MLflow's own choice (``$MLFLOW_TRACKING_URI``) unless ``tracking_uri`` is given.
Needs ``pip install 'curvplan[mlflow]'`` (mlflow-skinny). The figures are the service's:
nothing is drawn here. Metric names are :mod:`curvplan.headline`'s (docs/integrations.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from curvplan.client import Client
from curvplan.client import models as m
from curvplan.headline import headline_dict, metric_name
from curvplan.report_files import download_report

DEFAULT_EXPERIMENT = "curvplan"
ARTIFACT_DIR = "curvplan"
RUN_STATUS = {"succeeded": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}
MAX_PARAM_CHARS = 500  # MLflow's smallest param-value limit among its supported stores
MAX_LIST_ITEMS = 16
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_PER_BATCH = 100  # longer lists (measurement arrays) are logged by length only


class MlflowNotInstalledError(ImportError):
    pass


def _mlflow() -> Any:
    try:
        import mlflow
    except ImportError:
        raise MlflowNotInstalledError(
            "MLflow logging needs the mlflow client: pip install 'curvplan[mlflow]'"
        ) from None
    return mlflow


def flatten_params(value: Any, prefix: str = "") -> Iterator[tuple[str, str]]:
    """Dotted ``(key, value)`` pairs of a request: scalars as text, short lists as JSON,
    long lists as ``<key>.length`` (measurement arrays are data, not parameters)."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from flatten_params(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(value, list):
        if len(value) > MAX_LIST_ITEMS or any(isinstance(v, Mapping | list) for v in value):
            yield f"{prefix}.length", str(len(value))
        else:
            yield prefix, json.dumps(value)
    elif value is not None:
        yield prefix, str(value)


def job_params(job: m.JobOut) -> dict[str, str]:
    """The job's inputs as MLflow params: kind, name, and the request (model summary,
    artifact ids, options, targets, measurement sizes)."""
    request = dict(job.request or {})
    request.pop("webhook_url", None)  # an endpoint, not an input of the analysis
    params = {"curvplan.kind": job.kind, "curvplan.name": job.name or ""}
    for key, text in flatten_params(request):
        if key in ("kind", "name", "tags.length"):
            continue
        params[metric_name("curvplan", key)] = text[:MAX_PARAM_CHARS]
    return params


def _run_for(mlflow: Any, tracker: Any, job: m.JobOut, run_id: str | None,
             experiment: str | None) -> tuple[str, bool]:  # fmt: skip
    """(run id, whether this call created the run and so ends it)."""
    active = mlflow.active_run()
    if active is not None:
        return active.info.run_id, False
    run_id = run_id or os.environ.get("MLFLOW_RUN_ID")
    if run_id:  # a run the caller owns: logged into, left as it is
        return tracker.get_run(run_id).info.run_id, False
    name = experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT
    exp = tracker.get_experiment_by_name(name)
    exp_id = exp.experiment_id if exp is not None else tracker.create_experiment(name)
    run_name = job.name or f"curvplan-{str(job.id)[:8]}"
    return tracker.create_run(exp_id, run_name=run_name).info.run_id, True


def log_job(
    client: Client,
    job_id: str,
    *,
    run_id: str | None = None,
    experiment_name: str | None = None,
    tracking_uri: str | None = None,
    artifacts: bool = True,
) -> str:
    """Log job ``job_id`` to MLflow; return the run id (see the module docstring).

    ``artifacts=False`` logs metrics, params and tags only. MLflow's own console messages
    go to stderr, so a command's stdout (``--json``) stays clean.
    """
    with contextlib.redirect_stdout(sys.stderr):
        return _log_job(client, job_id, run_id, experiment_name, tracking_uri, artifacts)


def _log_job(
    client: Client,
    job_id: str,
    run_id: str | None,
    experiment_name: str | None,
    tracking_uri: str | None,
    artifacts: bool,
) -> str:
    mlflow = _mlflow()
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    job = client.get_job(job_id)
    tracker = MlflowClient()
    rid, created = _run_for(mlflow, tracker, job, run_id, experiment_name)
    failed = True
    try:
        tags = {
            "curvplan.job_id": str(job.id),
            "curvplan.kind": job.kind,
            "curvplan.status": job.status,
            "curvplan.service": client.base_url,
            **{f"curvplan.tag.{k}": v for k, v in (job.tags or {}).items()},
        }
        now = int(time.time() * 1000)
        metrics: dict[str, float] = {}
        rec = m.job_recommendation(job)
        if rec is not None:
            metrics = headline_dict(rec)
        existing = tracker.get_run(rid).data.params
        params = {k: v for k, v in job_params(job).items() if existing.get(k) != v}
        tracker.log_batch(rid, tags=[RunTag(k, v) for k, v in sorted(tags.items())])
        metric_list = [Metric(k, v, now, 0) for k, v in sorted(metrics.items())]
        param_list = [Param(k, v) for k, v in sorted(params.items())]
        for i in range(0, len(metric_list), MAX_METRICS_PER_BATCH):  # MLflow's batch limits
            tracker.log_batch(rid, metrics=metric_list[i : i + MAX_METRICS_PER_BATCH])
        for i in range(0, len(param_list), MAX_PARAMS_PER_BATCH):
            tracker.log_batch(rid, params=param_list[i : i + MAX_PARAMS_PER_BATCH])
        if artifacts:
            with tempfile.TemporaryDirectory(prefix="curvplan-mlflow-") as tmp:
                if job.status == "succeeded":
                    download_report(client, str(job.id), Path(tmp))
                else:
                    (Path(tmp) / "job.json").write_text(job.model_dump_json(indent=2), "utf-8")
                tracker.log_artifacts(rid, tmp, artifact_path=ARTIFACT_DIR)
        failed = False
    finally:
        if created:  # a run of its own mirrors the job's outcome
            status = "FAILED" if failed else RUN_STATUS.get(job.status, "FINISHED")
            tracker.set_terminated(rid, status=status)
    return rid

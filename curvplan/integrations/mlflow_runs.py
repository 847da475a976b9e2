"""Read training runs back from MLflow: each run's params and its evaluation-loss history as
:class:`curvplan.runs.RunRecord` (``curvplan plan --from-mlflow EXPERIMENT``).

    from curvplan.integrations.mlflow_runs import read_experiment_runs
    from curvplan.runs import build_tables

    records = read_experiment_runs("pilots", tracking_uri="http://mlflow:5000")
    result = build_tables(records, target_loss=2.0)

The tracking server is ``tracking_uri``, else MLflow's own choice (``$MLFLOW_TRACKING_URI``).
Needs ``pip install 'curvplan[mlflow]'``; MLflow is imported only when a function here runs.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence
from typing import Any

from curvplan.integrations.mlflow import MlflowNotInstalledError
from curvplan.runs.records import RunRecord, RunsInputError

#: Evaluation-loss metric names tried when none is given (the first a run has is used). The
#: training loss (``loss``, ``train_loss``) is never taken for it.
LOSS_METRICS = (
    "eval_loss",
    "eval/loss",
    "val_loss",
    "val/loss",
    "validation_loss",
    "valid_loss",
)
_PAGE = 1000


def _tracker(tracking_uri: str | None) -> Any:
    try:
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise MlflowNotInstalledError(
            "reading runs from MLflow needs the mlflow client: pip install 'curvplan[mlflow]'"
        ) from None
    return MlflowClient(tracking_uri=tracking_uri)


def metric_history(tracker: Any, run_id: str, key: str) -> list[tuple[float, float]]:
    """``(step, value)`` of metric ``key`` of a run, sorted by step; a step logged more than
    once keeps its latest value (by timestamp)."""
    latest: dict[int, tuple[int, float]] = {}
    for m in tracker.get_metric_history(run_id, key):
        seen = latest.get(m.step)
        if seen is None or m.timestamp >= seen[0]:
            latest[m.step] = (m.timestamp, m.value)
    return [(float(step), value) for step, (_, value) in sorted(latest.items())]


def _experiment_id(tracker: Any, experiment: str) -> str:
    from mlflow.exceptions import MlflowException

    found = tracker.get_experiment_by_name(experiment)
    if found is None and experiment.isdigit():
        with contextlib.suppress(MlflowException):
            found = tracker.get_experiment(experiment)
    if found is None:
        raise RunsInputError(f"no MLflow experiment named {experiment!r} on {tracker.tracking_uri}")
    return str(found.experiment_id)


def _record(tracker: Any, run: Any, loss_metric: str | None) -> RunRecord:
    keys = (loss_metric,) if loss_metric else LOSS_METRICS
    key = next((k for k in keys if k in run.data.metrics), None)
    history = metric_history(tracker, run.info.run_id, key) if key else []
    note = None
    if key is None:
        note = (
            f"no evaluation-loss metric (tried {', '.join(keys)}; the run has "
            f"{', '.join(sorted(run.data.metrics)) or 'no metrics'}): name it with --loss-metric"
        )
    return RunRecord(
        run=run.info.run_id,
        params=dict(run.data.params),
        history=history,
        name=run.info.run_name,
        status=run.info.status,
        finished=run.info.status == "FINISHED",
        history_note=note,
    )


def read_experiment_runs(
    experiment: str,
    *,
    run_ids: Sequence[str] = (),
    tracking_uri: str | None = None,
    loss_metric: str | None = None,
) -> list[RunRecord]:
    """The active runs of MLflow experiment ``experiment`` (a name, or an id), or only
    ``run_ids`` (each must belong to it), with their params, status and the history of
    ``loss_metric`` (default: the first of ``LOSS_METRICS`` the run has; a run without it
    gets an empty history, which ``build_tables`` reports). MLflow's own console output goes
    to stderr."""
    with contextlib.redirect_stdout(sys.stderr):
        return _read(experiment, run_ids, tracking_uri, loss_metric)


def _read(
    experiment: str, run_ids: Sequence[str], tracking_uri: str | None, loss_metric: str | None
) -> list[RunRecord]:
    tracker = _tracker(tracking_uri)
    from mlflow.exceptions import MlflowException

    exp_id = _experiment_id(tracker, experiment)
    runs: list[Any] = []
    if run_ids:
        for rid in dict.fromkeys(run_ids):
            try:
                run = tracker.get_run(rid)
            except MlflowException:
                raise RunsInputError(
                    f"--run-id {rid}: no such run on {tracker.tracking_uri}"
                ) from None
            if str(run.info.experiment_id) != exp_id:
                raise RunsInputError(
                    f"--run-id {rid}: the run belongs to experiment {run.info.experiment_id}, "
                    f"not {experiment!r} ({exp_id})"
                )
            runs.append(run)
    else:
        token = None
        while True:
            page = tracker.search_runs(
                [exp_id], max_results=_PAGE, order_by=["attributes.start_time ASC"],
                page_token=token,
            )  # fmt: skip
            runs.extend(page)
            token = page.token
            if not token:
                break
    return [_record(tracker, run, loss_metric) for run in runs]

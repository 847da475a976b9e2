"""Planner work per job is bounded at submission (settings), and a cancel reaches the
planner's loop over orderings.

A 200,000-loss plan with 1,000 orderings and 100,000 bootstrap draws held a CPU worker until
its 900 s limit, and cancelling it took 16.8 s.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from curvplan_core.planner.cancel import PlanCancelled, cancel_scope
from curvplan_core.planner.loss_curve import loss_difference_curves


def _losses(n: int) -> list[float]:
    return [float(x) for x in np.random.default_rng(0).gamma(2.0, 0.3, size=n)]


def test_a_plan_past_the_work_limits_is_a_422_naming_each_field(
    client: Any, auth_headers: dict[str, str], settings: Any
) -> None:
    losses = _losses(200_000)
    body = {
        "kind": "plan",
        "measurements": {"per_sample_losses": losses, "loss_bound": 10.0},
        "targets": {"tolerances": [0.01], "orderings": 1000, "bootstrap": 100_000},
    }
    response = client.post("/v1/jobs", json=body, headers=auth_headers)
    assert response.status_code == 422, response.text
    errors = {e["field"]: e["message"] for e in response.json()["errors"]}
    assert set(errors) == {"body.targets.orderings", "body.targets.bootstrap"}
    assert str(settings.plan_max_loss_evaluations) in errors["body.targets.orderings"]
    allowed = settings.plan_max_loss_evaluations // len(losses)
    assert f"at most {allowed} orderings" in errors["body.targets.orderings"]
    within = {**body, "targets": {"tolerances": [0.01], "orderings": allowed, "bootstrap": 1000}}
    assert client.post("/v1/jobs", json=within, headers=auth_headers).status_code == 202


def test_a_cancel_stops_the_loop_over_orderings_within_one_ordering() -> None:
    losses = np.asarray(_losses(200_000))
    stop = threading.Event()
    timer = threading.Timer(0.3, stop.set)
    timer.start()
    t0 = time.monotonic()
    with cancel_scope(stop.is_set), pytest.raises(PlanCancelled):
        loss_difference_curves(losses, orderings=100_000, seed=1)  # hours of work
    elapsed = time.monotonic() - t0
    assert elapsed < 3.0, elapsed
    # outside a scope nothing is cancelled
    loss_difference_curves(losses[:1000], orderings=4, seed=1)


def test_the_plan_kind_turns_a_cancel_into_a_cancelled_job(tmp_path: Path) -> None:
    from curvplan_worker.errors import JobCancelled
    from curvplan_worker.job_context import JobContext
    from curvplan_worker.kinds import load_request
    from curvplan_worker.kinds import plan as plan_kind

    stop = threading.Event()
    ctx = JobContext(
        job_id="00000000-0000-0000-0000-000000000001",
        attempt=1,
        data_dir=tmp_path,
        send_progress=lambda *_: None,
        is_cancelled=stop.is_set,
    )
    stored = {
        "kind": "plan",
        "measurements": {"per_sample_losses": _losses(200_000), "loss_bound": 10.0},
        "targets": {"tolerances": [0.01], "orderings": 1000},  # about a minute of work
    }
    request = load_request("plan", json.dumps(stored))
    threading.Timer(1.0, stop.set).start()  # after validation, during the orderings
    t0 = time.monotonic()
    with pytest.raises(JobCancelled):
        plan_kind.run(request, ctx)
    assert time.monotonic() - t0 < 6.0

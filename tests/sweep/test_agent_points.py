"""An agent's loss records become the built-in loop's PointResult (curvplan_core.sweep_points):
hand-computed interpolations, and the built-in loop's own evaluations read back the same."""

from __future__ import annotations

import pytest

from curvplan.types.agents import LossRecord
from curvplan.types.sweep import OptimizerSpec, PointSettings
from curvplan_core.sweep_points import point_result

BATCH = PointSettings(
    type="batch", batch_size=8, lr=0.01, target_loss=0.45, max_steps=100, eval_every=10
)


def _records(*rows: tuple[int, float]) -> list[LossRecord]:
    return [LossRecord(step=s, loss=loss) for s, loss in rows]


def test_steps_to_target_interpolate_between_the_evaluations_around_the_first_crossing() -> None:
    result = point_result(BATCH, _records((0, 1.0), (10, 0.6), (20, 0.3), (30, 0.2)), 4.0)
    # 10 + (0.6 − 0.45)/(0.6 − 0.3)·10 = 15
    assert result.steps == pytest.approx(15.0)
    assert result.examples == pytest.approx(15.0 * 8)
    assert result.reached_target and not result.censored
    assert (result.best_eval_loss, result.best_step) == (0.2, 30)
    assert result.eval_steps == [0, 10, 20, 30] and result.two_batch is None
    assert result.seconds == 4.0 and result.batch_size_tokens is None


def test_a_run_that_never_reaches_the_target_is_censored_at_its_last_step() -> None:
    result = point_result(BATCH, _records((20, 0.7), (0, 1.0), (40, 0.5)), 1.0)  # unordered
    assert result.censored and not result.reached_target
    assert result.steps == 40.0 and result.eval_steps == [0, 20, 40]


def test_a_step_reported_twice_keeps_its_last_record_and_examples_come_from_the_records() -> None:
    records = [
        LossRecord(step=0, loss=1.0, examples=0, tokens=0),
        LossRecord(step=10, loss=0.9, examples=100, tokens=600),
        LossRecord(step=10, loss=0.6, examples=100, tokens=600),
        LossRecord(step=20, loss=0.3, examples=200, tokens=1200),
    ]
    result = point_result(BATCH, records, 1.0)
    assert result.eval_losses == [1.0, 0.6, 0.3]
    assert result.steps == pytest.approx(15.0)
    assert result.examples == pytest.approx(150.0)  # the records' count at step 15
    assert result.batch_size_tokens == pytest.approx(8 * 6.0)


def test_a_data_point_is_its_best_evaluation() -> None:
    point = PointSettings(
        type="data", batch_size=16, lr=0.01, data_size=512, max_steps=60, eval_every=20
    )
    result = point_result(point, _records((0, 2.0), (20, 1.2), (40, 1.1), (60, 1.15)), 2.0)
    assert (result.best_eval_loss, result.best_step, result.steps) == (1.1, 40, 40.0)
    assert result.data_size == 512 and not result.reached_target and not result.censored


def test_the_built_in_loops_evaluations_read_back_as_its_own_result() -> None:
    """The same numbers whoever trains: train_point's evaluations, reported as records, give
    train_point's steps to target, best loss and step."""
    from sweep_helpers import TINY_SPEC, counting_data

    from curvplan_worker.curvature.model import build_model
    from curvplan_worker.curvature.objective import objective_for
    from curvplan_worker.sweep.train import train_point

    point = PointSettings(
        type="batch", batch_size=8, lr=0.03, target_loss=1.8, max_steps=60, eval_every=3
    )
    builtin = train_point(
        build_model(TINY_SPEC, seed=0),
        objective_for(TINY_SPEC),
        counting_data(64, 0),
        counting_data(32, 1),
        point,
        OptimizerSpec(lr=0.03, base_batch_size=8, warmup_steps=2),
    )
    assert builtin.reached_target and len(builtin.eval_steps) > 2
    records = _records(*zip(builtin.eval_steps, builtin.eval_losses, strict=True))
    agent = point_result(point, records, builtin.seconds)
    for field in ("steps", "examples", "reached_target", "censored", "best_eval_loss", "best_step"):
        assert getattr(agent, field) == pytest.approx(getattr(builtin, field)), field
    assert agent.eval_losses == builtin.eval_losses


@pytest.mark.parametrize("d_star", [3000.0, 10000.0])
def test_an_agent_data_sweep_plans_agent_points_and_its_records_fit_budget_data(
    d_star: float,
) -> None:
    """Planned for agents (runner on every point, the named sizes unchecked against any data),
    then fitted from records whose best loss lies on L(D) = E + A·D^(−β): budget.data answers
    the size the law gives for the target, as for the built-in loop's points. A target beyond
    the named sizes queues no round above them (the service does not know the agents' data):
    the answer is extrapolated and says so."""
    import json
    import math
    import uuid
    from pathlib import Path

    from curvplan.types.jobs import SweepJobCreate, queue_of
    from curvplan_worker.job_context import JobContext
    from curvplan_worker.kinds.sweep import plan_points, run

    e, a, beta = 1.2, 30.0, 0.5
    target = e + a * d_star**-beta
    sizes = [128, 256, 512, 1024, 2048, 4096]
    body = SweepJobCreate.model_validate(
        {
            "kind": "sweep",
            "runner": "agent",
            "optimizer": {"lr_grid": [1.0]},
            "sweep": {"type": "data", "data_sizes": sizes, "target_loss": target, "max_steps": 90},
        }
    )
    planned = plan_points(body, None)
    requests = [c.stored()["request"] for c in planned]
    assert [r["point"]["data_size"] for r in requests] == sizes
    assert {queue_of("sweep_point", r) for r in requests} == {"agent"}
    assert all("train_data" not in r and "model" not in r for r in requests)
    children = []
    for child, request in zip(planned, requests, strict=True):
        d = request["point"]["data_size"]
        law = e + a * d**-beta
        rows = ((0, 4.0), (30, law + 0.2), (60, law), (90, law + 0.01))  # best at step 60
        result = point_result(child.request.point, _records(*rows), 1.0)
        children.append(
            {
                "id": str(uuid.uuid4()),
                "kind": "sweep_point",
                "name": child.name,
                "status": "succeeded",
                "request": request,
                "result": {"point": result.model_dump(mode="json")},
                "error": None,
                "attempt": 1,
            }
        )
    ctx = JobContext(
        job_id=str(uuid.uuid4()),
        attempt=2,
        data_dir=Path("."),
        send_progress=lambda *args: None,
        is_cancelled=lambda: False,
        children=children,
    )
    from curvplan.types.results import SweepJobResult

    result = run(SweepJobCreate.model_validate_json(json.dumps(body.model_dump(mode="json"))), ctx)
    assert isinstance(result, SweepJobResult), result
    out = result.model_dump(mode="json")
    assert out["measurements"]["loss_vs_data"] == [
        {"n_samples": float(d), "loss": pytest.approx(e + a * d**-beta)} for d in sizes
    ]
    data = out["recommendation"]["budget"]["data"]
    assert math.isclose(data["recommended_examples"], d_star, rel_tol=0.05), data
    low, high = data["recommended_examples_ci"]
    assert low <= d_star <= (high or math.inf)
    if d_star < 1.5 * max(sizes):
        assert data["source"] == "data_sweep" and out["sweep"]["data"]["bracketed"], data
    else:
        assert data["source"] == "extrapolated" and not out["sweep"]["data"]["bracketed"]
        assert out["sweep"]["data"]["next_round_sizes"] is None
        assert any("not bracketed" in note for note in out["sweep"]["notes"]), out["sweep"]

"""An analysis given several sweeps, read from real PostgreSQL: two succeeded data sweeps of one
setup (the first round and the next round ``budget.data.next_step`` prints, run as its own
sweep) give one combined L(D), whose fit recovers the analytic size for the target from a
generated ground truth L(D) = E + A·D^(−β); sweeps of different setups are refused naming
``sweeps.i`` and the setting; batch sweeps of one setup and target combine too."""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

import pytest
from queue_helpers import insert_jobs
from sqlalchemy import Engine, text

from curvplan.types.planner import Measurements, Targets
from curvplan_core.planner import make_plan
from curvplan_worker.analyze.sweep_inputs import read_sweeps
from curvplan_worker.errors import JobError

E, A, BETA = 1.0, 20.0, 0.5
D_STAR = 1400.0  # below 4,096 / 1.5: the first round alone extrapolates to it
TARGET = E + A * D_STAR**-BETA
FIRST = [4096, 8192, 16384, 32768]
TINY_SPEC = {
    "d_model": 8,
    "n_heads": 2,
    "d_ff": 16,
    "n_layers": 1,
    "task": {"type": "causal_lm", "vocab_size": 11, "seq_len": 6},
}


def _loss(d: float, seed: int) -> float:
    wobble = 1.0 + 1e-3 * math.sin(7 * d + seed)  # deterministic measurement noise, 0.1 %
    return (E + A * d**-BETA) * wobble


def _request(train: str, evaluate: str, sweep: dict[str, Any], lr: float = 3e-3) -> dict:
    return {
        "kind": "sweep",
        "model": TINY_SPEC,
        "train_data": train,
        "eval_data": evaluate,
        "optimizer": {"lr": lr, "lr_grid": [0.5, 1.0, 2.0]},
        "sweep": sweep,
    }


def _succeeded_sweep(
    db: Engine, project_id: uuid.UUID, request: dict, result: dict[str, Any]
) -> uuid.UUID:
    """A sweep job as the worker leaves it: its request, status succeeded, its result."""
    (job_id,) = insert_jobs(db, project_id, [request], kind="sweep")
    with db.begin() as conn:
        conn.execute(
            text(
                "UPDATE job SET status = 'succeeded', result = CAST(:r AS jsonb),"
                " finished_at = now() WHERE id = :id"
            ),
            {"id": job_id, "r": json.dumps(result)},
        )
    return job_id


def _data_sweep(
    db: Engine, project_id: uuid.UUID, data: tuple[str, str], sizes: list[int], seed: int, **kw: Any
) -> uuid.UUID:
    settings = {"type": "data", "target_loss": TARGET, "data_sizes": sizes, "batch_size": 32}
    settings.update(kw.pop("settings", {}))
    table = [{"n_samples": float(d), "loss": _loss(d, seed)} for d in sizes]
    result = {
        "sweep": {"type": "data", "target_loss": TARGET, "tokens_per_example": 6.0},
        "measurements": {"loss_vs_data": table},
    }
    return _succeeded_sweep(db, project_id, _request(*data, settings, **kw), result)


def _budget_data(fields: dict[str, Any], target: float | None) -> Any:
    plan = make_plan(
        Measurements.model_validate_json(json.dumps(fields)),
        Targets(target_loss=target, available_samples=40_000),
        seed=0,
    )
    return plan.budget.data


def test_two_data_sweeps_of_one_setup_give_one_l_of_d_that_brackets_the_target(
    db, project_id
) -> None:
    data = (str(uuid.uuid4()), str(uuid.uuid4()))
    first = _data_sweep(db, project_id, data, FIRST, seed=0)
    alone = read_sweeps(db, project_id, [first])
    before = _budget_data(alone.fields, alone.target_loss)
    assert before.source == "extrapolated" and before.next_step is not None
    step = before.next_step
    new = step.data_sizes
    assert new and not set(new) & set(FIRST)  # the printed next round trains new sizes only
    assert "--sweep OLD --sweep NEW" in step.estimated_cost
    # the next round run as printed (its sizes), plus one size both sweeps measure
    second = _data_sweep(db, project_id, data, [*new, 4096], seed=1)

    both = read_sweeps(db, project_id, [first, second])
    table = both.fields["loss_vs_data"]
    assert [p["n_samples"] for p in table] == sorted({*FIRST, *new, 4096})
    (repeated,) = [p for p in table if p["n_samples"] == 4096]
    assert repeated["loss"] == pytest.approx((_loss(4096, 0) + _loss(4096, 1)) / 2, rel=1e-12)
    assert both.used == {"loss_vs_data": [str(first), str(second)]}
    assert any("2 data sweeps" in n and "4096" in n for n in both.notes)
    assert both.target_loss == pytest.approx(TARGET)

    after = _budget_data(both.fields, both.target_loss)
    assert after.source == "data_sweep"  # the second sweep brackets D*
    assert after.recommended_examples == pytest.approx(D_STAR, rel=0.03)
    assert after.measured_sizes == (float(min(new)), 32768.0)
    assert after.next_step is None
    # the order the sweeps are given in does not change the table
    assert read_sweeps(db, project_id, [second, first]).fields["loss_vs_data"] == table


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"settings": {"epochs": 4.0}}, "sweep.epochs"),
        ({"settings": {"batch_size": 64}}, "sweep.batch_size"),
        ({"settings": {"schedule": "cosine"}}, "sweep.schedule"),
        ({"lr": 1e-3}, "optimizer.lr"),
        ({"data": "other"}, "train_data"),
    ],
)
def test_data_sweeps_of_different_setups_are_refused_naming_the_setting(
    db, project_id, change: dict, field: str
) -> None:
    data = (str(uuid.uuid4()), str(uuid.uuid4()))
    first = _data_sweep(db, project_id, data, FIRST, seed=0)
    other_data = (str(uuid.uuid4()), data[1]) if change.pop("data", None) else data
    second = _data_sweep(db, project_id, other_data, [1024, 1448, 2048, 2896], seed=1, **change)
    with pytest.raises(JobError) as refused:
        read_sweeps(db, project_id, [first, second])
    assert refused.value.type == "invalid-request"
    assert refused.value.detail.startswith(f"sweeps.1: its {field} differs from sweeps.0's")


def _batch_sweep(
    db: Engine, project_id: uuid.UUID, target: float, table: list[tuple[int, float]]
) -> uuid.UUID:
    data = ("8a7b6c5d-0000-4000-8000-000000000001", "8a7b6c5d-0000-4000-8000-000000000002")
    request = _request(*data, {"type": "batch", "target_loss": target})
    result = {
        "sweep": {"type": "batch", "target_loss": target},
        "measurements": {"steps_to_target": [{"batch_size": b, "steps": s} for b, s in table]},
    }
    return _succeeded_sweep(db, project_id, request, result)


def test_batch_sweeps_combine_for_one_target_and_are_refused_for_two(db, project_id) -> None:
    small = _batch_sweep(db, project_id, 2.0, [(8, 800.0), (16, 450.0), (32, 280.0)])
    large = _batch_sweep(db, project_id, 2.0, [(32, 300.0), (64, 210.0), (128, 170.0)])
    both = read_sweeps(db, project_id, [small, large])
    assert both.fields["steps_to_target"] == [
        {"batch_size": 8, "steps": 800.0},
        {"batch_size": 16, "steps": 450.0},
        {"batch_size": 32, "steps": 290.0},  # measured by both: the mean
        {"batch_size": 64, "steps": 210.0},
        {"batch_size": 128, "steps": 170.0},
    ]
    assert both.fields["steps_to_target_loss"] == 2.0
    other = _batch_sweep(db, project_id, 2.5, [(8, 500.0), (16, 300.0), (32, 200.0)])
    with pytest.raises(JobError, match=r"sweeps\.1: its sweep\.target_loss differs"):
        read_sweeps(db, project_id, [small, other])


def test_an_agent_sweep_and_a_builtin_sweep_are_different_setups() -> None:
    from curvplan_worker.analyze.sweep_inputs import sweep_setup

    settings = {"type": "data", "data_sizes": [64, 128, 256, 512], "batch_size": 32}
    builtin = sweep_setup(_request(str(uuid.uuid4()), str(uuid.uuid4()), settings))
    agent = sweep_setup({"kind": "sweep", "runner": "agent", "sweep": settings})
    assert (builtin["runner"], agent["runner"]) == ("builtin", "agent")
    assert agent["train_data"] is None and agent["sweep.epochs"] == builtin["sweep.epochs"] == 10
    # a request that no longer validates (3 sizes: refused since) is compared as stored
    stored = {**settings, "data_sizes": [64, 128, 256]}
    raw = sweep_setup({"kind": "sweep", "runner": "agent", "sweep": stored})
    assert raw["sweep.epochs"] is None and raw["runner"] == "agent"

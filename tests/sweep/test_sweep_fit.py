"""The sweep's fan-in on generated ground truth, and single training runs in-process."""

from __future__ import annotations

import json
import math
import uuid
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from sweep_helpers import TINY_SPEC, counting_data

from curvplan.types.jobs import SweepJobCreate, SweepPointJobCreate
from curvplan.types.results import SweepJobResult, stored_result
from curvplan.types.sweep import OptimizerSpec, PointResult, PointSettings
from curvplan_worker.errors import JobError
from curvplan_worker.job_context import JobContext
from curvplan_worker.kinds import load_request
from curvplan_worker.kinds.sweep import plan_points, run

S_MIN, B_CRIT = 40.0, 48.0


def _body(kind: str, **sweep: Any) -> dict[str, Any]:
    return {
        "kind": "sweep",
        "model": TINY_SPEC,
        "train_data": str(uuid.uuid4()),
        "eval_data": str(uuid.uuid4()),
        "sweep": {"type": kind, **sweep},
    }


def _stored(kind: str, **sweep: Any) -> SweepJobCreate:
    """The sweep request as the worker hands it to the kind: parsed from its stored JSON."""
    return cast(SweepJobCreate, load_request("sweep", json.dumps(_body(kind, **sweep))))


def _ctx(children: list[dict[str, Any]]) -> JobContext:
    return JobContext(
        job_id=str(uuid.uuid4()),
        attempt=2,
        data_dir=Path("."),
        send_progress=lambda *a: None,
        is_cancelled=lambda: False,
        children=children,
    )


def _point_request(point: PointResult | None) -> dict[str, Any]:
    """A sweep_point's stored request (the fan-in reads only its result here)."""
    settings = PointSettings(
        type="data" if point is not None and point.data_size else "batch",
        batch_size=point.batch_size if point is not None else 8,
        lr=point.lr if point is not None else 1e-3,
        lr_multiplier=point.lr_multiplier if point is not None else 1.0,
        data_size=point.data_size if point is not None else None,
        max_steps=1000,
        eval_every=10,
    )
    request = SweepPointJobCreate(
        kind="sweep_point",
        model=TINY_SPEC,
        train_data=uuid.uuid4(),
        eval_data=uuid.uuid4(),
        point=settings,
    )
    return request.model_dump(mode="json", exclude_none=True)


def _child(name: str, point: PointResult | None, status: str = "succeeded") -> dict[str, Any]:
    return {
        "id": str(uuid.uuid4()),
        "kind": "sweep_point",
        "name": name,
        "status": status,
        "request": _point_request(point),
        "result": None if point is None else {"point": point.model_dump(mode="json")},
        "error": None if point is not None else {"type": "diverged", "title": "x", "detail": "x"},
        "attempt": 1,
    }


def _batch_point(b: int, steps: float, *, censored: bool = False, lr_mult: float = 1.0):
    return PointResult(
        batch_size=b,
        batch_size_tokens=6.0 * b,
        lr=1e-3,
        lr_multiplier=lr_mult,
        reached_target=not censored,
        censored=censored,
        steps=steps,
        examples=steps * b,
        best_eval_loss=1.0,
        best_step=int(steps),
        eval_steps=[0],
        eval_losses=[2.0],
        seconds=0.1,
    )


def _written(body, ctx):
    """The fan-in's result as the worker writes it (validated, as JSON)."""
    return stored_result(SweepJobResult, run(body, ctx))


def test_batch_fit_recovers_b_crit_and_leaves_out_censored_failed_and_worse_lr_points():
    rng = np.random.default_rng(0)
    ladder = [8, 16, 32, 64, 128, 256]
    children = [
        _child(f"B={b}", _batch_point(b, S_MIN * (1 + B_CRIT / b) * math.exp(rng.normal(0, 0.01))))
        for b in ladder
    ]
    children.append(_child("B=512", _batch_point(512, 400.0, censored=True)))
    children.append(_child("B=1024", None, status="failed"))
    children.append(_child("B=64, lr×2", _batch_point(64, 500.0, lr_mult=2.0)))
    out = _written(_stored("batch", target_loss=1.0), _ctx(children))
    sweep = out["sweep"]
    fit = sweep["batch"]["fit"]
    assert fit["ci"][0] <= B_CRIT <= fit["ci"][1]
    assert abs(fit["value"] / B_CRIT - 1) < 0.1 and abs(fit["s_min"] / S_MIN - 1) < 0.1
    assert sweep["batch"]["b_crit_tokens"] == pytest.approx(fit["value"] * 6.0)
    by_name = {p["name"]: p for p in sweep["points"]}
    assert by_name["B=512"]["used_in_fit"] is False
    assert "censored" in by_name["B=512"]["excluded_reason"]
    assert by_name["B=1024"]["used_in_fit"] is False and by_name["B=1024"]["error_type"]
    assert by_name["B=64, lr×2"]["used_in_fit"] is False
    assert sweep["points_used"] == 6 and sweep["failed_points"] == ["B=1024"]
    assert any("B=1024" in note for note in sweep["notes"])


def test_batch_sweep_with_too_few_points_left_fails_with_a_named_error():
    children = [
        _child("B=8", _batch_point(8, 100.0)),
        _child("B=16", _batch_point(16, 70.0)),
        _child("B=32", None, status="failed"),
        _child("B=64", _batch_point(64, 400.0, censored=True)),
    ]
    with pytest.raises(JobError) as info:
        run(_stored("batch", target_loss=1.0), _ctx(children))
    assert info.value.type == "too-few-points"
    assert "B=32" in info.value.detail and "B=64" in info.value.detail


def test_data_fit_recovers_the_law_and_sizes_the_dataset_for_the_target():
    e, a, beta = 1.2, 30.0, 0.5
    rng = np.random.default_rng(1)
    sizes = [64, 128, 256, 512, 1024, 2048, 4096]
    children = []
    for d in sizes:
        loss = (e + a * d**-beta) * math.exp(rng.normal(0, 0.002))
        for m in (0.5, 1.0, 2.0):  # the default grid: ×1 is best everywhere here
            worse = loss * (1.0 + 0.05 * abs(math.log2(m)))
            point = _batch_point(32, 10.0, lr_mult=m).model_copy(
                update={"data_size": d, "best_eval_loss": worse}
            )
            children.append(_child(f"D={d}, lr×{m:g}", point))
    target = 1.6  # D* = (30/0.4)² = 5,625: within 1.5× of the largest size, no next round
    out = _written(_stored("data", target_loss=target), _ctx(children))
    assert out["sweep"]["data"]["bracketed"] is True
    assert out["sweep"]["data"]["lr_multipliers"] == {str(d): 1.0 for d in sizes}
    assert "Hägele" in out["sweep"]["data"]["schedule"]
    assert sum(p["used_in_fit"] for p in out["sweep"]["points"]) == len(sizes)
    fit = out["sweep"]["data"]["fit"]
    assert fit["E_ci"][0] <= e <= fit["E_ci"][1] if "E_ci" in fit else True
    truth = (a / (target - e)) ** (1 / beta)
    answer = out["recommendation"]["budget"]["data"]
    assert answer["source"] == "data_sweep"
    lo, hi = answer["recommended_examples_ci"]
    assert lo <= truth <= hi
    assert out["measurements"]["loss_vs_data"][0]["n_samples"] == 64


def test_the_data_lr_is_tuned_on_the_end_subsets_and_interpolated_between():
    """The rule: best multiplier on the smallest (×0.5) and largest (×2) subsets only; the
    middle subsets take the nearest grid run to the log-linear interpolation, even where
    another multiplier happened to score better on them (no per-point selection)."""
    sizes = [64, 256, 1024, 4096, 16384]
    best_at = {64: 0.5, 16384: 2.0, 256: 2.0, 1024: 0.5, 4096: 0.5}  # middle bests: decoys
    children = []
    for d in sizes:
        for m in (0.5, 1.0, 2.0):
            loss = 1.0 + 30.0 * d**-0.5 + (0.0 if m == best_at[d] else 0.01)
            point = _batch_point(32, 10.0, lr_mult=m).model_copy(
                update={"data_size": d, "best_eval_loss": loss}
            )
            children.append(_child(f"D={d}, lr×{m:g}", point))
    out = _written(_stored("data", target_loss=1.2), _ctx(children))
    # log m(D) runs from log 0.5 at D=64 to log 2 at D=16384: m(1024) = 1 exactly; the
    # nearest grid runs at 256 and 4096 are ×0.5·2^(1/2)→×1 (tie broken to the first) and ×2·…
    chosen = out["sweep"]["data"]["lr_multipliers"]
    assert chosen["64"] == 0.5 and chosen["16384"] == 2.0
    assert chosen["1024"] == 1.0
    assert chosen["256"] in (0.5, 1.0) and chosen["4096"] in (1.0, 2.0)
    assert "smallest and on the largest" in out["sweep"]["data"]["lr_rule"]


def test_a_data_sweep_plans_every_subset_at_every_grid_multiplier_with_a_decayed_schedule():
    body = SweepJobCreate.model_validate(
        _body("data", data_sizes=[16, 32, 64, 128], max_steps=50, schedule="cosine")
        | {"optimizer": {"lr": 1e-3, "base_batch_size": 32, "lr_grid": [0.5, 1.0, 2.0]}}
    )
    points = [c.request.point for c in plan_points(body, n_train=200)]
    assert len(points) == 12
    assert {p.schedule for p in points} == {"cosine"}
    assert {(p.data_size, p.lr_multiplier) for p in points} == {
        (d, m) for d in (16, 32, 64, 128) for m in (0.5, 1.0, 2.0)
    }
    assert all(p.lr == pytest.approx(1e-3 * p.lr_multiplier) for p in points)


def test_points_follow_the_learning_rate_rule_and_the_grid():
    body = SweepJobCreate.model_validate(
        _body("batch", target_loss=1.0, batch_sizes=[8, 16, 32])
        | {"optimizer": {"lr": 1e-3, "base_batch_size": 8, "lr_rule": "grid", "lr_grid": [0.5, 2]}}
    )
    points = plan_points(body, n_train=100)
    lrs = {(p.batch_size, p.lr_multiplier): p.lr for p in (c.request.point for c in points)}
    assert lrs[(32, 2.0)] == pytest.approx(1e-3 * 2 * 2.0)  # √(32/8) = 2
    assert lrs[(8, 0.5)] == pytest.approx(0.5e-3)
    with pytest.raises(JobError, match="exceed the training data"):
        plan_points(body, n_train=16)


def test_a_data_point_trains_on_a_nested_subset_for_its_whole_decayed_schedule():
    import torch

    from curvplan_worker.curvature.model import build_model
    from curvplan_worker.curvature.objective import objective_for
    from curvplan_worker.sweep.train import nested_order, train_point

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: threads only contend on a shared machine
    order = nested_order(100, 3)
    assert sorted(order.tolist()) == list(range(100))
    point = PointSettings(
        type="data",
        batch_size=8,
        lr=0.03,
        data_size=16,
        max_steps=120,
        eval_every=2,
        patience=3,
        schedule="wsd",
    )
    result = train_point(
        build_model(TINY_SPEC, seed=0),
        objective_for(TINY_SPEC),
        counting_data(64, 0),
        counting_data(32, 1),
        point,
        OptimizerSpec(lr=0.03, base_batch_size=8, warmup_steps=2),
    )
    torch.set_num_threads(threads)
    assert result.data_size == 16 and not result.censored
    assert result.best_eval_loss == min(result.eval_losses)
    assert result.eval_steps[-1] == 120  # no early stop: the cooldown is always run
    assert result.two_batch is not None and result.two_batch.b_small == 4


def test_the_sweep_parent_runs_on_the_cpu_queue_without_torch():
    import subprocess
    import sys

    code = "import sys, curvplan_worker.kinds.sweep; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0

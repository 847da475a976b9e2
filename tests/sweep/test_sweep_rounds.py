"""The data sweep's rounds in the kind (no database): a fan-in whose sizes do not bracket a
generated L(D)'s target fans out the next round within the caps, each size trains by the
epoch rule, and a sweep stopped by its caps names the round it could not run."""

from __future__ import annotations

import json
import math
import uuid
from pathlib import Path
from typing import Any, cast

import pytest
from sweep_helpers import TINY_SPEC

from curvplan.types.jobs import SweepJobCreate, SweepPointJobCreate
from curvplan.types.results import SweepJobResult
from curvplan.types.sweep import PointResult
from curvplan_worker.job_context import FanOut, JobContext
from curvplan_worker.kinds import load_request
from curvplan_worker.kinds.sweep import data_round_points, plan_points, run

E, A, BETA = 1.0, 20.0, 0.5
D_STAR = 1400.0
FIRST = [4096, 8192, 16384, 32768]


def _body(**sweep: Any) -> dict[str, Any]:
    return {
        "kind": "sweep",
        "model": TINY_SPEC,
        "train_data": str(uuid.uuid4()),
        "eval_data": str(uuid.uuid4()),
        "sweep": {
            "type": "data",
            "target_loss": E + A * D_STAR**-BETA,
            "data_sizes": FIRST,
            **sweep,
        },
    }


def _stored(**sweep: Any) -> SweepJobCreate:
    return cast(SweepJobCreate, load_request("sweep", json.dumps(_body(**sweep))))


def _finished(body: SweepJobCreate, sizes: list[int], round_number: int) -> list[dict[str, Any]]:
    """Round ``round_number``'s points as a fan-in sees them, trained to the ground truth
    (the grid's ×1 run best, the others 2 % worse)."""
    out = []
    for child in data_round_points(body, sizes, round_number):
        point = child.request.point
        assert point.data_size is not None
        loss = (E + A * point.data_size**-BETA) * (1.0 + 0.02 * abs(math.log2(point.lr_multiplier)))
        result = PointResult(
            batch_size=point.batch_size,
            batch_size_tokens=6.0 * point.batch_size,
            lr=point.lr,
            lr_multiplier=point.lr_multiplier,
            data_size=point.data_size,
            reached_target=False,
            censored=False,
            steps=float(point.max_steps),
            examples=float(point.max_steps * point.batch_size),
            best_eval_loss=loss,
            best_step=point.max_steps,
            eval_steps=[0, point.max_steps],
            eval_losses=[3.0, loss],
            seconds=0.01,
        )
        out.append(
            {
                "id": str(uuid.uuid4()),
                "kind": "sweep_point",
                "name": child.name,
                "status": "succeeded",
                "request": child.request.model_dump(mode="json", exclude_none=True),
                "result": {"point": result.model_dump(mode="json")},
                "error": None,
                "attempt": 1,
            }
        )
    return out


def _ctx(children: list[dict[str, Any]]) -> JobContext:
    return JobContext(
        job_id=str(uuid.uuid4()),
        attempt=2,
        data_dir=Path("."),
        send_progress=lambda *a: None,
        is_cancelled=lambda: False,
        children=children,
    )


def _json(result: object) -> dict[str, Any]:
    """A finished sweep's result (the kind returns its result model) as the job stores it."""
    assert isinstance(result, SweepJobResult), result
    return result.model_dump(mode="json")


def test_a_fan_in_that_does_not_bracket_the_target_queues_the_next_round() -> None:
    body = _stored()
    out = run(body, _ctx(_finished(body, FIRST, 1)))
    assert isinstance(out, FanOut)
    points = [cast(SweepPointJobCreate, c.request).point for c in out.children]
    assert {p.round for p in points} == {2}
    assert sorted({p.data_size or 0 for p in points}) == [1024, 2048]  # halvings to ≤ D* = 1,400
    assert len(points) == 2 * 3  # every lr-grid multiplier
    assert "below the smallest measured size 4,096" in out.message
    # with round 2 trained, the sweep ends bracketed, sized near the truth
    children = _finished(body, FIRST, 1) + _finished(body, [1024, 2048], 2)
    done = _json(run(body, _ctx(children)))
    data = done["sweep"]["data"]
    assert data["bracketed"] is True and [r["round"] for r in data["rounds"]] == [1, 2]
    answer = done["recommendation"]["budget"]["data"]
    assert answer["source"] == "data_sweep" and "n_for_target_loss" not in data["fit"]
    assert answer["recommended_examples"] == pytest.approx(D_STAR, rel=0.02)
    assert "epochs" in data["steps_rule"] and data["steps_per_size"]["1024"] == 320
    # the CLI's table: each size with its round and steps
    from curvplan.client.display import _data_sweep_text
    from curvplan.types.sweep import SweepResult

    text = _data_sweep_text(SweepResult.model_validate(done["sweep"]).data)
    row = next(line for line in text.splitlines() if line.lstrip().startswith("1,024"))
    assert row.split()[:3] == ["1,024", "2", "320"]
    assert "round 2: [1024, 2048]" in text and "NOT BRACKETED" not in text


def test_the_round_and_run_caps_stop_the_sweep_and_name_the_next_round() -> None:
    body = _stored(max_rounds=1)
    out = _json(run(body, _ctx(_finished(body, FIRST, 1))))
    data = out["sweep"]["data"]
    assert data["bracketed"] is False and data["next_round_sizes"] == [1024, 2048]
    assert any("caps stop it" in note for note in out["sweep"]["notes"])
    # the run cap trims a round to the sizes nearest the measured ones
    body = _stored(max_runs=len(FIRST) * 3 + 3)
    trimmed = run(body, _ctx(_finished(body, FIRST, 1)))
    assert isinstance(trimmed, FanOut)
    assert {cast(SweepPointJobCreate, c.request).point.data_size for c in trimmed.children} == {
        2048
    }


def test_each_size_trains_by_the_epoch_rule_and_a_capped_size_is_named() -> None:
    body = SweepJobCreate.model_validate(
        _body(data_sizes=[64, 640, 6400, 64000], epochs=4, min_steps=50, max_steps=5000)
    )
    steps = {
        c.request.point.data_size: c.request.point.max_steps
        for c in plan_points(body, n_train=64000)
    }
    # ceil(4 · D / 32), at least 50, at most 5,000: steps grow with the size
    assert steps == {64: 50, 640: 80, 6400: 800, 64000: 5000}
    # D* = 1,400 lies inside 64 … 64,000: one round
    out = _json(run(body, _ctx(_finished(body, [64, 640, 6400, 64000], 1))))
    assert out["sweep"]["data"]["capped_sizes"] == [64000]
    assert any("trained to the cap" in note for note in out["sweep"]["notes"])


def test_a_first_round_over_max_runs_is_refused_naming_the_field() -> None:
    from pydantic import ValidationError

    body = _body(data_sizes=[64, 128, 256, 512, 1024, 2048, 4096, 8192], max_runs=20)
    with pytest.raises(ValidationError) as info:
        SweepJobCreate.model_validate(body)  # 8 sizes × 3 multipliers = 24 > 20
    (error,) = info.value.errors()
    assert error["loc"] == ("sweep",) and "max_runs" in error["msg"] and "24" in error["msg"]
    SweepJobCreate.model_validate({**body, "sweep": {**body["sweep"], "max_runs": 24}})

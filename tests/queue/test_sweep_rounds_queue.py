"""A data sweep's rounds on the real queue: a real worker runs the sweep parent's fan-in, which
queues a second round when the first does not bracket the target, and finishes after it.

The parent's first attempt (the fan-out, which reads the training data's size from its
artifact) is done here with the kind's own ``plan_points``; the children (``sweep_point``,
gpu queue) are "trained" here by writing results from a generated ground truth
L(D) = E + A·D^(−β); everything else is the real worker on real PostgreSQL, including a fan-in
whose worker dies before it commits.
"""

from __future__ import annotations

import math
import uuid

import pytest
from queue_helpers import FAST, attempt_rows, insert_jobs, job_row, wait_for
from sqlalchemy import Engine, text

from curvplan.types.jobs import SweepJobCreate
from curvplan.types.sweep import PointResult, PointSettings
from curvplan_core.jobs import lifecycle
from curvplan_worker.kinds.sweep import plan_points

E, A, BETA = 1.0, 20.0, 0.5
D_STAR = 1400.0  # the size the target needs: below the first round's 4,096/1.5
TARGET = E + A * D_STAR**-BETA
TINY_SPEC = {
    "d_model": 8,
    "n_heads": 2,
    "d_ff": 16,
    "n_layers": 1,
    "task": {"type": "causal_lm", "vocab_size": 11, "seq_len": 6},
}


def _body() -> dict:
    return {
        "kind": "sweep",
        "model": TINY_SPEC,
        "train_data": str(uuid.uuid4()),
        "eval_data": str(uuid.uuid4()),
        "optimizer": {"lr_grid": [1.0]},
        "sweep": {
            "type": "data",
            "target_loss": TARGET,
            "data_sizes": [4096, 8192, 16384, 32768],
            "batch_size": 32,
        },
    }


def _loss(d: int) -> float:
    wobble = 1.0 + 1e-4 * math.sin(d)  # a deterministic, tiny measurement noise
    return (E + A * d**-BETA) * wobble


def _train_queued_points(db: Engine) -> list[int]:
    """Act as a gpu worker: claim every queued sweep_point and succeed it with L(D)."""
    sizes = []
    while True:
        with db.begin() as conn:
            claimed = lifecycle.claim(conn, "gpu-test", ["gpu"], 60.0)
        if claimed is None:
            return sorted(sizes)
        point = PointSettings.model_validate(claimed.request["point"])
        assert point.data_size is not None
        sizes.append(point.data_size)
        result = PointResult(
            batch_size=point.batch_size,
            batch_size_tokens=None,
            lr=point.lr,
            lr_multiplier=point.lr_multiplier,
            data_size=point.data_size,
            reached_target=False,
            censored=False,
            steps=float(point.max_steps),
            examples=float(point.max_steps * point.batch_size),
            best_eval_loss=_loss(point.data_size),
            best_step=point.max_steps,
            eval_steps=[0, point.max_steps],
            eval_losses=[3.0, _loss(point.data_size)],
            seconds=0.01,
        )
        with db.begin() as conn:
            status = lifecycle.mark_succeeded(
                conn, claimed.fence, result={"point": result.model_dump(mode="json")}
            )
        assert status == "succeeded"


def _children(db: Engine, parent: uuid.UUID) -> list:
    with db.connect() as conn:
        return list(
            conn.execute(
                text("SELECT id, status, request FROM job WHERE parent_id = :p"), {"p": parent}
            )
        )


def test_a_sweep_parent_queues_a_second_round_and_finishes_after_it(
    db, project_id, start_worker
) -> None:
    (parent,) = insert_jobs(db, project_id, [_body()], kind="sweep")
    with db.begin() as conn:  # the fan-out attempt, as the kind makes it
        claimed = lifecycle.claim(conn, "fan-out-test", ["cpu"], 60.0)
        assert claimed is not None and claimed.fence.job_id == parent
        body = SweepJobCreate.model_validate(claimed.request)
        children = [c.stored() for c in plan_points(body, n_train=40_000)]
        assert lifecycle.wait_for_children(conn, claimed.fence, children) == "running"
    assert _train_queued_points(db) == [4096, 8192, 16384, 32768]
    assert job_row(db, parent).status == "queued"  # the last point queued the fan-in

    # a worker claims the fan-in and dies before it commits anything
    with db.begin() as conn:
        dead = lifecycle.claim(conn, "dead-worker", ["cpu"], 0.5)
    assert dead is not None and dead.fence.job_id == parent

    start_worker(*FAST)  # reaps the dead attempt, then runs the fan-in for real
    wait_for(lambda: len(_children(db, parent)) > 4, 60, "the second round")
    row = job_row(db, parent)
    assert row.status == "running" and row.lease_expires_at is None
    assert row.progress["points_total"] == 6 and row.progress["points_done"] == 4
    points = [c.request["point"] for c in _children(db, parent)]
    second = [p for p in points if p.get("round") == 2]
    # D* = 1,400 < 4,096/1.5: halvings from 4,096 until one is at or below D*
    assert sorted(p["data_size"] for p in second) == [1024, 2048]
    assert all(p["max_steps"] == max(200, math.ceil(10 * p["data_size"] / 32)) for p in second)

    assert _train_queued_points(db) == [1024, 2048]
    done = wait_for(
        lambda: (r := job_row(db, parent)).status in ("succeeded", "failed") and r, 60, "fan-in"
    )
    assert done.status == "succeeded", done.error
    outcomes = [a.outcome for a in attempt_rows(db, parent)]
    # fan-out, the dead fan-in (reaped), the fan-in that queued round 2, the last fan-in
    assert outcomes[0] == "fanned-out" and outcomes[-2] == "fanned-out"
    assert outcomes[-1] == "succeeded" and len(outcomes) == 4
    assert len(_children(db, parent)) == 6  # round 2 queued exactly once
    data = done.result["sweep"]["data"]
    assert [r["data_sizes"] for r in data["rounds"]] == [[4096, 8192, 16384, 32768], [1024, 2048]]
    assert "below the smallest measured size 4,096" in data["rounds"][1]["reason"]
    assert data["bracketed"] is True and data["next_round_sizes"] is None
    answer = done.result["recommendation"]["budget"]["data"]
    assert answer["recommended_examples"] == pytest.approx(D_STAR, rel=0.02)
    assert done.result["sweep"]["points_total"] == 6

"""The branch sweep's plan and fan-in (no database): one point per (checkpoint, batch size)
over the same token window, and the CBS of each checkpoint from curves whose answer is known
by construction (L_B(x) = L∞ + Δ·exp(−x/(E_min·(1 + B/B_crit))), B_crit growing with the step)."""

from __future__ import annotations

import math
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from sweep_helpers import TINY_SPEC

from curvplan.types.jobs import SweepJobCreate
from curvplan.types.results import SweepJobResult
from curvplan.types.sweep import PointResult, PointSettings
from curvplan_core.planner.branched_batch import BRANCH_LEAD
from curvplan_worker.errors import JobError
from curvplan_worker.kinds import JobContext
from curvplan_worker.kinds.sweep import plan_points, run

CHECKPOINTS = [str(uuid.uuid4()) for _ in range(3)]
STEPS = [10, 100, 400]
B_CRIT_AT = {10: 6.0, 100: 30.0, 400: 200.0}  # the CBS grows over training
SIZES = [4, 8, 16, 32, 64]
EPS = 0.05


def _body(**sweep: Any) -> dict[str, Any]:
    settings = {
        "type": "branch",
        "batch_sizes": SIZES,
        "window_tokens": 6 * 1000,  # 1000 examples of 6 tokens → rounded to 4 × 256
        "window_evals": 4,
        "tolerance": EPS,
        **sweep,
    }
    return {
        "kind": "sweep",
        "model": TINY_SPEC,
        "train_data": str(uuid.uuid4()),
        "eval_data": str(uuid.uuid4()),
        "checkpoints": CHECKPOINTS,
        "optimizer": {"name": "adamw", "lr": 0.01, "base_batch_size": 16, "warmup_steps": 8},
        "sweep": settings,
    }


def _loss(step: int, b: int, examples: float, lr_multiplier: float = 1.0) -> float:
    tau = 300.0 * (1 + b / B_CRIT_AT[step]) * (1.0 if lr_multiplier == 1.0 else 1.5)
    return 0.5 + 1.0 * math.exp(-examples / tau)


def _result(point: PointSettings, step: int) -> PointResult:
    b = point.batch_size
    evals = list(range(0, point.max_steps + 1, point.eval_every))
    losses = [_loss(step, b, s * b, point.lr_multiplier) for s in evals]
    return PointResult(
        batch_size=b,
        batch_size_tokens=6.0 * b,
        lr=point.lr,
        lr_multiplier=point.lr_multiplier,
        reached_target=False,
        censored=False,
        steps=float(point.max_steps),
        examples=float(point.max_steps * b),
        best_eval_loss=min(losses),
        best_step=evals[-1],
        eval_steps=evals,
        eval_losses=losses,
        seconds=0.01,
    )


def _children(body: dict[str, Any], *, fail: set[tuple[int, int]] = frozenset()) -> list[dict]:
    planned = plan_points(SweepJobCreate.model_validate(body), 512, STEPS)
    out = []
    for c in planned:
        point = c.request.point
        step = point.checkpoint_step
        failed = (step, point.batch_size) in fail
        out.append(
            {
                "id": str(uuid.uuid4()),
                "kind": "sweep_point",
                "name": c.name,
                "status": "failed" if failed else "succeeded",
                "request": c.stored()["request"],
                "result": None
                if failed
                else {"point": _result(point, step).model_dump(mode="json")},
                "error": {"type": "diverged"} if failed else None,
                "attempt": 1,
            }
        )
    return out


def _fan_in(body: dict[str, Any], children: list[dict]) -> SweepJobResult:
    ctx = JobContext(
        job_id=str(uuid.uuid4()),
        attempt=2,
        data_dir=Path("."),
        send_progress=lambda *a: None,
        is_cancelled=lambda: False,
        children=children,
    )
    return SweepJobResult.model_validate(run(SweepJobCreate.model_validate(body), ctx))


def _expected_cbs(step: int) -> int:
    """The closed form: the largest swept B whose end-of-window loss is within ε of B=4's."""
    end = 4 * 256
    return max(b for b in SIZES if _loss(step, b, end) - _loss(step, SIZES[0], end) <= EPS)


def _expected_crossing(step: int) -> float:
    """The closed form of the ε-crossing: log-linear in B between the CBS and the next batch
    (the CBS itself when it is at an end of the sweep)."""
    end = 4 * 256
    cbs = _expected_cbs(step)
    if cbs in (SIZES[0], SIZES[-1]):
        return float(cbs)
    nxt = SIZES[SIZES.index(cbs) + 1]
    x_k, x_n = (_loss(step, b, end) - _loss(step, SIZES[0], end) for b in (cbs, nxt))
    return cbs * (nxt / cbs) ** ((EPS - x_k) / (x_n - x_k))


def _lead_batch(step: int) -> int:
    """The batch the leading estimate (the ε-crossing, BRANCH_LEAD) gives: nearest power of 2."""
    return 2 ** round(math.log2(_expected_crossing(step)))


def test_the_plan_trains_every_checkpoint_at_every_batch_over_the_same_tokens() -> None:
    children = plan_points(SweepJobCreate.model_validate(_body()), 512, STEPS)
    assert len(children) == len(CHECKPOINTS) * len(SIZES)
    for c in children:
        point = c.request.point
        b = point.batch_size
        assert point.type == "branch" and point.schedule == "constant"
        assert point.max_steps * b == 1024  # ⌈1000 / 4 / 64⌉·64·4 examples, every batch
        assert point.eval_every * b == 256  # the evaluations fall on the same tokens
        assert point.lr == pytest.approx(0.01 * math.sqrt(b / 16))  # the sqrt rule
        # the warm-up covers the same examples at every batch: 8 steps of batch 4
        assert c.request.optimizer.warmup_steps == max(1, math.ceil(8 * 4 / b))
        assert str(c.request.checkpoint) == CHECKPOINTS[STEPS.index(point.checkpoint_step)]
        assert c.name == f"step {point.checkpoint_step}, B={b}"
    # a window longer than max_steps steps of the smallest batch: refused by the contract
    # (the API's 422), and by the planner for a request stored before the contract did
    with pytest.raises(ValidationError, match=r"sweep\.window_tokens"):
        SweepJobCreate.model_validate(_body(max_steps=100))
    stored = SweepJobCreate.model_validate(_body())
    stored.sweep.max_steps = 100  # validate_assignment is off: as an old stored request
    with pytest.raises(JobError, match=r"sweep\.window_tokens"):
        plan_points(stored, 512, STEPS)
    with pytest.raises(JobError, match=r"sweep\.batch_sizes"):
        plan_points(SweepJobCreate.model_validate(_body()), 32, STEPS)


def test_a_checkpoints_optimizer_state_goes_to_its_branches_the_others_warm_their_moments():
    from pydantic import ValidationError

    state = str(uuid.uuid4())
    body = _body() | {"optimizer_states": [state, None, None]}
    job = SweepJobCreate.model_validate(body)
    for c in plan_points(job, 512, STEPS):
        first = c.request.point.checkpoint_step == STEPS[0]
        assert (str(c.request.optimizer_state) if first else None) == (state if first else None)
        assert c.request.point.moment_warmup_steps == (0 if first else 20)  # the default
    plain = plan_points(SweepJobCreate.model_validate(_body(moment_warmup_steps=0)), 512, STEPS)
    assert {c.request.point.moment_warmup_steps for c in plain} == {0}
    assert {c.request.optimizer_state for c in plain} == {None}
    bad = {
        "optimizer_states": body | {"optimizer_states": [state]},
        "optimizer_states ": body | {"optimizer": {"name": "sgd", "lr": 0.01}},
    }
    for field, request in bad.items():
        with pytest.raises(ValidationError) as err:
            SweepJobCreate.model_validate(request)
        assert err.value.errors()[0]["loc"][0] == field.strip(), err.value


def test_the_fan_in_gives_each_checkpoints_closed_form_cbs_and_the_warmup_schedule() -> None:
    body = _body()
    result = _fan_in(body, _children(body))
    branch = result.sweep.branch
    assert result.sweep.type == "branch" and branch is not None
    expected = {step: _expected_cbs(step) for step in STEPS}
    assert len(set(expected.values())) == 3  # the construction moves the CBS with the step
    assert [(c.step, c.critical_batch) for c in branch.checkpoints] == list(expected.items())
    assert BRANCH_LEAD == "eps_crossing"  # the schedule follows the leading estimate
    lead = {step: _lead_batch(step) for step in STEPS}
    assert lead != expected  # the crossing moves the step-100 stage off the ladder's 8
    assert [(s.from_step, s.batch_size) for s in branch.warmup_schedule] == list(lead.items())
    for c in branch.checkpoints:
        assert c.loss == pytest.approx(1.5) and c.reference_batch == 4
        assert c.crossing is not None and c.efficiency is not None
        assert c.crossing.value == pytest.approx(_expected_crossing(c.step), rel=1e-12)
        # L_B(x) = L_B₀(x·(B_c + B₀)/(B_c + B)) by construction: the efficiency fit recovers
        # B_crit (the monotone cubic through 4 evaluations of the curve: within 5 %)
        assert c.efficiency.status == "measured"
        assert c.efficiency.value == pytest.approx(B_CRIT_AT[c.step], rel=0.05)
        assert c.efficiency.low < B_CRIT_AT[c.step]
        assert c.efficiency.high is None or B_CRIT_AT[c.step] < c.efficiency.high
        for curve in c.curves[1:]:
            b_c, b = B_CRIT_AT[c.step], curve.batch_size
            assert curve.reference_reach == "inside"
            exact = 1024 * (b_c + 4) / (b_c + b)
            assert curve.reference_examples == pytest.approx(exact, rel=0.02)
        for curve in c.curves:  # one curve per batch, all on the same token marks
            assert curve.tokens == [0.0, 1536.0, 3072.0, 4608.0, 6144.0]
            ref = next(k for k in c.curves if k.batch_size == 4)
            assert curve.excess == pytest.approx(curve.losses[-1] - ref.losses[-1], abs=1e-12)
            assert curve.within_tolerance is (curve.batch_size <= c.critical_batch)
    assert branch.window_tokens == 6144.0 and branch.window_examples == 1024
    assert branch.examples_processed == 1024 * 15 and branch.tokens_processed == 6144.0 * 15
    assert "ε = 0.05" in branch.rule and "end of the window" in branch.rule
    assert result.sweep.points_used == 15
    measured = result.measurements["branched_critical_batch"]
    assert [p["critical_batch"] for p in measured["checkpoints"]] == list(expected.values())
    batch = result.recommendation.budget.batch  # the sweep's own budget leads with it
    assert batch.source == "branch_sweep" and batch.recommended == lead[400]
    assert batch.critical_method == "eps_crossing"
    assert [e.method for e in batch.branch_estimates] == [
        "ladder",
        "efficiency_fit",
        "eps_crossing",
    ]


def test_the_grid_keeps_the_lowest_window_end_and_failed_branches_do_not_keep_up() -> None:
    body = _body()
    body["optimizer"] |= {"lr_rule": "grid", "lr_grid": [1.0, 2.0]}
    fail = {(400, 64), (10, 4)}  # a diverged large batch; a failed reference branch
    result = _fan_in(body, _children(body, fail=fail))
    branch = result.sweep.branch
    by_step = {c.step: c for c in branch.checkpoints}
    assert by_step[10].critical_batch is None and "reference branch" in by_step[10].notes[0]
    assert by_step[400].critical_batch == 32  # 64 failed: not within (closed form says 64)
    assert _expected_cbs(400) == 64
    assert any("failed" in n for n in by_step[400].notes)
    assert [s.from_step for s in branch.warmup_schedule] == [100, 400]
    for c in by_step[100].curves:
        assert c.lr_multiplier == 1.0  # the ×2 multiplier's curves end higher by construction
    excluded = [p for p in result.sweep.points if p.excluded_reason]
    assert all("learning rate" in p.excluded_reason or p.result is None for p in excluded)
    assert len(result.sweep.failed_points) == 4  # both multipliers of each failed pair


def _stuck(children: list[dict], step: int) -> list[dict]:
    """The branches of ``step`` replaced by a window where no batch progresses: every loss
    wanders within 0.01 of 1.781, the reference ends at 1.788 (above where it started)."""
    for child in children:
        point = child["request"]["point"]
        if point["checkpoint_step"] != step or child["result"] is None:
            continue
        result = child["result"]["point"]
        n = len(result["eval_losses"])
        drift = 0.007 + 0.001 * math.log2(point["batch_size"] / SIZES[0])
        losses = [1.781 + drift * i / (n - 1) for i in range(n)]
        result |= {"eval_losses": losses, "best_eval_loss": min(losses)}
    return children


def test_a_checkpoint_where_the_reference_does_not_progress_is_not_measured() -> None:
    body = _body()
    result = _fan_in(body, _stuck(_children(body), 400))
    branch = result.sweep.branch
    by_step = {c.step: c for c in branch.checkpoints}
    late = by_step[400]
    # every batch's excess is within ε = 0.05, yet nothing is called measured
    assert all(0 <= c.excess <= EPS for c in late.curves)
    assert late.status == "not_measured" and late.critical_batch is None
    assert late.crossing is None and late.efficiency is None
    assert all(c.within_tolerance is None for c in late.curves)
    assert any("1.7810 → 1.7880" in n and "batch 4" in n for n in late.notes)
    assert by_step[100].critical_batch == _expected_cbs(100)  # the others are untouched
    assert [s.from_step for s in branch.warmup_schedule] == [10, 100]
    assert "no CBS at step 400" in branch.schedule_note
    points = result.measurements["branched_critical_batch"]["checkpoints"]
    assert points[-1]["status"] == "not_measured" and "1.7880" in points[-1]["reason"]
    batch = result.recommendation.budget.batch  # step 100 leads, and step 400 is named
    assert batch.source == "branch_sweep" and batch.recommended == _lead_batch(100)
    warnings = result.recommendation.budget.warnings
    assert any("not measured at step 400" in w for w in warnings)


def test_a_branch_sweep_whose_every_reference_failed_fails_saying_so() -> None:
    body = _body()
    with pytest.raises(JobError, match="reference branch"):
        _fan_in(body, _children(body, fail={(s, 4) for s in STEPS}))


def test_the_request_names_the_field_that_is_wrong() -> None:
    from pydantic import ValidationError

    cases = {
        "checkpoints": {**_body(), "checkpoints": []},
        "sweep": {**_body(), "sweep": {"type": "branch", "batch_sizes": SIZES}},
    }
    steps = _body(checkpoint_steps=[1, 2])
    for field, bad in {**cases, "checkpoints ": steps}.items():
        with pytest.raises(ValidationError) as err:
            SweepJobCreate.model_validate(bad)
        assert err.value.errors()[0]["loc"][0] == field.strip(), err.value
    batch = {**_body(type="batch", target_loss=1.0)}
    with pytest.raises(ValidationError, match="only a branch sweep takes checkpoints"):
        SweepJobCreate.model_validate(batch)


def test_the_cli_and_the_report_page_show_the_branch_table_and_the_schedule() -> None:
    from datetime import UTC, datetime

    from curvplan.client.display import budget_text, sweep_text
    from curvplan.types.jobs import JobOut
    from curvplan_server.reports.page import render_report

    body = _body()
    result = _fan_in(body, _children(body))
    now = datetime.now(UTC).isoformat()
    job = {
        "id": str(uuid.uuid4()),
        "kind": "sweep",
        "queue": "cpu",
        "status": "succeeded",
        "name": "branch",
        "tags": {},
        "progress": None,
        "attempt": 2,
        "max_attempts": 3,
        "cancel_requested": False,
        "result": result.model_dump(mode="json"),
        "error": None,
        "created_at": now,
        "updated_at": now,
        "started_at": now,
        "finished_at": now,
        "links": {"self": "/", "cancel": "/", "recommendation": "/"},
    }
    typed = JobOut.model_validate(job)
    assert type(typed.result) is SweepJobResult  # a sweep's result is typed by its kind
    text = sweep_text(typed)
    cbs = [_lead_batch(c.step) for c in result.sweep.branch.checkpoints]
    assert text is not None and "BRANCH SWEEP" in text
    assert "efficiency B_c" in text and "ε-crossing" in text
    for step, b in zip(STEPS, cbs, strict=True):
        assert f"from step {step}: {b}" in text
    assert "[8, 16)" in text or "[16, 32)" in text  # a measured bracket
    budget = budget_text(result.recommendation.budget)
    assert "branch_sweep" in budget and "warm-up (step: batch)" in budget
    assert f"10: {cbs[0]}, 100: {cbs[1]}, 400: {cbs[2]}" in budget
    page = render_report(job, plots=[])
    assert 'id="branch-sweep"' in page and "Batch-size warm-up schedule" in page
    assert "efficiency B_c" in page and "critical batch (eps_crossing)" in page
    # the page's budget is the CLI's: the same rows from the one budget summary
    section = page[page.index('<section id="budget">') : page.index("</section>")]
    assert "warm-up (step: batch)" in section
    assert f"10: {cbs[0]}, 100: {cbs[1]}, 400: {cbs[2]}" in section

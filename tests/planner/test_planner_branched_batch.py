"""Branched critical batch size (Merrill et al. 2025) on loss-vs-tokens curves whose answer is
known by construction, the warm-up schedule, and the branch result leading budget.batch."""

from __future__ import annotations

import math

import pytest

from curvplan.types.planner import (
    BranchedBatchEstimate,
    BranchedBatchPoint,
    BranchedCriticalBatch,
    Measurements,
    Targets,
)
from curvplan_core.planner import make_plan
from curvplan_core.planner.branched_batch import (
    CROSSING_FORMULA,
    EFFICIENCY_FORMULA,
    BranchLosses,
    branch_budget_batch,
    critical_batch_from_branches,
    efficiency_fit,
    eps_crossing,
    nearest_power_of_two,
    reference_examples,
    warmup_schedule,
)

SWEPT = [8, 16, 32, 64, 128, 256]
E_MIN, B_CRIT, WINDOW = 2000.0, 48.0, 4096.0  # examples
L_INF, DELTA = 1.0, 1.5
MARKS = [0.0, 1024.0, 2048.0, 3072.0, 4096.0]


def mccandlish_curve(b: int) -> BranchLosses:
    """L_B(x) = L∞ + Δ·exp(−x/τ_B) with τ_B = E_min·(1 + B/B_crit): a batch B needs
    (1 + B/B_crit) times the examples of a tiny batch for the same progress (McCandlish et
    al. 2018, E = E_min(1 + B/B_crit))."""
    tau = E_MIN * (1 + b / B_CRIT)
    return BranchLosses(b, MARKS, [L_INF + DELTA * math.exp(-x / tau) for x in MARKS])


def threshold_batch(tolerance: float) -> float:
    """The B† with L_B†(W) − L_B₀(W) = ε, solved in closed form: every swept B ≤ B† is within."""
    tau0 = E_MIN * (1 + SWEPT[0] / B_CRIT)
    tau = -WINDOW / math.log(tolerance / DELTA + math.exp(-WINDOW / tau0))
    return B_CRIT * (tau / E_MIN - 1)


@pytest.mark.parametrize("tolerance", [0.08, 0.2, 0.5, 0.7])
def test_the_cbs_is_the_largest_swept_batch_below_the_closed_form_threshold(tolerance) -> None:
    b_dagger = threshold_batch(tolerance)
    expected = max(b for b in SWEPT if b <= b_dagger)
    assert SWEPT[0] < expected < SWEPT[-1], "the tolerances bracket the CBS inside the sweep"
    verdict = critical_batch_from_branches([mccandlish_curve(b) for b in SWEPT], tolerance)
    assert verdict.critical_batch == expected
    assert verdict.status == "measured"
    assert verdict.next_batch == SWEPT[SWEPT.index(expected) + 1]
    assert verdict.next_batch > b_dagger  # the bracket [CBS, next) holds the threshold
    assert verdict.reference_batch == 8 and verdict.excess[8] == 0.0
    for b in SWEPT:  # the excess is the closed-form loss gap at the end of the window
        gap = mccandlish_curve(b).losses[-1] - mccandlish_curve(8).losses[-1]
        assert verdict.excess[b] == pytest.approx(gap if b != 8 else 0.0, abs=1e-12)
        assert verdict.within[b] is (b <= b_dagger)
    assert verdict.notes == []


def _flat(b: int, end_excess: float, mid_excess: float = 0.0) -> BranchLosses:
    reference = [2.0, 1.8, 1.6, 1.5, 1.4]
    gaps = [0.0, mid_excess, mid_excess, mid_excess, end_excess]
    return BranchLosses(b, MARKS, [r + g for r, g in zip(reference, gaps, strict=True)])


def test_an_excess_exactly_at_the_tolerance_is_within_and_just_above_is_not() -> None:
    eps = 0.01
    branches = [_flat(8, 0.0), _flat(16, eps), _flat(32, eps * (1 + 1e-6)), _flat(64, 1.0)]
    verdict = critical_batch_from_branches(branches, eps)
    assert verdict.within == {8: True, 16: True, 32: False, 64: False}
    assert (verdict.critical_batch, verdict.status, verdict.next_batch) == (16, "measured", 32)


def test_equal_curves_tie_and_keep_up_so_the_largest_batch_is_at_least() -> None:
    verdict = critical_batch_from_branches([_flat(b, 0.0) for b in SWEPT], 0.01)
    assert all(verdict.within.values())
    assert (verdict.critical_batch, verdict.status, verdict.next_batch) == (256, "at_least", None)
    assert "at least 256" in verdict.notes[0]


def test_none_within_the_tolerance_leaves_the_smallest_batch_as_an_upper_bracket() -> None:
    verdict = critical_batch_from_branches(
        [_flat(8, 0.0)] + [_flat(b, 0.5) for b in SWEPT[1:]], 0.1
    )
    assert verdict.within == {b: b == 8 for b in SWEPT}
    assert (verdict.critical_batch, verdict.status, verdict.next_batch) == (8, "at_most", 16)
    assert "below 16" in verdict.notes[0]


def test_window_comparison_needs_the_whole_window_within_end_only_the_last_point() -> None:
    lagging = _flat(16, end_excess=0.0, mid_excess=0.05)  # catches up by the end
    branches = [_flat(8, 0.0), lagging, _flat(32, 0.5)]
    end = critical_batch_from_branches(branches, 0.01, "end")
    window = critical_batch_from_branches(branches, 0.01, "window")
    assert (end.critical_batch, end.status) == (16, "measured")
    assert (window.critical_batch, window.status) == (8, "at_most")
    assert window.excess[16] == pytest.approx(0.05)


def test_a_non_monotone_sweep_takes_the_largest_within_and_says_so() -> None:
    branches = [_flat(8, 0.0), _flat(16, 0.3), _flat(32, 0.0), _flat(64, 0.3)]
    verdict = critical_batch_from_branches(branches, 0.01)
    assert (verdict.critical_batch, verdict.next_batch) == (32, 64)
    assert "not monotone" in verdict.notes[0] and "16" in verdict.notes[0]


def test_failed_branches_are_not_within_and_a_failed_reference_has_no_cbs() -> None:
    verdict = critical_batch_from_branches(
        [_flat(8, 0.0), _flat(16, 0.0), _flat(64, 0.0)], 0.01, failed_batches=[32]
    )
    assert verdict.within[32] is False and verdict.excess[32] is None
    assert verdict.critical_batch == 64  # the rule is the largest within, as stated
    with pytest.raises(ValueError, match="reference branch"):
        critical_batch_from_branches([_flat(16, 0.0), _flat(32, 0.0)], 0.01, failed_batches=[8])
    with pytest.raises(ValueError, match="no evaluation at"):
        short = BranchLosses(16, MARKS[:-1], _flat(16, 0.0).losses[:-1])
        critical_batch_from_branches([_flat(8, 0.0), short], 0.01)


def _point(step: int | None, cbs: int, status: str = "measured") -> BranchedBatchPoint:
    return BranchedBatchPoint(step=step, critical_batch=cbs, status=status, next_batch=cbs * 2)


def test_the_warmup_schedule_follows_the_steps_merges_equal_batches_and_flags_drops() -> None:
    points = [_point(400, 64), _point(25, 8, "at_most"), _point(100, 32), _point(200, 32)]
    stages, note = warmup_schedule(points, tokens_per_example=32.0)
    assert [(s.from_step, s.batch_size) for s in stages] == [(25, 8), (100, 32), (400, 64)]
    assert stages[0].batch_size_tokens == 256.0 and stages[0].status == "at_most"
    assert "before it no CBS was measured" in note and "decreases" not in note
    stages, note = warmup_schedule([_point(0, 16), _point(50, 64), _point(90, 32)])
    assert [(s.from_step, s.batch_size) for s in stages] == [(0, 16), (50, 64), (90, 32)]
    assert "decreases at step 90: 64 → 32" in note
    stages, note = warmup_schedule([_point(None, 16), _point(10, 8)])
    assert [(s.from_step, s.batch_size) for s in stages] == [(10, 8), (None, 16)]
    assert "declare no step" in note


def _branched(points: list[BranchedBatchPoint]) -> dict:
    return {
        "checkpoints": [p.model_dump() for p in points],
        "tolerance": 0.01,
        "compare": "end",
        "window_tokens": 4096.0,
        "batch_sizes": [8, 16, 32, 64],
    }


def test_a_branch_sweep_alone_leads_budget_batch() -> None:
    branched = _branched([_point(50, 16), _point(10, 8, "at_most"), _point(200, 32)])
    rec = make_plan(
        Measurements.model_validate({"branched_critical_batch": branched, "tokens_per_example": 6}),
        Targets(target_loss=1.0),
    )
    batch = rec.budget.batch
    assert batch.source == "branch_sweep"
    assert (batch.recommended, batch.critical, batch.critical_bracket) == (32, 32.0, (32, 64))
    assert batch.recommended_tokens == 192.0
    assert [(s.from_step, s.batch_size) for s in batch.warmup_schedule] == [
        (10, 8),
        (50, 16),
        (200, 32),
    ]
    assert batch.critical_formula.startswith("budget.branched_cbs: ")
    assert "Merrill et al. 2025" in batch.basis and "ε = 0.01" in batch.basis
    assert batch.expected_steps is None  # S_min needs a batch sweep


def test_a_batch_sweep_leads_over_a_branch_sweep_whose_schedule_rides_along() -> None:
    """The order the predictive benchmark decided (BATCH_SOURCE_ORDER): the batch sweep's
    B_crit predicted the brute-force B_crit, the branch sweep's CBS did not."""
    steps = [{"batch_size": b, "steps": 40.0 * (1 + 20.0 / b)} for b in (4, 8, 16, 32, 64)]
    branched = _branched([_point(50, 16), _point(10, 8, "at_most"), _point(200, 32)])
    rec = make_plan(
        Measurements.model_validate(
            {"branched_critical_batch": branched, "steps_to_target": steps, "tokens_per_example": 6}
        ),
        Targets(target_loss=1.0),
    )
    batch = rec.budget.batch
    assert batch.source == "batch_sweep"
    b_crit = rec.batch_size.b_crit
    assert batch.critical == pytest.approx(b_crit.value) == pytest.approx(20.0, rel=1e-6)
    assert batch.recommended == 16  # the power of two nearest B_crit 20
    assert batch.expected_steps is not None
    assert [(s.from_step, s.batch_size) for s in batch.warmup_schedule] == [
        (10, 8),
        (50, 16),
        (200, 32),
    ]
    assert any("does not lead" in w and "branch sweep" in w for w in rec.budget.warnings)
    without = make_plan(Measurements(steps_to_target=steps), Targets(target_loss=1.0))
    assert without.budget.batch.source == "batch_sweep"
    assert without.budget.batch.warmup_schedule == []
    assert without.budget.batch.critical == pytest.approx(batch.critical)


def test_a_cbs_at_the_edge_of_the_sweep_warns_with_its_bracket() -> None:
    rec = make_plan(
        Measurements.model_validate(
            {"branched_critical_batch": _branched([_point(5, 8, "at_most")])}
        ),
        Targets(),
    )
    batch = rec.budget.batch
    assert batch.critical_bracket == (None, 16)
    assert any("below 16" in w for w in rec.budget.warnings)
    assert batch.expected_steps is None and "batch sweep" in batch.reason


# ------------------------------------------------------------- continuous estimates
# The token-efficiency model (McCandlish et al. 2018, eq. 2.11): at equal progress a batch B
# needs (B_c + B)/(B_c + B₀) times the examples of B₀, so B's curve is the reference's at
# effective examples x·(B_c + B₀)/(B_c + B). The fit must give B_c back.

EFF_SWEPT = [8, 16, 32, 64, 128, 256]
EFF_WINDOW = 4096.0


def _hyperbolic(e: float) -> float:
    """L(e) = a + b/(1 + e/c): the reference's loss after e examples (a convex decrease)."""
    return 2.0 + 1.5 / (1 + e / 900.0)


def _linear(e: float) -> float:
    return 3.0 - 2e-4 * e


def _model_branches(b_c: float, reference, n_evals: int) -> list[BranchLosses]:
    marks = [EFF_WINDOW * i / n_evals for i in range(n_evals + 1)]
    return [
        BranchLosses(b, marks, [reference(x * (b_c + 8) / (b_c + b)) for x in marks])
        for b in EFF_SWEPT
    ]


@pytest.mark.parametrize("b_c", [5.0, 40.0, 300.0])
def test_the_efficiency_fit_recovers_b_crit_exactly_where_interpolation_is_exact(b_c) -> None:
    fit = efficiency_fit(_model_branches(b_c, _linear, 4), tolerance=0.01)
    assert fit.estimate.status == "measured" and fit.estimate.method == "efficiency_fit"
    assert fit.estimate.value == pytest.approx(b_c, rel=1e-6)
    assert fit.estimate.rms_residual == pytest.approx(0.0, abs=1e-6)
    assert fit.estimate.formula.startswith("budget.branched_efficiency: ")
    for p in fit.points:  # e_B = E·(B_c + B₀)/(B_c + B), the model's own ratio
        assert p.reach == "inside"
        assert p.examples == pytest.approx(EFF_WINDOW * (b_c + 8) / (b_c + p.batch_size))
        assert fit.per_batch[p.batch_size] == pytest.approx(b_c, rel=1e-6)
    # the ±ε bracket: every larger batch ε worse reads B_c lower, ε better higher
    assert fit.estimate.low < b_c < fit.estimate.high


@pytest.mark.parametrize("b_c", [5.0, 40.0, 300.0])
def test_the_efficiency_fit_recovers_b_crit_on_curved_losses_with_dense_evaluations(b_c) -> None:
    dense = efficiency_fit(_model_branches(b_c, _hyperbolic, 256), tolerance=0.01)
    assert dense.estimate.value == pytest.approx(b_c, rel=2e-3)
    # four evaluations (the sweep's default): the monotone cubic through them bends with the
    # curve, within 7 % here (straight chords read e_B late and put B_c up to 42 % high)
    coarse = efficiency_fit(_model_branches(b_c, _hyperbolic, 4), tolerance=0.01).estimate
    assert coarse.value == pytest.approx(b_c, rel=0.07)


def test_reference_examples_are_the_first_passage_clipped_to_the_window() -> None:
    ref = BranchLosses(8, [0.0, 100.0, 200.0, 300.0], [2.0, 1.8, 1.9, 1.5])
    first, reach = reference_examples(ref, 1.9)  # the first passage, not the later one
    assert reach == "inside" and 0 < first < 100
    later, reach = reference_examples(ref, 1.6)
    assert reach == "inside" and 200 < later < 300
    straight = BranchLosses(8, [0.0, 100.0, 200.0], [2.0, 1.8, 1.6])  # the cubic of a line
    assert reference_examples(straight, 1.75) == pytest.approx((125.0, "inside"))
    assert reference_examples(ref, 2.0) == (0.0, "not_reached")  # at the checkpoint's loss
    assert reference_examples(ref, 2.3) == (0.0, "not_reached")
    assert reference_examples(ref, 1.5) == (300.0, "kept_up")  # only at the window's end
    assert reference_examples(ref, 1.2) == (300.0, "kept_up")
    with pytest.raises(ValueError, match="0 examples"):
        reference_examples(BranchLosses(8, [50.0, 100.0], [2.0, 1.8]), 1.9)


def test_every_batch_keeping_up_is_a_lower_bound_and_none_moving_an_upper_bound() -> None:
    equal = efficiency_fit([_flat(b, 0.0) for b in SWEPT], tolerance=0.01)
    assert {p.reach for p in equal.points} == {"kept_up"}
    assert equal.estimate.status == "at_least"
    assert equal.estimate.high is None and equal.estimate.value == equal.estimate.low
    assert equal.estimate.low is not None and equal.estimate.low > 0
    assert all(v is None for v in equal.per_batch.values())  # no slowdown: B_c unbounded
    stuck = (
        [_flat(8, 0.0)]
        + [  # every larger batch ends above the checkpoint's loss
            BranchLosses(b, MARKS, [2.0, 2.1, 2.1, 2.05, 2.02]) for b in SWEPT[1:]
        ]
    )
    bound = efficiency_fit(stuck, tolerance=0.01)
    assert {p.reach for p in bound.points} == {"not_reached"}
    assert bound.estimate.status == "at_most"
    assert bound.estimate.low is None and bound.estimate.value == bound.estimate.high == 8.0
    with pytest.raises(ValueError, match="tolerance"):
        efficiency_fit(stuck, tolerance=0.0)
    with pytest.raises(ValueError, match="two batch sizes"):
        efficiency_fit(stuck[:1], tolerance=0.01)


def test_noisy_curves_give_a_bounded_estimate_and_never_crash() -> None:
    import random

    rng = random.Random(7)
    clean = _model_branches(40.0, _hyperbolic, 4)
    statuses = set()
    for _ in range(200):
        noisy = [
            BranchLosses(
                br.batch_size,
                br.examples,
                [br.losses[0]] + [v + rng.gauss(0, 0.05) for v in br.losses[1:]],
            )
            for br in clean
        ]
        e = efficiency_fit(noisy, tolerance=0.01).estimate
        statuses.add(e.status)
        assert e.value > 0 and math.isfinite(e.value)
        assert e.low is None or e.low <= e.value
        assert e.high is None or e.value <= e.high
        assert e.rms_residual is not None and e.rms_residual >= 0
    assert "measured" in statuses


def test_the_eps_crossing_interpolates_the_excess_in_log_b_inside_the_ladder_bracket() -> None:
    branches = [_flat(8, 0.0), _flat(16, 0.004), _flat(32, 0.022), _flat(64, 0.5)]
    verdict = critical_batch_from_branches(branches, 0.01)
    crossing = eps_crossing(verdict, 0.01)
    fraction = (0.01 - 0.004) / (0.022 - 0.004)  # 1/3 of the way from 16 to 32 in log B
    assert crossing.value == pytest.approx(16 * 2**fraction, rel=1e-12)
    assert (crossing.status, crossing.low, crossing.high) == ("measured", 16.0, 32.0)
    assert crossing.formula.startswith("budget.branched_crossing: ")
    at_most = critical_batch_from_branches([_flat(8, 0.0), _flat(16, 0.5)], 0.01)
    assert (eps_crossing(at_most, 0.01).value, eps_crossing(at_most, 0.01).low) == (8.0, None)
    at_least = critical_batch_from_branches([_flat(8, 0.0), _flat(16, 0.0)], 0.01)
    assert eps_crossing(at_least, 0.01).value == 16.0
    assert eps_crossing(at_least, 0.01).status == "at_least"


def test_nearest_power_of_two_rounds_in_log_ties_down() -> None:
    assert [nearest_power_of_two(v) for v in (1.0, 16.9, 22.6, 22.7, 28.9, 45.0)] == [
        1,
        16,
        16,
        32,
        32,
        32,
    ]
    with pytest.raises(ValueError):
        nearest_power_of_two(0.0)


def _estimated(step: int, cbs: int, efficiency: float, crossing: float) -> BranchedBatchPoint:
    def est(method: str, value: float, formula: str) -> BranchedBatchEstimate:
        return BranchedBatchEstimate(
            method=method, value=value, status="measured", low=cbs, high=cbs * 2.0, formula=formula
        )

    return BranchedBatchPoint(
        step=step,
        critical_batch=cbs,
        status="measured",
        next_batch=cbs * 2,
        efficiency=est("efficiency_fit", efficiency, EFFICIENCY_FORMULA),
        crossing=est("eps_crossing", crossing, CROSSING_FORMULA),
    )


@pytest.mark.parametrize(
    ("lead", "critical", "recommended", "bracket"),
    [
        ("ladder", 16.0, 16, (16, 32)),
        ("eps_crossing", 28.9, 32, (16, 32)),
        ("efficiency_fit", 53.0, 64, None),
    ],
)
def test_the_leading_estimate_is_critical_and_its_power_of_two_recommended(
    lead, critical, recommended, bracket
) -> None:
    measured = BranchedCriticalBatch.model_validate(
        _branched([_estimated(40, 8, 20.0, 11.0), _estimated(240, 16, 53.0, 28.9)])
        | {"checkpoints": [_estimated(40, 8, 20.0, 11.0), _estimated(240, 16, 53.0, 28.9)]}
    )
    batch, warnings = branch_budget_batch(
        measured, target_loss=None, tokens_per_example=2.0, lead=lead
    )
    assert batch.critical_method == lead and batch.critical == critical
    assert batch.recommended == recommended and batch.critical_bracket == bracket
    assert batch.critical_tokens == critical * 2.0 and batch.recommended_tokens == recommended * 2
    assert [e.method for e in batch.branch_estimates] == [
        "ladder",
        "efficiency_fit",
        "eps_crossing",
    ]
    assert batch.warmup_schedule[-1].batch_size == recommended  # the schedule follows the lead
    assert not any("carries no" in w for w in warnings)


def test_a_checkpoint_without_the_leading_estimate_falls_back_to_the_ladder_saying_so() -> None:
    measured = BranchedCriticalBatch.model_validate(_branched([_point(50, 16)]))
    batch, warnings = branch_budget_batch(
        measured, target_loss=None, tokens_per_example=None, lead="eps_crossing"
    )
    assert (batch.critical_method, batch.critical, batch.recommended) == ("ladder", 16.0, 16)
    assert any("carries no eps_crossing estimate" in w for w in warnings)


# ------------------------------------------------------------ a reference that does not move
#: A late checkpoint's generated losses where no batch progresses over the window: the
#: reference (batch 8) goes 1.781 → 1.788, every larger batch wanders within ε of it.
STUCK = {
    8: [1.781, 1.783, 1.779, 1.785, 1.788],
    16: [1.781, 1.784, 1.782, 1.786, 1.790],
    32: [1.781, 1.780, 1.785, 1.787, 1.792],
    64: [1.781, 1.786, 1.784, 1.789, 1.794],
}


def test_a_reference_without_progress_is_not_measured_and_says_why_with_its_losses() -> None:
    branches = [BranchLosses(b, MARKS, losses) for b, losses in STUCK.items()]
    # the ladder alone would call every batch "within ε" (the issue this rule fixes)
    assert all(STUCK[b][-1] - STUCK[8][-1] <= 0.01 for b in STUCK)
    verdict = critical_batch_from_branches(branches, 0.01)
    assert verdict.status == "not_measured" and verdict.critical_batch is None
    assert verdict.within == {} and verdict.next_batch is None
    (reason,) = verdict.notes
    assert "1.7810 → 1.7880" in reason and "rose by 0.007" in reason and "batch 8" in reason
    with pytest.raises(ValueError, match="not measured"):
        eps_crossing(verdict, 0.01)


@pytest.mark.parametrize(("drop", "status"), [(0.01, "not_measured"), (0.0101, "at_least")])
def test_the_reference_must_fall_by_more_than_the_tolerance(drop, status) -> None:
    losses = [2.0, 2.0 - drop / 2, 2.0 - drop]
    branches = [BranchLosses(b, [0.0, 50.0, 100.0], losses) for b in (8, 16, 32)]
    assert critical_batch_from_branches(branches, 0.01).status == status


def _not_measured(step: int) -> BranchedBatchPoint:
    return BranchedBatchPoint(
        step=step, critical_batch=None, status="not_measured", reason="no progress: 1.78 → 1.79"
    )


def test_a_not_measured_checkpoint_carries_no_number_and_gives_no_stage() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="critical_batch is null exactly when"):
        BranchedBatchPoint(step=5, critical_batch=16, status="not_measured")
    with pytest.raises(ValidationError, match="critical_batch is null exactly when"):
        BranchedBatchPoint(step=5, critical_batch=None, status="measured")
    stages, note = warmup_schedule([_point(100, 16), _not_measured(400)])
    assert [(s.from_step, s.batch_size) for s in stages] == [(100, 16)]
    assert "no CBS at step 400" in note
    assert warmup_schedule([_not_measured(400)]) == (
        [],
        "no CBS at step 400 (the smallest batch made no progress over the window): no stage there",
    )


def test_the_latest_measured_checkpoint_leads_and_later_unmeasured_ones_are_named() -> None:
    measured = BranchedCriticalBatch.model_validate(
        _branched([_point(100, 16), _not_measured(400)])
    )
    batch, warnings = branch_budget_batch(
        measured, target_loss=None, tokens_per_example=None, lead="ladder"
    )
    assert batch is not None and (batch.critical, batch.recommended) == (16.0, 16)
    assert any("not measured at step 400" in w and "step 100" in w for w in warnings)
    nothing = BranchedCriticalBatch.model_validate(_branched([_not_measured(400)]))
    batch, warnings = branch_budget_batch(nothing, target_loss=None, tokens_per_example=None)
    assert batch is None and "1.78 → 1.79" in warnings[0]
    plan = make_plan(Measurements(branched_critical_batch=nothing), Targets(), seed=0)
    assert plan.budget.batch.source == "not_available" and plan.budget.batch.recommended is None
    assert "measured no CBS" in plan.budget.batch.reason
    assert any("1.78 → 1.79" in w for w in plan.budget.warnings)

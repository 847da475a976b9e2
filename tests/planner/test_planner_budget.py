"""recommendation.budget against generated ground truth: what leads, defaults, units."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from curvplan.types.planner import Measurements, Targets
from curvplan_core.planner import make_plan

FAST = {"orderings": 8, "bootstrap": 50}


def _losses(n: int = 300, seed: int = 0) -> list[float]:
    return list(np.random.default_rng(seed).gamma(4.0, 0.5, size=n))


def test_without_targets_the_tolerance_is_r_times_the_mean_loss_and_no_data_number_leads():
    losses = _losses()
    plan = make_plan(Measurements(per_sample_losses=losses), Targets(**FAST), seed=1)
    budget = plan.budget
    assert budget is not None
    mean = float(np.mean(losses))
    assert budget.defaults.tolerances_given is False
    assert budget.defaults.tolerances == [pytest.approx(0.01 * mean)]
    assert budget.defaults.target_loss == pytest.approx(mean)
    data = budget.data
    # without a data sweep nothing predictive exists: not_available, with the command
    assert data.source == "not_available" and data.unit == "examples"
    assert data.recommended_examples is None and data.next_step is not None
    assert "--target-loss" in data.next_step.command
    # Oracle: the evaluation-set size k = z²σ²/ε² from the losses themselves, beside it.
    z = stats.norm.ppf(0.975)
    expected = z**2 * np.var(losses, ddof=1) / (0.01 * mean) ** 2
    ev = data.evaluation_set_size
    assert ev.examples == pytest.approx(expected, rel=0.02)
    lo, hi = ev.ci
    assert lo <= ev.examples <= hi
    assert data.landscape_stabilisation is not None
    assert "neither the accuracy" in data.landscape_stabilisation.label
    assert data.available_is_enough is None
    assert any("defaults: tolerance" in w for w in budget.warnings)


def _sweep_table(seed: int = 3) -> tuple[list[dict], float]:
    e, a, beta, target = 1.0, 20.0, 0.4, 1.5
    rng = np.random.default_rng(seed)
    sizes = [200, 400, 800, 1600, 3200, 6400, 12800]
    table = [
        {"n_samples": d, "loss": (e + a * d**-beta) * math.exp(rng.normal(0, 0.003))} for d in sizes
    ]
    return table, target


def test_available_samples_is_compared_with_the_data_sweeps_interval_only():
    table, target = _sweep_table()
    m = Measurements(per_sample_losses=_losses(), loss_vs_data=table)
    base = make_plan(m, Targets(**FAST, target_loss=target), seed=1).budget.data
    rec, hi = base.recommended_examples, base.recommended_examples_ci[1]
    assert base.source == "data_sweep" and hi is not None and rec < hi

    def verdict(available: int):
        return make_plan(
            m, Targets(**FAST, target_loss=target, available_samples=available), seed=1
        ).budget

    assert verdict(math.ceil(hi)).data.available_is_enough is True
    short = verdict(rec - 1)
    assert short.data.available_is_enough is False
    assert any("not enough data" in w for w in short.warnings)
    between = verdict(math.ceil((rec + hi) / 2)).data
    assert between.available_is_enough is None  # enough at the point, not at the upper end
    # the evaluation-set size is never what it is compared with
    ev = base.evaluation_set_size.examples
    expected = True if ev >= hi else (None if ev >= rec else False)
    assert verdict(ev).data.available_is_enough is expected


def test_a_data_sweep_leads_the_data_budget_and_covers_the_true_size():
    e, a, beta, target = 1.0, 20.0, 0.4, 1.5
    rng = np.random.default_rng(3)
    sizes = [200, 400, 800, 1600, 3200, 6400, 12800]
    table = [
        {"n_samples": d, "loss": (e + a * d**-beta) * math.exp(rng.normal(0, 0.003))} for d in sizes
    ]
    plan = make_plan(
        Measurements(per_sample_losses=_losses(), loss_vs_data=table),
        Targets(**FAST, target_loss=target, tolerances=[0.05]),
        seed=2,
    )
    data = plan.budget.data
    assert data.source == "data_sweep"
    truth = (a / (target - e)) ** (1 / beta)
    lo, hi = data.recommended_examples_ci
    assert lo <= truth <= (math.inf if hi is None else hi)
    assert data.evaluation_set_size is not None  # shown beside it
    assert data.target_loss == target


def test_a_batch_sweep_leads_the_batch_budget_with_expected_steps():
    s_min, b_crit = 50.0, 100.0
    rng = np.random.default_rng(4)
    table = [
        {"batch_size": b, "steps": s_min * (1 + b_crit / b) * math.exp(rng.normal(0, 0.01))}
        for b in (16, 32, 64, 128, 256, 512)
    ]
    plan = make_plan(
        Measurements(steps_to_target=table, tokens_per_example=32.0),
        Targets(target_loss=1.0, **FAST),
        seed=0,
    )
    batch = plan.budget.batch
    assert batch.source == "batch_sweep" and batch.unit == "examples"
    assert batch.critical_ci[0] <= b_crit <= batch.critical_ci[1]
    assert batch.recommended == 128  # nearest power of two to ≈100
    assert batch.critical_tokens == pytest.approx(batch.critical * 32.0)
    assert batch.recommended_tokens == 128 * 32.0
    assert batch.expected_steps == pytest.approx(s_min * (1 + b_crit / 128), rel=0.05)
    lo, hi = batch.expected_steps_ci
    assert lo <= s_min * (1 + b_crit / 128) <= hi


def _trend_point(loss: float, b_noise: float, se: float = 0.05) -> dict:
    g2 = 1.0
    return {
        "loss": loss,
        "grad_sq_norm": g2,
        "trace_sigma": b_noise * g2 * 0.8,
        "gHg": 2.0,
        "trace_h_sigma": 2.0 * b_noise,
        "log_b_noise_se": se,
        "log_b_simple_se": se,
    }


def test_the_noise_scale_trend_is_evaluated_at_the_target_loss_not_taken_late():
    # log B_noise = 8 − 2·L exactly and B_simple = 0.8·B_noise: at L = 1.5 the leading scale
    # (B_simple, TREND_SCALE_ORDER) is 0.8·e^5 ≈ 119, the latest value 0.8·e^4.
    losses = [3.0, 2.5, 2.2, 2.0]
    trend = [_trend_point(loss, math.exp(8 - 2 * loss)) for loss in losses]
    plan = make_plan(
        Measurements(gradient_noise_trend=trend), Targets(target_loss=1.5, **FAST), seed=0
    )
    batch = plan.budget.batch
    assert batch.source == "noise_scale_trend"
    assert batch.critical == pytest.approx(0.8 * math.exp(5), rel=1e-6)
    assert batch.recommended == 128
    assert batch.basis.startswith("B_simple")
    assert any("extrapolated" in w for w in plan.budget.warnings)  # 1.5 below every checkpoint


def test_a_single_checkpoint_noise_scale_is_not_used_as_a_constant():
    plan = make_plan(
        Measurements(gradient_noise={"grad_sq_norm": 1.0, "trace_sigma": 50.0}),
        Targets(target_loss=1.0, **FAST),
        seed=0,
    )
    batch = plan.budget.batch
    assert batch.source == "not_available" and batch.recommended is None
    assert "not used as a constant" in batch.reason


def test_learning_rate_without_the_full_model_lambda_gives_the_block_bound_only():
    blocks = [
        {"name": "a", "lambda_max": 4.0, "lambda_min": -0.1, "spectral_norm": 4.0},
        {"name": "b", "lambda_max": 10.0, "lambda_min": 0.0, "spectral_norm": 10.0},
    ]
    plan = make_plan(Measurements(blocks=blocks), Targets(**FAST), seed=0)
    lr = plan.budget.learning_rate
    assert lr.gd_sharpness_threshold is None and "measurements.full_model" in lr.reason
    assert lr.block_threshold == pytest.approx(0.2) and lr.lambda_max_block_name == "b"
    assert "not a limit for SGD" in lr.meaning and "Adam" in lr.meaning
    assert plan.budget.data.source == "not_available" and plan.budget.data.reason


def test_the_budget_leads_the_recommendation_json():
    plan = make_plan(Measurements(per_sample_losses=_losses()), Targets(**FAST), seed=0)
    assert next(iter(plan.model_dump())) == "budget"


def test_the_trend_skips_checkpoints_whose_denominator_is_not_significant():
    # B_noise's GᵀHG is pure noise at every checkpoint (se ≫ value): B_simple's trend is used.
    losses = [3.0, 2.5, 2.2, 2.0]
    trend = []
    for loss in losses:
        point = _trend_point(loss, math.exp(8 - 2 * loss))
        point.update(gHg=0.01, gHg_se=1.0, trace_h_sigma=5.0, trace_h_sigma_se=1.0)
        point.update(grad_sq_norm=1.0, grad_sq_norm_se=0.01)
        point.pop("log_b_noise_se")
        trend.append(point)
    plan = make_plan(
        Measurements(gradient_noise_trend=trend), Targets(target_loss=2.5, **FAST), seed=0
    )
    batch = plan.budget.batch
    assert batch.source == "noise_scale_trend" and batch.basis.startswith("B_simple")
    assert batch.critical == pytest.approx(0.8 * math.exp(8 - 2 * 2.5), rel=1e-6)


def test_sweeps_with_different_targets_each_number_names_the_loss_it_answers():
    """A batch sweep trained to 1.6 and a data sweep sized for 1.4: budget.data is the size
    for 1.4 (the analytic L⁻¹(1.4) of the generating law, not L⁻¹(1.6)), budget.batch says
    it answers 1.6, a warning says they differ, and the CLI's table labels both."""
    from curvplan.client.display import budget_text

    e, a, beta = 1.0, 20.0, 0.4
    sizes = [200, 400, 800, 1600, 3200, 6400, 12800]
    data_table = [{"n_samples": d, "loss": e + a * d**-beta} for d in sizes]
    s_min, b_crit = 50.0, 100.0
    steps = [{"batch_size": b, "steps": s_min * (1 + b_crit / b)} for b in (16, 32, 64, 128, 256)]
    plan = make_plan(
        Measurements(
            per_sample_losses=_losses(),
            loss_vs_data=data_table,
            steps_to_target=steps,
            steps_to_target_loss=1.6,
        ),
        Targets(**FAST, target_loss=1.4, tolerances=[0.05]),
        seed=2,
    )
    budget = plan.budget
    assert budget.data.target_loss == 1.4 and budget.batch.target_loss == 1.6
    at = {loss: (a / (loss - e)) ** (1 / beta) for loss in (1.4, 1.6)}
    assert budget.data.recommended_examples == pytest.approx(at[1.4], rel=0.02)
    assert abs(budget.data.recommended_examples - at[1.6]) > 0.5 * at[1.6]
    assert any("budget.batch answers the batch sweep's loss 1.6" in w for w in budget.warnings)
    text = budget_text(budget)
    assert "data_sweep · loss 1.4" in text and "batch_sweep · loss 1.6" in text
    # the same target for both: no warning, both labelled with it
    same = make_plan(
        Measurements(steps_to_target=steps, steps_to_target_loss=1.4, loss_vs_data=data_table),
        Targets(**FAST, target_loss=1.4),
        seed=2,
    ).budget
    assert same.batch.target_loss == 1.4
    assert not any(w.startswith("targets:") for w in same.warnings)

"""Two-batch gradient-noise estimators on linear regression with analytic Σ and G.

Model: x ~ N(0, I_d), y = xᵀw_true + ε, ε ~ N(0, s²), per-sample loss ½(xᵀw − y)². At w with
δ = w − w_true the per-sample gradient is g = x(xᵀδ − ε), so (Isserlis)
G = δ, Σ = (|δ|² + s²)I + δδᵀ, H = I: |G|² = |δ|², tr Σ = d(|δ|² + s²) + |δ|²,
GᵀHG = |δ|², tr(HΣ) = tr Σ, and B_simple = B_noise = tr Σ/|G|².
"""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from curvplan_core.planner import Measurements, Targets, make_plan
from curvplan_core.planner.gradient_noise import ratio_direct, two_batch_estimates

D = 6
NOISE_SD = 0.5
DELTA = np.array([0.4, -0.3, 0.2, 0.0, 0.1, -0.2])


def _truth(delta: np.ndarray) -> tuple[float, float]:
    g2 = float(delta @ delta)
    return g2, D * (g2 + NOISE_SD**2) + g2


def _batch_gradient(rng: np.random.Generator, delta: np.ndarray, b: int) -> np.ndarray:
    x = rng.standard_normal((b, D))
    resid = x @ delta - NOISE_SD * rng.standard_normal(b)
    return (x * resid[:, None]).mean(axis=0)


def _series(
    rng: np.random.Generator, delta: np.ndarray, b_small: int, b_big: int, steps: int
) -> dict[str, list[float]]:
    """Per step: |G_small|² is the mean over the B_big/B_small micro-batches (DDP-style),
    |G_big|² the norm of their average; h = G_Bᵀ H G_B with H from an independent batch."""
    small, big, h_small, h_big = [], [], [], []
    micro = b_big // b_small
    for _ in range(steps):
        grads = np.array([_batch_gradient(rng, delta, b_small) for _ in range(micro)])
        g_big = grads.mean(axis=0)
        x_ind = rng.standard_normal((64, D))
        hess = x_ind.T @ x_ind / 64  # unbiased for H = I, independent of the gradients
        small.append(float(np.mean(np.sum(grads**2, axis=1))))
        big.append(float(g_big @ g_big))
        h_small.append(float(np.mean(np.einsum("mi,ij,mj->m", grads, hess, grads))))
        h_big.append(float(g_big @ hess @ g_big))
    return {"small": small, "big": big, "h_small": h_small, "h_big": h_big}


def test_two_batch_estimators_are_unbiased() -> None:
    rng = np.random.default_rng(0)
    b_small, b_big = 4, 32
    data = _series(rng, DELTA, b_small, b_big, steps=3000)
    g2, tr = two_batch_estimates(b_small, b_big, np.array(data["small"]), np.array(data["big"]))
    g2_true, tr_true = _truth(DELTA)
    for est, truth in ((g2, g2_true), (tr, tr_true)):
        se = est.std(ddof=1) / np.sqrt(est.size)
        assert abs(est.mean() - truth) < 2 * se, (est.mean(), truth, se)
    ghg, trh = two_batch_estimates(
        b_small, b_big, np.array(data["h_small"]), np.array(data["h_big"])
    )
    for est, truth in ((ghg, g2_true), (trh, tr_true)):
        se = est.std(ddof=1) / np.sqrt(est.size)
        assert abs(est.mean() - truth) < 2 * se, (est.mean(), truth, se)


def test_b_simple_and_b_noise_match_the_analytic_value() -> None:
    rng = np.random.default_rng(1)
    data = _series(rng, DELTA, 4, 32, steps=1500)
    g2_true, tr_true = _truth(DELTA)
    m = Measurements.model_validate(
        {
            "gradient_noise": {
                "b_small": 4,
                "b_big": 32,
                "grad_sq_norm_small": data["small"],
                "grad_sq_norm_big": data["big"],
                "gHg_small": data["h_small"],
                "gHg_big": data["h_big"],
            }
        }
    )
    plan = make_plan(m, Targets(bootstrap=500))
    rec = plan.batch_size
    b_true = tr_true / g2_true
    for est in (rec.b_simple, rec.b_noise):
        assert est.ci[0] <= b_true <= est.ci[1], (est, b_true)
        assert abs(est.value / b_true - 1) < 0.1
    assert rec.source == "two_batch"
    assert rec.lr_scaling.b_noise == rec.b_noise.value
    # one checkpoint's noise scale is evidence, not a batch for the whole run
    assert plan.budget.batch.source == "not_available" and plan.budget.batch.recommended is None
    assert rec.lr_scaling.factor_at_recommended is None


def test_b_simple_undefined_at_a_converged_minimum() -> None:
    rng = np.random.default_rng(2)
    data = _series(rng, np.zeros(D), 4, 32, steps=400)
    m = Measurements.model_validate(
        {
            "gradient_noise": {
                "b_small": 4,
                "b_big": 32,
                "grad_sq_norm_small": data["small"],
                "grad_sq_norm_big": data["big"],
            }
        }
    )
    rec = make_plan(m, Targets())
    assert rec.batch_size.b_simple.status == "not_computed"
    assert "not significantly above zero" in rec.batch_size.b_simple.reason
    assert "b_simple_undefined" in [w.code for w in rec.warnings]


def test_direct_statistics_with_delta_method_interval() -> None:
    r = ratio_direct(3.0, 0.02, 0.1, 0.002, 0.95, "f", ("tr Σ", "|G|²"))
    assert r.value == pytest.approx(150.0)
    sd_log = np.hypot(0.1 / 3.0, 0.002 / 0.02)
    assert r.ci[0] == pytest.approx(150 * np.exp(-1.959964 * sd_log), rel=1e-5)
    assert r.ci[1] == pytest.approx(150 * np.exp(1.959964 * sd_log), rel=1e-5)
    undefined = ratio_direct(3.0, 0.001, 0.1, 0.002, 0.95, "f", ("tr Σ", "|G|²"))
    assert undefined.value is None and "|G|²" in undefined.undefined_reason


def test_equal_batch_sizes_are_a_validation_error() -> None:
    with pytest.raises(ValidationError) as err:
        Measurements.model_validate(
            {
                "gradient_noise": {
                    "b_small": 8,
                    "b_big": 8,
                    "grad_sq_norm_small": [1.0],
                    "grad_sq_norm_big": [0.5],
                }
            }
        )
    assert err.value.errors()[0]["loc"][-1] == "b_big"


def test_sample_count_switches_to_student_t() -> None:
    normal = ratio_direct(3.0, 0.02, 0.1, 0.002, 0.95, "f", ("tr Σ", "|G|²"))
    student = ratio_direct(3.0, 0.02, 0.1, 0.002, 0.95, "f", ("tr Σ", "|G|²"), dof=4)
    sd_log = np.hypot(0.1 / 3.0, 0.002 / 0.02)
    assert student.ci[1] == pytest.approx(150 * np.exp(2.776445 * sd_log), rel=1e-5)
    assert student.ci[1] > normal.ci[1]
    m = Measurements.model_validate(
        {
            "gradient_noise": {
                "grad_sq_norm": 0.02,
                "trace_sigma": 3.1,
                "grad_sq_norm_se": 0.002,
                "trace_sigma_se": 0.1,
                "n_samples": 5,
            }
        }
    )
    assert make_plan(m, Targets()).batch_size.b_simple.ci[1] == pytest.approx(
        3.1 / 0.02 * np.exp(2.776445 * np.hypot(0.1 / 3.1, 0.1)), rel=1e-5
    )

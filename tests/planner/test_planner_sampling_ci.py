"""The sample-size intervals cover the POPULATION C, α and k* over repeated draws of the N losses.

Ground truth: for i.i.d. losses the population mean curve is known in closed form
(docs/formulas.md#sample-size):
- l ~ N(μ, 1):  E|l_{k+1} − L_k| = √(2/π)·√(1 + 1/k), so E Δ_k = √(2/π)√(1 + 1/k)/(k + 1);
- l ~ Exp(1):   E|X − Y| with Y ~ Gamma(k, 1/k) is 2(1 + 1/k)^(−k) (E|X−Y| = 2 − 2E[1 − e^(−Y)]).
The true (C, α) is the same weighted log-space fit applied to that exact curve on the same
window, and the true k*(ε) = (C/ε)^(1/α): what the planner would report with infinitely many
samples and orderings.
"""

from __future__ import annotations

import numpy as np
import pytest

from curvplan_core.planner.loss_curve import (
    _wls_lines,
    data_influence_cov,
    data_influence_draws,
    data_scale_bootstrap,
    default_window,
    fit_power_law,
    loss_difference_curves,
    window_mask,
)
from curvplan_core.planner.sample_size import k_empirical_many, percentile_interval

CONFIDENCE = 0.9
REPS = 60
N = 1000
ORDERINGS = 100
BOOT = 300


def _population_curve(grid, dist: str) -> np.ndarray:
    k = grid.k_sampled.astype(np.float64)
    if dist == "normal":
        per_k = np.sqrt(2 / np.pi) * np.sqrt(1 + 1 / k) / (k + 1)
    else:
        per_k = 2 * (1 + 1 / k) ** (-k) / (k + 1)
    return np.add.reduceat(per_k, grid.bin_starts) / grid.bin_counts


def _draw(dist: str, rng: np.random.Generator) -> np.ndarray:
    return rng.normal(3.0, 1.0, N) if dist == "normal" else rng.exponential(size=N)


def _coverage(dist: str, tol: float, with_data: bool) -> np.ndarray:
    hits = np.zeros(3)
    for rep in range(REPS):
        losses = _draw(dist, np.random.default_rng(10_000 + rep))
        curves = loss_difference_curves(losses, orderings=ORDERINGS, seed=rep, workers=1)
        window = default_window(N)
        est = fit_power_law(curves.abs_by_ordering, curves.grid, window, bootstrap=BOOT, seed=rep)
        if with_data:  # as the planner does: the same fit plus the data-sampling draws
            cov = data_influence_cov(losses, curves.grid, window, est.weights, seed=rep, stream=3)
            shift = data_influence_draws(cov, bootstrap=BOOT, seed=rep, stream=4)
            est = fit_power_law(
                curves.abs_by_ordering,
                curves.grid,
                window,
                bootstrap=BOOT,
                seed=rep,
                data_shift=shift,
            )
        mask = window_mask(curves.grid, window)
        a, b, _ = _wls_lines(
            np.log(curves.grid.k_rep[mask]),
            np.log(_population_curve(curves.grid, dist)[mask]),
            est.weights,
        )
        c_true, alpha_true = float(np.exp(a)), float(-b)
        k_true = (c_true / tol) ** (1 / alpha_true)
        c_ci = percentile_interval(est.C_boot, CONFIDENCE)
        a_ci = percentile_interval(est.alpha_boot, CONFIDENCE)
        k_ci = percentile_interval(k_empirical_many(est.C_boot, est.alpha_boot, tol), CONFIDENCE)
        assert c_ci is not None and a_ci is not None and k_ci is not None
        hits += [
            c_ci[0] <= c_true <= c_ci[1],
            a_ci[0] <= alpha_true <= a_ci[1],
            k_ci[0] <= k_true <= k_ci[1],
        ]
    return hits / REPS


@pytest.mark.parametrize(("dist", "tol"), [("normal", 1e-3), ("exponential", 5e-4)])
def test_intervals_cover_the_population_values_at_about_the_nominal_rate(
    dist: str, tol: float
) -> None:
    c_cov, alpha_cov, k_cov = _coverage(dist, tol, with_data=True)
    # nominal 0.90; 60 draws: a binomial 0.9 falls below 0.78 with probability ≈ 0.3 %
    assert k_cov >= 0.78, (c_cov, alpha_cov, k_cov)
    assert c_cov >= 0.78, (c_cov, alpha_cov, k_cov)
    # α: 0.79 (exponential) to 0.90 (normal) over 200 draws; see formulas.FIT_INTERVALS
    assert alpha_cov >= 0.65, (c_cov, alpha_cov, k_cov)
    assert max(c_cov, k_cov) <= 1.0


def test_orderings_alone_are_too_narrow_for_k_star() -> None:
    """The defect this fixes: conditional on the N losses, the k* interval misses the truth."""
    _, _, k_cov = _coverage("normal", 1e-3, with_data=False)
    assert k_cov < 0.6


def test_data_sampling_errors_match_analytic_standard_errors() -> None:
    """Normal losses: the grouped bootstrap of Var l has the known relative SE √(2/n) whatever
    the input order (sorted here; groups are random), and the influence-function SE of log C
    matches that of the sample mean absolute deviation, √((1 − 2/π)/(2/π)/n) (all bins share
    it as k grows), while α's data error is much smaller (only the curve's shape moves it)."""
    n = 200_000
    losses = np.random.default_rng(5).normal(0.0, 2.0, n)
    boot = data_scale_bootstrap(np.sort(losses), bootstrap=2000, seed=1, stream=0)
    assert np.std(boot.sq_factor) == pytest.approx(np.sqrt(2 / n), rel=0.1)
    assert abs(np.mean(boot.sq_factor) - 1) < 4 * np.sqrt(2 / n) / np.sqrt(2000)
    curves = loss_difference_curves(losses, orderings=4, seed=0)
    window = default_window(n)
    est = fit_power_law(curves.abs_by_ordering, curves.grid, window, bootstrap=0, seed=0)
    cov = data_influence_cov(losses, curves.grid, window, est.weights, seed=0, stream=0)
    se_mad_rel = np.sqrt((1 - 2 / np.pi) / (2 / np.pi) / n)
    assert np.sqrt(cov[0, 0]) == pytest.approx(se_mad_rel, rel=0.15)
    assert np.sqrt(cov[1, 1]) < 0.2 * se_mad_rel
    draws = data_influence_draws(cov, bootstrap=4000, seed=0, stream=1)
    np.testing.assert_allclose(np.cov(draws.T), cov, rtol=0.1, atol=1e-3 * cov[0, 0])

"""Δ_k curves and their fits against analytic i.i.d. results and a naive reference."""

from __future__ import annotations

import numpy as np
import pytest

from curvplan_core.planner.loss_curve import (
    FitError,
    default_window,
    fit_power_law,
    loss_difference_curves,
    make_grid,
)

EXP_MAD = 2.0 / np.e  # E|l − 1| for l ~ Exp(1)


def _naive_curves(losses: np.ndarray, orderings: int, seed: int, grid) -> tuple[np.ndarray, ...]:
    """Reference: a Python loop over orderings, the full Δ_k for every k by explicit cumsum."""
    abs_rows, sq_rows = [], []
    k_all = np.arange(1, losses.size)
    for r in range(orderings):
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0, r)))
        y = rng.permutation(losses)
        running = np.cumsum(y) / np.arange(1, y.size + 1)
        delta_all = np.abs(running[1:] - running[:-1])  # |L_{k+1} − L_k| by definition
        delta = delta_all[grid.k_sampled - 1]
        abs_rows.append(np.add.reduceat(delta, grid.bin_starts) / grid.bin_counts)
        sq_rows.append(np.add.reduceat(delta**2, grid.bin_starts) / grid.bin_counts)
        assert np.allclose(delta_all, np.abs(y[1:] - running[:-1]) / (k_all + 1))
    return np.array(abs_rows), np.array(sq_rows)


def test_matches_naive_definition_exactly() -> None:
    losses = np.random.default_rng(3).gamma(2.0, 0.7, size=3000)
    curves = loss_difference_curves(losses, orderings=7, seed=11)
    ref_abs, ref_sq = _naive_curves(losses, 7, 11, curves.grid)
    np.testing.assert_allclose(curves.abs_by_ordering, ref_abs, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(curves.sq_by_ordering, ref_sq, rtol=1e-9, atol=1e-15)


def test_iid_mean_delta_matches_mad_over_k_plus_one() -> None:
    """Digest §3: E|ΔL_k| ≈ E|l − mean|/(k+1) and E[ΔL_k²] = Var(l)(1 + 1/k)/(k+1)²."""
    losses = np.random.default_rng(0).exponential(size=20_000)
    curves = loss_difference_curves(losses, orderings=1000, seed=1)
    g = curves.grid
    expected = np.add.reduceat(EXP_MAD / (g.k_sampled + 1.0), g.bin_starts) / g.bin_counts
    ratio = curves.abs_by_ordering.mean(axis=0) / expected
    away_from_start = g.k_lo >= 30
    assert np.all(np.abs(ratio[away_from_start] - 1) < 0.05), ratio[away_from_start]

    k = g.k_sampled.astype(float)
    expected_sq = np.add.reduceat((1 + 1 / k) / (k + 1) ** 2, g.bin_starts) / g.bin_counts
    ratio_sq = curves.sq_by_ordering.mean(axis=0) / expected_sq  # Var(Exp(1)) = 1
    assert abs(np.mean(ratio_sq[away_from_start]) - 1) < 0.05

    fit = fit_power_law(
        curves.abs_by_ordering, g, default_window(losses.size), bootstrap=200, seed=0
    )
    assert abs(fit.alpha - 1) < 0.05
    assert abs(fit.C / EXP_MAD - 1) < 0.05
    assert fit.r2 > 0.99
    fit_sq = fit_power_law(
        curves.sq_by_ordering, g, default_window(losses.size), bootstrap=0, seed=0
    )
    assert abs(fit_sq.alpha - 2) < 0.1


@pytest.mark.parametrize("dist", ["uniform", "lognormal"])
def test_alpha_is_one_for_other_distributions(dist: str) -> None:
    rng = np.random.default_rng(5)
    losses = rng.uniform(0, 3, 10_000) if dist == "uniform" else rng.lognormal(0, 0.8, 10_000)
    curves = loss_difference_curves(losses, orderings=200, seed=2)
    fit = fit_power_law(
        curves.abs_by_ordering, curves.grid, default_window(losses.size), bootstrap=300, seed=0
    )
    assert abs(fit.alpha - 1) < 0.05
    lo, hi = np.quantile(fit.alpha_boot, [0.025, 0.975])
    assert lo <= fit.alpha <= hi


def test_orderings_are_reproducible_and_independent_of_threads() -> None:
    losses = np.random.default_rng(1).exponential(size=2000)
    one = loss_difference_curves(losses, orderings=6, seed=4, workers=1)
    two = loss_difference_curves(losses, orderings=6, seed=4, workers=2)
    np.testing.assert_array_equal(one.abs_by_ordering, two.abs_by_ordering)
    other = loss_difference_curves(losses, orderings=6, seed=5, workers=1)
    assert not np.array_equal(one.abs_by_ordering, other.abs_by_ordering)


def test_perturbed_rows_share_the_ordering_and_are_averaged() -> None:
    rng = np.random.default_rng(2)
    a = rng.exponential(size=1500)
    stacked = np.vstack([a, a, a])
    single = loss_difference_curves(a[None, :], orderings=4, seed=9)
    # the (P, N) path permutes by index; the same rows must give the same curve as one row
    multi = loss_difference_curves(stacked, orderings=4, seed=9)
    ref = _naive_multi(stacked, 4, 9, multi.grid)
    np.testing.assert_allclose(multi.abs_by_ordering, ref, rtol=1e-9)
    assert single.abs_by_ordering.shape == multi.abs_by_ordering.shape


def _naive_multi(rows: np.ndarray, orderings: int, seed: int, grid) -> np.ndarray:
    out = []
    for r in range(orderings):
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0, r)))
        perm = rng.permutation(rows.shape[1])
        vals = []
        for row in rows[:, perm]:
            running = np.cumsum(row) / np.arange(1, row.size + 1)
            delta = np.abs(running[1:] - running[:-1])[grid.k_sampled - 1]
            vals.append(np.add.reduceat(delta, grid.bin_starts) / grid.bin_counts)
        out.append(np.mean(vals, axis=0))
    return np.array(out)


def test_grid_covers_every_k_once() -> None:
    g = make_grid(10_000)
    assert g.k_sampled[0] == 1 and g.k_sampled[-1] == 9_999
    assert np.all(np.diff(g.k_sampled) > 0)
    assert g.k_lo[0] == 1 and g.k_hi[-1] == 9_999
    assert np.all(g.k_lo[1:] == g.k_hi[:-1] + 1)
    assert np.all((g.k_rep >= g.k_lo) & (g.k_rep <= g.k_hi))


def test_constant_losses_cannot_be_fitted() -> None:
    curves = loss_difference_curves(np.zeros(500), orderings=3, seed=0)
    with pytest.raises(FitError, match="zero"):
        fit_power_law(curves.abs_by_ordering, curves.grid, (10, 499), bootstrap=10, seed=0)


def test_window_with_too_few_bins_is_refused() -> None:
    curves = loss_difference_curves(np.random.default_rng(0).random(500), orderings=3, seed=0)
    with pytest.raises(FitError, match="bins"):
        fit_power_law(curves.abs_by_ordering, curves.grid, (400, 420), bootstrap=10, seed=0)

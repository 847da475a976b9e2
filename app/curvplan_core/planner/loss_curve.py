"""Loss-difference curves Δ_k over random orderings and their power-law fits.

Petrov et al. 2025 §3.3 (docs/formulas.md#sample-size): for an ordering of the N samples,
L_k is the mean of the first k per-sample losses and

    Δ_k = |L_{k+1} − L_k| = |l_{k+1} − L_k| / (k+1),   k = 1 … N−1.

Each ordering is one uniform random permutation (numpy Generator seeded from
SeedSequence(seed, spawn_key=(stream, r)), so ordering r is the same whatever the chunking or
thread count). The curve is evaluated on log-spaced bins of k: inside a bin every k is used
when the bin holds at most `max_per_bin` integers, otherwise an evenly spaced subset; prefix
sums at those k come from one `np.add.reduceat` over the permuted losses (float64), so there
is no Python loop over k. Per ordering we keep the bin means of Δ_k and Δ_k²; the bootstrap
resamples orderings with replacement.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from curvplan_core.planner.cancel import stop_check

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

# Rows × samples processed per block when perturbed losses (P × N) are given.
_MAX_BLOCK_ELEMENTS = 4_000_000


@dataclass(frozen=True)
class CurveGrid:
    """Log-spaced bins of k and the k values sampled inside them."""

    k_sampled: IntArray  # strictly increasing k values (1-based), 1 ≤ k ≤ N−1
    bin_starts: IntArray  # index into k_sampled where each bin starts
    bin_counts: IntArray  # sampled k per bin
    k_rep: FloatArray  # geometric mean of the sampled k of each bin
    k_lo: IntArray  # smallest integer k of each bin
    k_hi: IntArray  # largest integer k of each bin


def make_grid(n_samples: int, bins_per_decade: int = 20, max_per_bin: int = 256) -> CurveGrid:
    """Log-spaced bins over k = 1 … n_samples−1 (needs n_samples ≥ 2)."""
    if n_samples < 2:
        raise ValueError("a loss-difference curve needs at least 2 samples")
    k_max = n_samples - 1
    n_edges = max(2, int(np.ceil(np.log10(k_max + 1) * bins_per_decade)) + 1)
    edges = np.unique(np.floor(np.geomspace(1, k_max + 1, n_edges)).astype(np.int64))
    edges[-1] = k_max + 1
    edges = np.unique(edges)
    sampled: list[IntArray] = []
    counts = []
    k_lo = edges[:-1]
    k_hi = edges[1:] - 1
    for lo, hi in zip(k_lo, k_hi, strict=True):
        width = hi - lo + 1
        if width <= max_per_bin:
            ks = np.arange(lo, hi + 1, dtype=np.int64)
        else:
            ks = np.unique(np.round(np.linspace(lo, hi, max_per_bin)).astype(np.int64))
        sampled.append(ks)
        counts.append(ks.size)
    k_sampled = np.concatenate(sampled)
    bin_counts = np.asarray(counts, dtype=np.int64)
    bin_starts = np.concatenate([[0], np.cumsum(bin_counts)[:-1]]).astype(np.int64)
    log_k = np.log(k_sampled.astype(np.float64))
    k_rep = np.exp(np.add.reduceat(log_k, bin_starts) / bin_counts)
    k_rep = np.clip(k_rep, k_lo, k_hi)  # exact for one-k bins despite rounding in exp(log k)
    return CurveGrid(k_sampled, bin_starts, bin_counts, k_rep, k_lo, k_hi)


@dataclass(frozen=True)
class OrderingCurves:
    """Per-ordering bin means of Δ_k and Δ_k² (rows: orderings, columns: bins)."""

    grid: CurveGrid
    abs_by_ordering: FloatArray
    sq_by_ordering: FloatArray

    @property
    def k(self) -> FloatArray:
        return self.grid.k_rep

    @property
    def n_orderings(self) -> int:
        return int(self.abs_by_ordering.shape[0])


def _ordering_rng(seed: int, stream: int, ordering: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(stream, ordering)))


def _one_ordering(
    losses: FloatArray, grid: CurveGrid, seed: int, stream: int, ordering: int
) -> tuple[FloatArray, FloatArray]:
    """Bin means of Δ_k and Δ_k² for one random ordering, averaged over the rows of `losses`."""
    rng = _ordering_rng(seed, stream, ordering)
    n_rows, n = losses.shape
    ks = grid.k_sampled
    seg_starts = np.concatenate([[0], ks])
    abs_sum = np.zeros(grid.k_rep.size)
    sq_sum = np.zeros(grid.k_rep.size)
    if n_rows == 1:
        blocks: list[FloatArray] = [rng.permutation(losses[0])[None, :]]
    else:
        perm = rng.permutation(n)
        rows_per_block = max(1, _MAX_BLOCK_ELEMENTS // n)
        blocks = [
            np.take(losses[i : i + rows_per_block], perm, axis=1)
            for i in range(0, n_rows, rows_per_block)
        ]
    for permuted in blocks:
        # prefix sums S_k = sum of the first k permuted losses, at every sampled k
        seg = np.add.reduceat(permuted, seg_starts, axis=1)[:, :-1]
        prefix = np.cumsum(seg, axis=1)
        running_mean = prefix / ks
        delta = np.abs(permuted[:, ks] - running_mean) / (ks + 1)
        abs_sum += np.add.reduceat(delta, grid.bin_starts, axis=1).sum(axis=0)
        sq_sum += np.add.reduceat(delta * delta, grid.bin_starts, axis=1).sum(axis=0)
    scale = 1.0 / (grid.bin_counts * n_rows)
    return abs_sum * scale, sq_sum * scale


def loss_difference_curves(
    losses: FloatArray,
    *,
    orderings: int,
    seed: int,
    stream: int = 0,
    grid: CurveGrid | None = None,
    workers: int | None = None,
) -> OrderingCurves:
    """Δ_k and Δ_k² over `orderings` random orderings (Petrov et al. 2025 §3.3;
    docs/formulas.md#sample-size).

    `losses` is (N,) for the losses at w*, or (P, N) for P perturbed points w* + r·u (the same
    ordering is applied to every row and the rows are averaged: the Δ1 / Δ2 Monte-Carlo criteria
    of docs/formulas.md#sample-size). Orderings run on a small thread pool (numpy releases the
    GIL); memory is a
    few copies of one (block of) row(s) per worker.
    """
    arr = np.ascontiguousarray(losses, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2:
        raise ValueError("losses must be (N,) or (P, N)")
    grid = grid or make_grid(arr.shape[1])
    n_workers = workers or min(2, os.cpu_count() or 1)
    abs_rows = np.empty((orderings, grid.k_rep.size))
    sq_rows = np.empty_like(abs_rows)

    check = stop_check()  # a cancel takes effect within one ordering

    def run(r: int) -> None:
        check()
        abs_rows[r], sq_rows[r] = _one_ordering(arr, grid, seed, stream, r)

    if n_workers <= 1 or orderings < 4:
        for r in range(orderings):
            run(r)
    else:
        step = 8 * n_workers  # a few orderings queued at a time: a cancel drops the rest
        with ThreadPoolExecutor(max_workers=n_workers) as pool:
            for start in range(0, orderings, step):
                list(pool.map(run, range(start, min(start + step, orderings))))
    return OrderingCurves(grid, abs_rows, sq_rows)


# --------------------------------------------------------------------------- fitting
@dataclass(frozen=True)
class PowerLawEstimate:
    """Fit of y ≈ C·k^(−α) with bootstrap replicates of (C, α) over orderings."""

    C: float
    alpha: float
    r2: float
    window: tuple[int, int]
    n_points: int
    C_boot: FloatArray  # (B,) — empty when no bootstrap was run
    alpha_boot: FloatArray
    weights: FloatArray  # fit weights of the bins inside the window
    includes_data_sampling: bool = False  # C_boot carries the data-scale bootstrap too


def _wls_lines(
    x: FloatArray, y: FloatArray, w: FloatArray
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Weighted least squares y = a + b·x along the last axis; returns (a, b, weighted R²)."""
    sw = w.sum(axis=-1, keepdims=True)
    xm = (w * x).sum(axis=-1, keepdims=True) / sw
    ym = (w * y).sum(axis=-1, keepdims=True) / sw
    dx = x - xm
    dy = y - ym
    sxx = (w * dx * dx).sum(axis=-1)
    sxy = (w * dx * dy).sum(axis=-1)
    syy = (w * dy * dy).sum(axis=-1)
    b = sxy / sxx
    a = ym[..., 0] - b * xm[..., 0]
    resid = dy - b[..., None] * dx
    ss_res = (w * resid * resid).sum(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        r2 = np.where(syy > 0, 1.0 - ss_res / syy, 1.0)
    return a, b, r2


class FitError(ValueError):
    """The curve cannot be fitted (too few usable points, constant losses…)."""


def window_mask(grid: CurveGrid, window: tuple[int, int]) -> NDArray[np.bool_]:
    """Bins lying entirely inside [k_min, k_max]."""
    return (grid.k_lo >= window[0]) & (grid.k_hi <= window[1])


def fit_power_law(
    by_ordering: FloatArray,
    grid: CurveGrid,
    window: tuple[int, int],
    *,
    bootstrap: int,
    seed: int,
    stream: int = 1,
    fixed_alpha: float | None = None,
    k_offset: float = 0.0,
    data_scale: FloatArray | None = None,
    data_shift: FloatArray | None = None,
) -> PowerLawEstimate:
    """Fit mean-over-orderings ≈ C·(k + k_offset)^(−α) (docs/formulas.md#sample-size).

    Weighted least squares of log(mean) on log k over the bins inside `window`, weights
    1/Var(log mean) = R·mean²/Var_orderings (delta method). The bootstrap resamples the R
    orderings with replacement (multinomial counts, one matrix product for all replicates) and
    refits with the same weights. With `fixed_alpha` only log C is fitted (the slope is held at
    the theory's value), as needed for the squared criterion's C2 in k* = ⌈√(C2/ε)⌉ − 1.
    """
    mask = window_mask(grid, window)
    n_orderings = by_ordering.shape[0]
    data = by_ordering[:, mask]
    mean = data.mean(axis=0)
    if mask.sum() < 3:
        raise FitError(f"only {int(mask.sum())} k-bins inside the fit window {list(window)}")
    if np.any(mean <= 0):
        raise FitError("the loss differences are zero (all per-sample losses are equal)")
    weights = _log_mean_weights(data, mean, n_orderings)
    x = np.log(grid.k_rep[mask] + k_offset)
    C, alpha, r2_value = _point_fit(x, np.log(mean), weights, fixed_alpha)
    c_boot = np.empty(0)
    alpha_boot = np.empty(0)
    if bootstrap > 0 and n_orderings > 1:
        c_boot, alpha_boot = _bootstrap_fit(
            data, x, weights, bootstrap, seed, stream, fixed_alpha, data_scale, data_shift
        )
    return PowerLawEstimate(
        C=C,
        alpha=alpha,
        r2=r2_value,
        window=(int(grid.k_lo[mask][0]), int(grid.k_hi[mask][-1])),
        n_points=int(mask.sum()),
        C_boot=c_boot,
        alpha_boot=alpha_boot,
        weights=weights,
        includes_data_sampling=(data_scale is not None or data_shift is not None)
        and c_boot.size > 0,
    )


def _log_mean_weights(data: FloatArray, mean: FloatArray, n_orderings: int) -> FloatArray:
    """1/Var(log mean) of each bin by the delta method, R·mean²/Var_orderings, the variance
    floored at 10⁻³ of its median (a bin without spread would take all the weight)."""
    var = data.var(axis=0, ddof=1) if n_orderings > 1 else np.zeros_like(mean)
    var_log = var / (n_orderings * mean * mean)
    floor = (
        max(float(np.median(var_log[var_log > 0])) * 1e-3, 1e-300) if np.any(var_log > 0) else 1.0
    )
    return 1.0 / np.maximum(var_log, floor)


def _point_fit(
    x: FloatArray, y: FloatArray, weights: FloatArray, fixed_alpha: float | None
) -> tuple[float, float, float]:
    """(C, α, weighted R²) of y = log C − α·x: both by weighted least squares, or log C alone
    with α held at ``fixed_alpha``."""
    if fixed_alpha is None:
        a, b, r2 = _wls_lines(x, y, weights)
        return float(np.exp(a)), float(-b), float(r2)
    log_c = y + fixed_alpha * x
    a_fixed = float(np.sum(weights * log_c) / np.sum(weights))
    pred = a_fixed - fixed_alpha * x
    ym = np.sum(weights * y) / np.sum(weights)
    ss_tot = float(np.sum(weights * (y - ym) ** 2))
    r2_value = 1.0 - float(np.sum(weights * (y - pred) ** 2)) / ss_tot if ss_tot > 0 else 1.0
    return float(np.exp(a_fixed)), float(fixed_alpha), r2_value


def _bootstrap_fit(
    data: FloatArray,
    x: FloatArray,
    weights: FloatArray,
    bootstrap: int,
    seed: int,
    stream: int,
    fixed_alpha: float | None,
    data_scale: FloatArray | None,
    data_shift: FloatArray | None,
) -> tuple[FloatArray, FloatArray]:
    """Replicates of (C, α): the orderings resampled with replacement (multinomial counts, one
    matrix product for all replicates), refitted with the same weights, then the data-level
    ``data_scale`` / ``data_shift`` applied; non-finite replicates dropped."""
    n_orderings = data.shape[0]
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(stream,)))
    counts = rng.multinomial(n_orderings, np.full(n_orderings, 1.0 / n_orderings), bootstrap)
    boot_mean = (counts @ data) / n_orderings
    ok = np.all(boot_mean > 0, axis=1)
    yb = np.log(np.where(boot_mean > 0, boot_mean, 1.0))
    if fixed_alpha is None:
        ab, bb, _ = _wls_lines(np.broadcast_to(x, yb.shape), yb, np.broadcast_to(weights, yb.shape))
        alpha_all = -bb
    else:
        ab = (yb + fixed_alpha * x) @ weights / weights.sum()
        alpha_all = np.full(bootstrap, float(fixed_alpha))
    c_all = np.exp(ab)
    if data_scale is not None:
        if data_scale.shape != (bootstrap,):
            raise ValueError("data_scale needs one factor per bootstrap replicate")
        c_all = c_all * data_scale
    if data_shift is not None:
        if data_shift.shape != (bootstrap, 2):
            raise ValueError("data_shift needs one (log C, α) shift per bootstrap replicate")
        c_all = c_all * np.exp(data_shift[:, 0])
        if fixed_alpha is None:
            alpha_all = alpha_all + data_shift[:, 1]
    ok = ok & np.isfinite(c_all) & np.isfinite(alpha_all)
    return c_all[ok], alpha_all[ok]


def default_window(n_samples: int) -> tuple[int, int]:
    """Skip the first samples: k_min = clip(N/1000, 10, 100), k_max = N − 1
    (docs/formulas.md#sample-size)."""
    k_min = int(min(100, max(10, n_samples // 1000)))
    return k_min, n_samples - 1


# --------------------------------------------------------------------------- data sampling
@dataclass(frozen=True)
class DataScaleBootstrap:
    """Bootstrap replicates, relative to the observed value, of Var(l): the data-level scale
    that sets C2 of the squared criterion (E[Δ_k²] = Var(l)(1 + 1/k)/(k+1)²,
    docs/formulas.md#sample-size)."""

    sq_factor: FloatArray  # (B,) Var*/Var, Var = mean over rows of the biased variance
    groups: int


def data_scale_bootstrap(
    losses: FloatArray, *, bootstrap: int, seed: int, stream: int, groups: int = 1000
) -> DataScaleBootstrap:
    """Bootstrap over the N samples of Var(l), which sets C2 (docs/formulas.md#sample-size): the
    shape
    (1 + 1/k)/(k+1)² does not depend on the loss distribution, so the scale carries all of the
    data-sampling error of C2.

    The samples are put into `groups` random groups (labels from the seeded generator, so any
    order of the input is fine) and the groups are resampled with replacement (a grouped
    bootstrap: O(N) once, then O(B·groups)); the variance about the resampled mean decomposes
    exactly into group sums. `losses` is (N,) or (P, N) (P perturbed points: averaged over rows,
    the samples resampled jointly).
    """
    arr = np.asarray(losses, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[None, :]
    n_rows, n = arr.shape
    n_groups = int(min(groups, n))
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(stream,)))
    labels = rng.integers(0, n_groups, n)
    count = np.bincount(labels, minlength=n_groups).astype(np.float64)
    sums = np.empty((2, n_rows, n_groups))  # Σ d, Σ d² per row and group
    var = np.empty(n_rows)
    for p in range(n_rows):
        d = arr[p] - arr[p].mean()
        d2 = d * d
        sums[0, p] = np.bincount(labels, weights=d, minlength=n_groups)
        sums[1, p] = np.bincount(labels, weights=d2, minlength=n_groups)
        var[p] = float(d2.mean())
    weights = rng.multinomial(n_groups, np.full(n_groups, 1.0 / n_groups), bootstrap).astype(
        np.float64
    )
    n_star = weights @ count  # (B,)
    n_star = np.where(n_star > 0, n_star, 1.0)
    resampled = np.einsum("bg,kpg->kbp", weights, sums) / n_star[None, :, None]
    shift = resampled[0]  # resampled mean − observed mean, (B, P)
    var_star = resampled[1] - shift * shift
    with np.errstate(divide="ignore", invalid="ignore"):
        sq_factor = var_star.mean(axis=1) / var.mean()
    return DataScaleBootstrap(
        sq_factor=np.where(np.isfinite(sq_factor) & (sq_factor > 0), sq_factor, np.nan),
        groups=n_groups,
    )


def _folded_normal_mean(d: FloatArray, sd: FloatArray) -> FloatArray:
    """E|d + sd·Z| for Z ~ N(0, 1) (elementwise, broadcasting)."""
    from scipy.special import erf

    z = d / sd
    mean: FloatArray = sd * np.sqrt(2 / np.pi) * np.exp(-0.5 * z * z) + d * erf(z / np.sqrt(2))
    return mean


def data_influence_cov(
    losses: FloatArray,
    grid: CurveGrid,
    window: tuple[int, int],
    weights: FloatArray,
    *,
    seed: int,
    stream: int,
    max_evaluations: int = 600_000,
) -> FloatArray:
    """Covariance (2×2) of the data-sampling error of (log C, α) of the |Δ_k| fit.

    The population bin means T_j = E|l − L_k|/(k+1) (k = k_rep of bin j,
    docs/formulas.md#sample-size) are smooth
    functionals of the loss distribution F; their influence function is
    IF_j(x) = E|x − L_k| + (x − μ)·E sign(L_k − X_0) + (x − μ)²·f_k(μ)/k + const
    (differentiate the U-statistic E|X_0 − (X_1 + … + X_k)/k|: x as X_0, and x as one of the
    k draws of L_k, expanded to second order in its shift (x − μ)/k; f_k is the density of
    X_0 minus the other draws' mean at μ), with L_k approximated by N(μ, s²/k) (CLT; k ≥ the
    window start). log C and α are linear in log T_j
    through the weighted least squares, so their influence functions are fixed combinations of
    IF_j/T_j; the covariance is Var(IF)/N over the samples (a random subsample of at most
    `max_evaluations`/(rows·bins) of them; exact enough for a variance). (P, N) losses: rows
    averaged, samples shared.
    """
    arr = np.asarray(losses, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[None, :]
    n_rows, n = arr.shape
    mask = window_mask(grid, window)
    k = grid.k_rep[mask]
    x = np.log(k)
    w = weights
    sw = w.sum()
    xm = float(w @ x) / sw
    sxx = float(w @ (x - xm) ** 2)
    coef_alpha = -w * (x - xm) / sxx  # α = Σ coef_alpha·log T_j
    coef_logc = w / sw - xm * w * (x - xm) / sxx  # log C = Σ coef_logc·log T_j
    m = max(2, min(n, max_evaluations // max(1, n_rows * k.size)))
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(stream,)))
    idx = rng.choice(n, size=m, replace=False) if m < n else np.arange(n)
    t_sum = np.zeros(k.size)
    if_sum = np.zeros((m, k.size))
    from scipy.special import erf

    sd_other = np.sqrt(np.maximum(k - 1.0, 1.0)) / k  # sd of (X_2 + … + X_k)/k per unit s
    for p in range(n_rows):
        row = arr[p]
        mu = row.mean()
        s = row.std()
        if s == 0:  # a constant row adds nothing to Δ_k and has no sampling error
            continue
        d = row[idx] - mu
        sd_k = (s / np.sqrt(k))[None, :]
        e_abs = _folded_normal_mean(d[:, None], sd_k)  # E|x − L_k|, (m, bins)
        # x as one of the k draws of L_k moves it by δ = (x − μ)/k; to second order the k such
        # terms give (x − μ)·E sign(L_k − X_0) + (x − μ)²/k · f_k(μ), f_k the density of
        # X_0 − (other draws' mean) at μ: the variance of the sample enters the curve's shape.
        z = d[:, None] / (s * sd_other)[None, :]
        slope = np.mean(-erf(z / np.sqrt(2)), axis=0)  # E sign(L_k − X_0)
        dens = np.mean(np.exp(-0.5 * z * z), axis=0) / (np.sqrt(2 * np.pi) * s * sd_other)
        t_sum += e_abs.mean(axis=0)
        if_sum += e_abs + d[:, None] * slope[None, :] + (d * d)[:, None] * (dens / k)[None, :]
    t = t_sum / n_rows
    rel = (if_sum / n_rows) / t[None, :]
    rel -= rel.mean(axis=0)
    infl = np.column_stack([rel @ coef_logc, rel @ coef_alpha])  # (m, 2)
    cov: FloatArray = (infl.T @ infl) / (infl.shape[0] - 1) / n
    return cov


def data_influence_draws(cov: FloatArray, *, bootstrap: int, seed: int, stream: int) -> FloatArray:
    """(bootstrap, 2) normal draws of the (log C, α) data-sampling error with covariance cov."""
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(stream,)))
    vals, vecs = np.linalg.eigh(0.5 * (cov + cov.T))
    root = vecs * np.sqrt(np.clip(vals, 0.0, None))
    draws: FloatArray = rng.standard_normal((bootstrap, 2)) @ root.T
    return draws

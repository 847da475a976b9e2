"""Intervals for S_min, B_crit and E_min of the steps-to-target fit S = S_min(1 + B_crit/B)
(McCandlish et al. 2018 §2.3, eq. 2.11; docs/formulas.md#batch-size): profile likelihood in
log B_crit, log S_min and log E_min, maximised over the variance function too, its threshold
calibrated by a parametric bootstrap with resampled residuals that repeats the
variance-function fits of ``critical_batch.fit_steps_to_target`` on every bootstrap table.

Why: with 5–7 batch sizes the Wald interval θ ± t·se of the fit (HC3 sandwich, t_{n−3}) was
too wide under multiplicative noise (0.98) and too narrow under additive noise (0.93), and a
table whose B_crit ran to the edge of the search range had no interval at all (0.91 coverage
at 5 batch sizes 8..128; benchmarks/results/coverage-cpu.txt has the figures of both). The
profile of the weighted residual sum of squares in c = log B_crit has finite asymptotes on both
sides
(c → −∞: S constant; c → +∞: S = E_min/B, perfect linear scaling), so its confidence set is
honest about unbounded ends: when the data cannot tell B_crit from ∞ the upper end is ∞ (and
S_min's lower end 0), instead of a refusal or a finite end the data do not support.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy import stats

FloatArray = NDArray[np.float64]

#: Bootstrap tables per interval call: the planner's default (each table costs one vectorised
#: grid fit per variance exponent and iteration, ~0.5 ms for 7 batch sizes).
PROFILE_BOOTSTRAP = 200
#: Width of the search range beyond the measured batch sizes, as in the point fit (10⁴×).
EDGE_FACTOR = 1e4
_GLS_ITERATIONS = 3


@dataclass(frozen=True)
class ProfileIntervals:
    """Intervals (0 and inf mark ends the data do not bound) and the calibrated thresholds q
    of the likelihood-ratio statistic T(ψ) = 2(ℓ̂ − ℓ_p(ψ)) for ψ = log B_crit, log S_min,
    log E_min; ``bootstrap`` tables calibrated them (0: the small-sample F form)."""

    b_crit: tuple[float, float]
    s_min: tuple[float, float]
    e_min: tuple[float, float]
    thresholds: tuple[float, float, float]
    bootstrap: int


def log_b_crit_grid(batch_sizes: FloatArray, points: int) -> FloatArray:
    """Grid in c = log B_crit over the fit's range [B_min/10⁴, B_max·10⁴]: dense (``points``)
    within e³ of the measured sizes, where the model bends, and 40 points on each saturated
    side (there log(1 + e^c/B) is within 5 % of its asymptote)."""
    lo, hi = math.log(batch_sizes.min()), math.log(batch_sizes.max())
    edge = math.log(EDGE_FACTOR)
    return np.concatenate(
        [
            np.linspace(lo - edge, lo - 3.0, 40, endpoint=False),
            np.linspace(lo - 3.0, hi + 3.0, points, endpoint=False),
            np.linspace(hi + 3.0, hi + edge, 40),
        ]
    )


def _profile_over_c(
    y: FloatArray, weights: FloatArray, g: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """For each table (rows of y, weights: R × n) and grid point (g: G × n, log(1 + e^c/B)):
    the weighted least-squares log S_min â(c) in closed form and the residual sum SSR_w(c).
    SSR_w = Σw(y − g)² − (Σw(y − g))²/Σw from matrix products, on y and g centred over the
    batch sizes (a constant per table and grid point moves â only), which keeps the
    cancellation small."""
    sw = weights.sum(axis=1)
    a = ((weights * y).sum(axis=1)[:, None] - weights @ g.T) / sw[:, None]
    yc = y - y.mean(axis=1, keepdims=True)
    gc = g - g.mean(axis=1, keepdims=True)
    wy = weights * yc
    sum_r = wy.sum(axis=1)[:, None] - weights @ gc.T
    sum_r2 = (wy * yc).sum(axis=1)[:, None] - 2.0 * wy @ gc.T + weights @ (gc * gc).T
    ssr = np.maximum(sum_r2 - sum_r**2 / sw[:, None], 0.0)
    return a, ssr


def _refined_min(values: FloatArray) -> FloatArray:
    """Row minima of a sampled function, refined by the parabola through the grid minimum and
    its neighbours (never above the sampled minimum)."""
    idx = np.argmin(values, axis=1)
    rows = np.arange(values.shape[0])
    best = values[rows, idx]
    inner = (idx > 0) & (idx < values.shape[1] - 1)
    i = np.clip(idx, 1, values.shape[1] - 2)
    left, mid, right = values[rows, i - 1], values[rows, i], values[rows, i + 1]
    curv = left - 2 * mid + right
    with np.errstate(divide="ignore", invalid="ignore"):
        vertex = mid - (right - left) ** 2 / (8 * curv)
    ok = inner & (curv > 0) & np.isfinite(vertex)
    refined: FloatArray = np.where(ok, np.minimum(best, vertex), best)
    return refined


@dataclass(frozen=True)
class VarianceProfile:
    """One variance exponent k on the c-grid for R tables: the GLS weights w (R × n), â(c) and
    the weighted residual sum SSR_w(c) (R × G), and ½·Σ log w (R)."""

    weights: FloatArray
    a: FloatArray
    ssr: FloatArray
    log_det: FloatArray

    def loglik(self, ssr: FloatArray) -> FloatArray:
        """Gaussian log-likelihood with the scale profiled out, −n/2·log(SSR_w/n) + ½·Σ log w
        (Carroll & Ruppert 1988, §3.2), of residual sums ``ssr`` (R × ·) under these weights."""
        n = self.weights.shape[1]
        extra = (ssr.ndim - 1) * (None,)
        return np.asarray(
            -0.5 * n * np.log(np.maximum(ssr, 1e-300) / n) + self.log_det[(slice(None), *extra)],
            dtype=np.float64,
        )


def variance_profiles(
    y: FloatArray, g: FloatArray, exponents: Sequence[float]
) -> list[VarianceProfile]:
    """The variance-function GLS of ``fit_steps_to_target`` on the c-grid, for many tables at
    once (rows of y): for each exponent k, weights w = μ^(2(1−k)) normalised (Var log S ∝
    μ^(2(k−1)); Carroll & Ruppert 1988, eq. 2.5), iterated ``_GLS_ITERATIONS`` times from the
    unweighted fit. With ≤ 3 batch sizes or no exponents: the unweighted fit alone (k = 1)."""
    n_rows, n = y.shape
    ones = np.ones((n_rows, n))
    a, ssr = _profile_over_c(y, ones, g)
    unweighted = VarianceProfile(ones, a, ssr, np.zeros(n_rows))
    if n <= 3 or len(exponents) == 0:
        return [unweighted]
    rows = np.arange(n_rows)
    idx0 = np.argmin(ssr, axis=1)
    out = []
    for k in exponents:
        idx, a_k, w_k, ssr_k = idx0, a, ones, ssr
        for _ in range(_GLS_ITERATIONS):
            mu = np.exp(a_k[rows, idx][:, None] + g[idx])
            w_k = (mu / mu.mean(axis=1, keepdims=True)) ** (2.0 * (1.0 - k))
            a_k, ssr_k = _profile_over_c(y, w_k, g)
            idx = np.argmin(ssr_k, axis=1)
        out.append(VarianceProfile(w_k, a_k, ssr_k, 0.5 * np.log(w_k).sum(axis=1)))
    return out


def _polished_min(
    y: FloatArray,
    weights: FloatArray,
    batch_sizes: FloatArray,
    c: FloatArray,
    values: FloatArray,
    offset: FloatArray | None,
    slope: float,
) -> FloatArray:
    """Row minima of SSR_w over c, from the grid minimum of ``values`` (R × G) polished by
    Gauss–Newton steps (kept only where they lower SSR_w): the residual is y − (a + g(c)) with
    a = ``offset`` + ``slope``·c fixed (a fixed: slope 0; E_min fixed: a = e − c, slope −1), or a
    profiled out in closed form (``offset`` None). A grid alone misses the minimum when the
    noise is small: the valley in c is then narrower than the grid step."""
    rows = np.arange(y.shape[0])
    idx = np.argmin(values, axis=1)
    cur_c = c[idx]
    cur = values[rows, idx]
    lo, hi = float(c[0]), float(c[-1])
    sw = weights.sum(axis=1)

    def ssr_at(c_now: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
        ratio = np.exp(c_now)[:, None] / batch_sizes[None, :]
        g = np.log1p(ratio)
        deriv = ratio / (1.0 + ratio) + slope
        if offset is None:
            r = y - g
            a = (weights * r).sum(axis=1) / sw
            r = r - a[:, None]
            deriv = deriv - (weights * deriv).sum(axis=1)[:, None] / sw[:, None]
        else:
            r = y - g - (offset + slope * c_now)[:, None]
        return (weights * r * r).sum(axis=1), r, deriv

    for _ in range(8):
        _, r, deriv = ssr_at(cur_c)
        denom = (weights * deriv * deriv).sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            step = (weights * r * deriv).sum(axis=1) / denom
        trial = np.clip(cur_c + np.where(np.isfinite(step), step, 0.0), lo, hi)
        new, _, _ = ssr_at(trial)
        better = new < cur
        cur_c = np.where(better, trial, cur_c)
        cur = np.where(better, new, cur)
    ssr: FloatArray = cur
    return ssr


def _statistics(
    profiles: list[VarianceProfile],
    y: FloatArray,
    batch_sizes: FloatArray,
    c: FloatArray,
    truth: FloatArray,
) -> FloatArray:
    """T(ψ₀) = 2(ℓ̂ − ℓ_p(ψ₀)) for ψ = c, a, e = a + c at θ₀ = (a₀, c₀), for each row of y:
    ℓ the Gaussian log-likelihood with the scale profiled out, maximised over the variance
    exponent k and the other parameter (c fixed: â in closed form; a or e fixed: minimum of
    SSR_w over c). Columns: c, a, e."""
    a0, c0 = float(truth[0]), float(truth[1])
    g0 = np.log1p(math.exp(c0) / batch_sizes)
    best = np.full(y.shape[0], -np.inf)
    at = np.full((y.shape[0], 3), -np.inf)
    n_rows = y.shape[0]
    for prof in profiles:
        w = prof.weights
        sw = w.sum(axis=1)[:, None]
        ssr_hat = _polished_min(y, w, batch_sizes, c, prof.ssr, None, 0.0)
        best = np.maximum(best, prof.loglik(ssr_hat))
        r = y - g0[None, :]
        a_c = (r * w).sum(axis=1) / sw[:, 0]
        ssr_c = ((r - a_c[:, None]) ** 2 * w).sum(axis=1)
        ssr_a = _polished_min(
            y, w, batch_sizes, c, prof.ssr + sw * (a0 - prof.a) ** 2, np.full(n_rows, a0), 0.0
        )
        e_grid = prof.ssr + sw * (a0 + c0 - c[None, :] - prof.a) ** 2
        ssr_e = _polished_min(y, w, batch_sizes, c, e_grid, np.full(n_rows, a0 + c0), -1.0)
        at[:, 0] = np.maximum(at[:, 0], prof.loglik(ssr_c))
        at[:, 1] = np.maximum(at[:, 1], prof.loglik(ssr_a))
        at[:, 2] = np.maximum(at[:, 2], prof.loglik(ssr_e))
    return np.asarray(np.maximum(2.0 * (best[:, None] - at), 0.0), dtype=np.float64)


def bootstrap_thresholds(
    batch_sizes: FloatArray,
    fitted: FloatArray,
    weights: FloatArray,
    residuals: FloatArray,
    theta: FloatArray,
    exponents: Sequence[float],
    confidence: float,
    bootstrap: int,
    rng: np.random.Generator,
    *,
    generators: Sequence[tuple[float, float]] | None = None,
    grid_points: int = 200,
) -> FloatArray:
    """Quantiles ``confidence`` (the ⌈(R + 1)·confidence⌉-th of R values) of T(ψ₀)
    (``_statistics``) for ψ = log B_crit, log S_min,
    log E_min over ``bootstrap`` tables log S* = fitted + e*/√w drawn from the fit (Efron &
    Tibshirani 1993, §9.5: residual resampling in regression), e* with replacement from the
    weighted residuals √w·r, centred and inflated by √(n/(n − 2)) for the two fitted
    parameters. w: ``weights`` (the chosen variance function), or with ``generators`` ((k,
    probability) pairs) each table's variance function drawn from them, w = μ̂^(2(1−k)), so
    that a k the data do not rule out shapes the noise of its share of the tables (model
    averaging with likelihood weights, Burnham & Anderson 2002, §4.2: with 5–7 points the
    chosen k is often wrong, and a bootstrap from it alone under-covered, 0.92 on additive
    noise read as multiplicative). Each table is refitted under every exponent, so the
    thresholds include what the choice of k costs."""
    n = batch_sizes.size
    c = log_b_crit_grid(batch_sizes, grid_points)
    g = np.log1p(np.exp(c)[:, None] / batch_sizes[None, :])
    mu = np.exp(fitted)
    if generators is None or len(generators) == 0:
        gen_weights = [weights]
        counts = np.array([bootstrap])
    else:
        gen_weights = [(mu / mu.mean()) ** (2.0 * (1.0 - k)) for k, _ in generators]
        prob = np.array([p for _, p in generators], dtype=np.float64)
        counts = rng.multinomial(bootstrap, prob / prob.sum())
    blocks = []
    for w_gen, count in zip(gen_weights, counts, strict=True):
        if count == 0:
            continue
        root_w = np.sqrt(w_gen)
        scaled = root_w * residuals
        scaled = (scaled - scaled.mean()) * math.sqrt(n / max(n - 2, 1))
        draws = rng.integers(0, n, size=(int(count), n))
        blocks.append(fitted[None, :] + scaled[draws] / root_w[None, :])
    y = np.concatenate(blocks)
    stat = _statistics(variance_profiles(y, g, exponents), y, batch_sizes, c, theta)
    # the ⌈(R + 1)·confidence⌉-th order statistic: np.quantile's interpolation at R = 200
    # sits at rank 190.05 of 200, a 0.945 quantile (Davison & Hinkley 1997, §5.2)
    rank = min(math.ceil((stat.shape[0] + 1) * confidence), stat.shape[0])
    return np.asarray(np.sort(stat, axis=0)[rank - 1], dtype=np.float64)


def profile_intervals(
    batch_sizes: FloatArray,
    log_steps: FloatArray,
    weights: FloatArray,
    theta: FloatArray,
    confidence: float,
    *,
    exponents: Sequence[float],
    bootstrap: int = PROFILE_BOOTSTRAP,
    seed: int = 0,
    mix: bool = True,
    grid_points: int = 2000,
) -> ProfileIntervals:
    """Profile-likelihood intervals {ψ: 2(ℓ̂ − ℓ_p(ψ)) ≤ q_ψ} for B_crit, S_min and E_min of the
    fit of log S = a + log(1 + e^c/B), θ = (a, c) = (log S_min, log B_crit) (Bates & Watts
    1988, §6.1, profile t; Venzon & Moolgavkar 1988): ℓ is the Gaussian log-likelihood with
    the scale profiled out, −n/2·log(SSR_w/n) + ½·Σ log w, maximised over the other parameter
    and over the variance exponent k ∈ ``exponents`` (each with its GLS weights, the k-choice
    of ``fit_steps_to_target``), so a value that fits well under another variance function
    stays in. q_ψ: the bootstrap quantile of ``bootstrap_thresholds`` (``bootstrap`` = 0:
    n·log(1 + t²_{n−3}/(n − 3)), the F(1, n − 3) test written as a likelihood
    ratio, a degree of freedom spent on k; n − 2 with ≤ 3 batch sizes). ``mix``: the bootstrap
    tables' variance functions drawn with probabilities ∝ exp(ℓ̂_k), the maximised likelihood
    under each exponent (else all from the chosen one). An exact table (no residual) gives the
    fit's point. ``weights`` and ``theta``: the fit's chosen weights and estimate, from which
    the bootstrap draws.

    The S_min and E_min sets are projections of the joint region {(a, c, k): ℓ ≥ ℓ̂ − q/2},
    exact on the c-grid: for each c and k the a with SSR_w(a, c) ≤ limit form â(c) ±
    √((limit − SSR_w(c))/Σw). Ends at the grid's edge (10⁴× beyond the measured batch sizes,
    where log(1 + e^c/B) has reached its asymptote) are reported open: B_crit's upper end inf
    (S_min's lower end 0) when S = E_min/B fits well enough, B_crit's and E_min's lower end 0
    when a constant S does."""
    b = np.asarray(batch_sizes, dtype=np.float64)
    y = np.asarray(log_steps, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    n = b.size
    c = log_b_crit_grid(b, grid_points)
    g = np.log1p(np.exp(c)[:, None] / b[None, :])
    fitted = theta[0] + np.log1p(math.exp(theta[1]) / b)
    resid = y - fitted
    if float((w * resid * resid).sum()) <= 1e-24:  # the table is the model: the fit's point
        s_hat, b_hat = math.exp(float(theta[0])), math.exp(float(theta[1]))
        return ProfileIntervals((b_hat, b_hat), (s_hat, s_hat), (s_hat * b_hat,) * 2, (0.0,) * 3, 0)
    if bootstrap > 0:
        rng = np.random.default_rng(seed)
        gens = None
        if mix and n > 3 and len(exponents) > 0:
            grid_profiles = variance_profiles(y[None, :], g, exponents)
            ll = np.array(
                [
                    float(p.loglik(_polished_min(y[None, :], p.weights, b, c, p.ssr, None, 0.0))[0])
                    for p in grid_profiles
                ]
            )
            prob = np.exp(ll - ll.max())
            gens = list(zip(exponents, prob.tolist(), strict=True))
        q = bootstrap_thresholds(
            b, fitted, w, resid, theta, exponents, confidence, bootstrap, rng, generators=gens
        )
    else:
        dof = n - 3 if n > 3 and len(exponents) > 0 else n - 2
        t2 = float(stats.t.ppf((1 + confidence) / 2, max(dof, 1))) ** 2
        q = np.full(3, n * math.log1p(t2 / max(dof, 1)))
        bootstrap = 0
    profiles = variance_profiles(y[None, :], g, exponents)
    best = max(
        float(prof.loglik(_polished_min(y[None, :], prof.weights, b, c, prof.ssr, None, 0.0))[0])
        for prof in profiles
    )
    # ℓ ≥ ℓ̂ − q/2  ⇔  SSR_w ≤ n·exp((2/n)(½Σlog w − ℓ̂ + q/2)), per exponent and parameter
    limits = [
        [n * math.exp((2.0 / n) * (float(p.log_det[0]) - best + float(q_j) / 2)) for q_j in q]
        for p in profiles
    ]
    coarse = _projections(profiles, limits, c)
    # the region can be narrower than the grid step when the noise is small: project again on
    # a fine grid over the c-window found, with the same weights; open ends from the full grid
    window = [float(theta[1])] + [x for ends in coarse for x in ends[2]]
    step = float(np.diff(c).max())
    fine_c = np.linspace(max(min(window) - step, c[0]), min(max(window) + step, c[-1]), 2000)
    fine_g = np.log1p(np.exp(fine_c)[:, None] / b[None, :])
    fine = []
    for prof in profiles:
        a_f, ssr_f = _profile_over_c(y[None, :], prof.weights, fine_g)
        fine.append(VarianceProfile(prof.weights, a_f, ssr_f, prof.log_det))
    refined = _projections(fine, limits, fine_c)
    ends = []
    point = (math.exp(float(theta[1])), math.exp(float(theta[0])), math.exp(float(sum(theta))))
    for (lo_c, hi_c, _), (lo_f, hi_f, _), estimate in zip(coarse, refined, point, strict=True):
        lo = lo_c if lo_c == 0.0 else min(lo_f, lo_c)
        hi = hi_c if math.isinf(hi_c) else max(hi_f, hi_c)
        # a cut below what the grids resolve (q ≈ 0) leaves no grid point inside: the estimate
        ends.append([lo, hi] if lo <= hi else [estimate, estimate])
    return ProfileIntervals(
        b_crit=(ends[0][0], ends[0][1]),
        s_min=(ends[1][0], ends[1][1]),
        e_min=(ends[2][0], ends[2][1]),
        thresholds=(float(q[0]), float(q[1]), float(q[2])),
        bootstrap=bootstrap,
    )


def _projections(
    profiles: list[VarianceProfile], limits: list[list[float]], c: FloatArray
) -> list[tuple[float, float, list[float]]]:
    """For ψ = log B_crit, log S_min, log E_min: the ends (exp, 0/inf where the region reaches
    the grid's edge) of the projection of {(a, c, k): SSR_w,k(a, c) ≤ limit_k} on the grid c,
    and the c-values the region spans."""
    out: list[tuple[float, float, list[float]]] = []
    for j in range(3):
        lo, hi, span = math.inf, 0.0, []
        for prof, limit_k in zip(profiles, limits, strict=True):
            ssr, a_c, sw = prof.ssr[0], prof.a[0], float(prof.weights.sum())
            limit = limit_k[j]
            inside = ssr <= limit
            if not inside.any():
                continue
            half = np.sqrt(np.clip((limit - ssr) / sw, 0.0, None))
            first, last = bool(inside[0]), bool(inside[-1])
            span += [float(c[inside].min()), float(c[inside].max())]
            if j == 0:
                lo_k = 0.0 if first else math.exp(float(c[inside].min()))
                hi_k = math.inf if last else math.exp(float(c[inside].max()))
            elif j == 1:
                lo_k = 0.0 if last else _exp(float((a_c - half)[inside].min()))
                hi_k = _exp(float((a_c + half)[inside].max()))
            else:
                lo_k = 0.0 if first else _exp(float((a_c + c - half)[inside].min()))
                hi_k = _exp(float((a_c + c + half)[inside].max()))
            lo, hi = min(lo, lo_k), max(hi, hi_k)
        out.append((lo, hi, span))
    return out


def _exp(value: float) -> float:
    """exp saturating at 0 and inf instead of under- or overflowing: an end beyond e^±700
    (a region the data do not bound) is reported open, never as a huge finite number that
    the planner's arithmetic would overflow (an S_min end of 8e307 made expected_steps_ci
    inf, which JSON cannot store)."""
    if value > 700.0:
        return math.inf
    if value < -700.0:
        return 0.0
    return math.exp(value)

"""Critical batch size from a steps-to-target table (McCandlish et al. 2018 §2.3;
docs/formulas.md#batch-size)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray
from scipy import optimize, stats

from curvplan_core.planner.steps_interval import PROFILE_BOOTSTRAP, profile_intervals
from curvplan_core.planner.variance_function import power_of_mean_weights, profile_loglik

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class CriticalBatchFit:
    s_min: float
    b_crit: float
    s_min_ci: tuple[float, float] | None
    b_crit_ci: tuple[float, float] | None
    e_min: float
    e_min_ci: tuple[float, float] | None
    r2: float
    n_points: int
    sigma: float = 0.0  # residual SD on log S (dof n − 2)
    variance_exponent: float = 1.0  # k of Var S ∝ μ^(2k) chosen by the fit
    # the fitted B_crit ran to the edge of the search range (10⁴× beyond the measured sizes):
    # the point estimate means nothing, the (open-ended) profile intervals still hold
    unbounded: bool = False


@dataclass(frozen=True)
class LinearCrossCheck:
    s_min: float
    b_crit: float
    e_min: float


#: Exponents k of the variance model Var(S_i) ∝ μ_i^(2k) tried by the fit: k = 1 is noise
#: proportional to S (constant on log S: seed-to-seed spread), k = 0 constant noise on S (the
#: resolution of the evaluations that time the target).
VARIANCE_EXPONENTS = (0.0, 0.25, 0.5, 0.75, 1.0)
IntervalMethod = Literal["profile", "variance_function", "gls_model", "hc3", "constant"]
GLS_METHODS = ("profile", "variance_function", "gls_model")


def _fit_log_steps(
    b: FloatArray, log_s: FloatArray, weights: FloatArray, start: FloatArray, bounds: Any
) -> Any:
    """Weighted least squares on log S over θ = (log S_min, log B_crit) (scipy TRF)."""
    root_w = np.sqrt(weights)

    def residuals(theta: FloatArray) -> FloatArray:
        res: FloatArray = root_w * (theta[0] + np.log1p(np.exp(theta[1]) / b) - log_s)
        return res

    def jacobian(theta: FloatArray) -> FloatArray:
        ratio = np.exp(theta[1]) / b
        jac: FloatArray = root_w[:, None] * np.column_stack(
            [np.ones(b.size), ratio / (1.0 + ratio)]
        )
        return jac

    return optimize.least_squares(
        residuals,
        np.clip(start, bounds[0], bounds[1]),
        jac=jacobian,
        bounds=bounds,
        method="trf",
        xtol=1e-12,
        ftol=1e-12,
        gtol=1e-12,
    )


def fit_steps_to_target(
    batch_sizes: FloatArray,
    steps: FloatArray,
    confidence: float,
    *,
    robust: bool = True,
    method: IntervalMethod | None = None,
    bootstrap: int = PROFILE_BOOTSTRAP,
    seed: int = 0,
) -> CriticalBatchFit:
    """Fit S = S_min(1 + B_crit/B) (McCandlish et al. 2018 §2.3, eq. 2.11;
    docs/formulas.md#batch-size) on log S over θ = (log S_min, log B_crit), which keeps both
    positive.

    The noise of a steps-to-target table is neither purely multiplicative (seed spread) nor
    purely additive (the evaluation interval that times the target), so the fit estimates its
    variance function: Var(log S_i) ∝ μ_i^(2(k−1)) (i.e. Var S_i ∝ μ_i^(2k), the power-of-the-
    mean model of Carroll & Ruppert 1988, ch. 2–3), k on the grid ``VARIANCE_EXPONENTS`` chosen
    by the Gaussian profile likelihood −n/2·log(SSR_w/n) + ½·Σ log w_i, with the weights
    w_i = μ_i^(2(1−k)) iterated three times (generalised least squares). Intervals (method
    "profile", the default): profile likelihood in log B_crit, log S_min, log E_min, maximised
    over k too, its threshold from ``bootstrap`` tables of resampled residuals refitted with the
    k-choice repeated (``steps_interval.profile_intervals``; seeded by ``seed``; 0 tables: the
    F(1, n − 3) threshold). Their ends may be open (B_crit's upper end inf) when the data
    cannot bound B_crit; a fit whose B_crit runs to the edge of the search range is then
    returned with ``unbounded`` set instead of refused (with 3 or more batch sizes). Method
    "variance_function" (the previous default): θ ± t_{n−3}·se with the HC3 sandwich of the
    weighted problem (√W J, √W r; MacKinnon & White 1985, ``robust_covariance``): the chosen k
    is often wrong with 5–7 points (additive noise read as multiplicative), and the model-based
    s_w²(JᵀWJ)⁻¹ then covered 0.91 at nominal 0.95; one degree of freedom is spent on k (with
    3 points: k = 1, s²(JᵀJ)⁻¹ and t_{n−2}); mapped through exp; E_min = B_crit·S_min with
    its log-variance from the same covariance. "gls_model": the same fit with the model-based
    covariance (the previous default). "hc3": the unweighted fit with the HC3 sandwich
    (MacKinnon & White 1985); "constant" (or ``robust=False``): unweighted with s²(JᵀJ)⁻¹ —
    all three kept for the coverage benchmark. Needs at least 2 distinct batch sizes
    (intervals need 3).
    """
    b = np.asarray(batch_sizes, dtype=np.float64)
    s = np.asarray(steps, dtype=np.float64)
    n = b.size
    if n < 2:
        raise ValueError("at least two batch sizes are needed")
    if method is None:
        method = "profile" if robust else "constant"
    log_s = np.log(s)
    bounds = _theta_bounds(b, log_s)
    best = _unweighted_fit(b, s, log_s, bounds)
    theta = best.x
    weights = np.ones(n)
    exponent = 1.0
    if method in GLS_METHODS and n > 3 and float(best.fun @ best.fun) > 1e-24:
        chosen = _variance_function_fit(b, log_s, theta, bounds)
        if chosen is not None:
            exponent, theta, weights = chosen
    unbounded = _at_edge(theta, bounds)
    if unbounded and (method != "profile" or n < 3):  # with 2 sizes there is no interval
        _check_inside(theta, bounds)
    s_min, b_crit = math.exp(theta[0]), math.exp(theta[1])
    resid = theta[0] + np.log1p(b_crit / b) - log_s
    ss_res = float(resid @ resid)
    ss_tot = float(((log_s - log_s.mean()) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    s_ci = b_ci = e_ci = None
    sigma = math.sqrt(ss_res / (n - 2)) if n > 2 else 0.0
    if n > 2 and method == "profile":
        prof = profile_intervals(
            b,
            log_s,
            weights,
            theta,
            confidence,
            exponents=VARIANCE_EXPONENTS if n > 3 else (),
            bootstrap=bootstrap,
            seed=seed,
        )
        s_ci, b_ci, e_ci = prof.s_min, prof.b_crit, prof.e_min
    elif n > 2:
        s_ci, b_ci, e_ci = _intervals(b, theta, resid, weights, confidence, method)
    return CriticalBatchFit(
        s_min, b_crit, s_ci, b_ci, s_min * b_crit, e_ci, r2, n, sigma, exponent, unbounded
    )


def unbounded_reason(fit: CriticalBatchFit, confidence: float) -> str:
    """What the planner says instead of a B_crit when the fit ran to the edge of its range:
    the steps fit perfect linear scaling S = E_min/B (or flat steps), and the profile interval
    is the honest answer, open at one end."""
    lo, hi = fit.b_crit_ci or (0.0, math.inf)
    low_text = f"{lo:.4g}" if lo > 0 else "0"
    if math.isinf(hi):
        shape, span, wanted = "fall as 1/B (perfect linear scaling)", f"[{low_text}, ∞)", "larger"
    else:
        shape, span, wanted = "are flat or rise", f"[{low_text}, {hi:.4g}]", "smaller"
    return (
        f"the steps {shape} over the measured batch sizes, so B_crit is not bounded by them: "
        f"the fitted B_crit runs to the edge of 10⁴× the measured range; its {confidence:.0%} "
        f"profile interval is {span}. Measure {wanted} batch sizes to bound it"
    )


Bounds = tuple[FloatArray, FloatArray]
Interval = tuple[float, float]


def _theta_bounds(b: FloatArray, log_s: FloatArray) -> Bounds:
    """θ bounds: S_min below the largest observed S; B_crit within 10⁴× the measured range."""
    log_b_lo = math.log(b.min()) - math.log(1e4)
    log_b_hi = math.log(b.max()) + math.log(1e4)
    lower = np.array([log_s.min() - 50.0, log_b_lo])
    upper = np.array([log_s.max(), log_b_hi])
    return (lower, upper)


def _unweighted_fit(b: FloatArray, s: FloatArray, log_s: FloatArray, bounds: Bounds) -> Any:
    """The unweighted fit on log S, the best of four starts: B_crit from the linear form
    S = S_min + S_min·B_crit·(1/B) (least squares in S), the median, smallest and largest B."""
    slope, intercept = np.polyfit(1.0 / b, s, 1)
    s0 = intercept if intercept > 0 else float(s.min())
    bc0 = slope / s0 if slope > 0 else float(np.median(b))
    ones = np.ones(b.size)
    best = None
    for start_bc in (bc0, float(np.median(b)), float(b.min()), float(b.max())):
        start = np.array([math.log(s0), math.log(max(start_bc, 1e-300))])
        res = _fit_log_steps(b, log_s, ones, start, bounds)
        if best is None or res.cost < best.cost:
            best = res
    assert best is not None
    return best


def _variance_function_fit(
    b: FloatArray, log_s: FloatArray, theta: FloatArray, bounds: Bounds
) -> tuple[float, FloatArray, FloatArray] | None:
    """The power-of-the-mean variance function (Carroll & Ruppert 1988, ch. 2–3): for each k
    of ``VARIANCE_EXPONENTS``, three rounds of generalised least squares from ``theta``; the
    k of the largest Gaussian profile likelihood, its θ and weights (None: none defined)."""
    ones = np.ones(b.size)
    chosen = None
    for k in VARIANCE_EXPONENTS:
        theta_k, w_k = theta, ones
        for _ in range(3):
            mu = np.exp(theta_k[0] + np.log1p(np.exp(theta_k[1]) / b))
            # Var(log S) ∝ μ^(2(k−1)): the power-of-the-mean weights of exponent k − 1
            w_k = power_of_mean_weights(mu, k - 1.0)
            theta_k = _fit_log_steps(b, log_s, w_k, theta_k, bounds).x
        r_k = np.sqrt(w_k) * (theta_k[0] + np.log1p(np.exp(theta_k[1]) / b) - log_s)
        loglik = profile_loglik(r_k, w_k)
        if loglik is None:
            continue
        if chosen is None or loglik > chosen[0]:
            chosen = (loglik, k, theta_k, w_k)
    if chosen is None:
        return None
    _, exponent, theta_chosen, weights = chosen
    return exponent, theta_chosen, weights


def _at_edge(theta: FloatArray, bounds: Bounds) -> bool:
    """Whether the fitted B_crit ran to the edge of its bounds (10⁴× the measured range)."""
    log_b_lo, log_b_hi = float(bounds[0][1]), float(bounds[1][1])
    return bool(theta[1] - log_b_lo < 1e-6 or log_b_hi - theta[1] < 1e-6)


def _check_inside(theta: FloatArray, bounds: Bounds) -> None:
    """Refuse a B_crit that ran to the edge of its bounds (the law does not hold)."""
    if _at_edge(theta, bounds):
        raise ValueError(
            "the steps do not follow S = S_min(1 + B_crit/B): the fitted B_crit runs to the "
            "edge of 10⁴× the measured batch range (steps flat or rising with batch size?)"
        )


def _intervals(
    b: FloatArray,
    theta: FloatArray,
    resid: FloatArray,
    weights: FloatArray,
    confidence: float,
    method: IntervalMethod,
) -> tuple[Interval | None, Interval | None, Interval | None]:
    """The S_min, B_crit and E_min intervals of :func:`fit_steps_to_target` (its docstring
    says which covariance each ``method`` uses); None where the covariance is not finite."""
    n = b.size

    def jacobian(theta: FloatArray) -> FloatArray:
        ratio = np.exp(theta[1]) / b
        return np.column_stack([np.ones(n), ratio / (1.0 + ratio)])

    jac = jacobian(theta)
    dof = n - 2
    cov: FloatArray | None
    if method in GLS_METHODS:
        spent = 1 if n > 3 else 0
        dof = n - 2 - spent
        root_w = np.sqrt(weights)
        wr = root_w * resid
        if spent and method == "variance_function":
            # the weights buy efficiency, the sandwich keeps the interval valid when the
            # chosen variance function is wrong (it often is with 5–7 points)
            cov = robust_covariance(jac * root_w[:, None], wr)
        else:
            try:
                cov = np.linalg.inv((jac * weights[:, None]).T @ jac) * float(wr @ wr) / dof
            except np.linalg.LinAlgError:
                cov = None
    else:
        cov = robust_covariance(jac, resid, robust=method == "hc3")
    if cov is None or not np.all(np.isfinite(cov)):
        return None, None, None
    t = float(stats.t.ppf((1 + confidence) / 2, dof))
    se0, se1 = math.sqrt(max(cov[0, 0], 0)), math.sqrt(max(cov[1, 1], 0))
    se_e = math.sqrt(max(cov[0, 0] + cov[1, 1] + 2 * cov[0, 1], 0))
    s_ci = _log_interval(theta[0], t * se0)
    b_ci = _log_interval(theta[1], t * se1)
    e_ci = _log_interval(theta[0] + theta[1], t * se_e)
    return s_ci, b_ci, e_ci


def robust_covariance(
    jac: FloatArray, resid: FloatArray, *, robust: bool = True
) -> FloatArray | None:
    """HC3 sandwich covariance of least-squares parameters (MacKinnon & White 1985, eq. HC3):
    (JᵀJ)⁻¹ Jᵀ diag(r_i²/(1 − h_i)²) J (JᵀJ)⁻¹, h_i the leverages. None when JᵀJ is singular.
    ``robust=False``: the constant-noise s²(JᵀJ)⁻¹ (for comparison in the benchmarks)."""
    try:
        bread = np.linalg.inv(jac.T @ jac)
    except np.linalg.LinAlgError:
        return None
    if not robust:
        dof = jac.shape[0] - jac.shape[1]
        return bread * float(resid @ resid) / dof if dof > 0 else None
    leverage = np.einsum("ij,jk,ik->i", jac, bread, jac)
    weight = resid**2 / np.clip(1.0 - leverage, 1e-3, None) ** 2
    cov = bread @ ((jac * weight[:, None]).T @ jac) @ bread
    return cov if np.all(np.isfinite(cov)) else None


def _log_interval(center: float, half_width: float) -> tuple[float, float]:
    """exp(center ± half_width), saturating at inf instead of overflowing."""
    return math.exp(max(center - half_width, -745.0)), math.exp(min(center + half_width, 709.0))


def linear_cross_check(batch_sizes: FloatArray, steps: FloatArray) -> LinearCrossCheck | None:
    """Linear form 1/S = a + b/E with E = B·S (McCandlish et al. 2018 §2.3;
    docs/formulas.md#batch-size):
    S_min = 1/a, B_crit = −b, E_min = B_crit·S_min. None when a ≤ 0 or b ≥ 0."""
    b = np.asarray(batch_sizes, dtype=np.float64)
    s = np.asarray(steps, dtype=np.float64)
    if b.size < 2:
        return None
    slope, intercept = np.polyfit(1.0 / (b * s), 1.0 / s, 1)
    if intercept <= 0 or slope >= 0:
        return None
    s_min = 1.0 / intercept
    b_crit = -slope
    return LinearCrossCheck(s_min, b_crit, s_min * b_crit)


def batch_at_step_overhead(b0: float, b_crit: float, overhead: float = 0.2) -> float:
    """Batch size whose steps exceed perfect linear scaling from B0 by `overhead`.

    With S(B) = S_min(1 + B_crit/B): S(B)·B/(S(B0)·B0) = (B + B_crit)/(B0 + B_crit) = 1 + overhead
    ⇒ B = (1 + overhead)·B0 + overhead·B_crit (Zhang et al. 2024 definition,
    docs/formulas.md#batch-size)."""
    return (1.0 + overhead) * b0 + overhead * b_crit


MAX_RECOMMENDED_BATCH = 2**62


def nearest_power_of_two(value: float) -> int | None:
    """Power of two nearest to `value` on a log2 scale (at least 1); None above 2^62."""
    if not math.isfinite(value) or value > MAX_RECOMMENDED_BATCH:
        return None
    if value <= 1:
        return 1
    return int(2 ** round(math.log2(value)))

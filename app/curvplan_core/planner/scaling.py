"""Loss-vs-data power law L(D) = E + A·D^(−β) (docs/formulas.md; Kaplan et al. 2020 / Hoffmann et
al.
2022 form with an irreducible loss E)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray
from scipy import optimize, stats

from curvplan_core.planner.critical_batch import robust_covariance
from curvplan_core.planner.variance_function import power_of_mean_weights, profile_loglik

FloatArray = NDArray[np.float64]

BETA_BOUNDS = (1e-3, 5.0)


@dataclass(frozen=True)
class ScalingFit:
    E: float
    A: float
    beta: float
    E_ci: tuple[float, float] | None
    A_ci: tuple[float, float] | None
    beta_ci: tuple[float, float] | None
    r2: float
    n_points: int
    cov: FloatArray | None  # covariance of θ = (E, log A, β)
    dof: int
    data: tuple[FloatArray, FloatArray] | None = None  # (D, L) the fit was made on
    weights: FloatArray | None = None  # the GLS weights of the chosen variance function


def _design(d: FloatArray, beta: float) -> FloatArray:
    return np.exp(-beta * np.log(d))


def _profile_start(d: FloatArray, loss: FloatArray) -> tuple[float, float, float]:
    """Grid over β; for each β the best (E, A) by linear least squares with 0 ≤ E ≤ min L, A > 0."""
    best: tuple[float, float, float, float] | None = None
    for beta in np.geomspace(BETA_BOUNDS[0] * 10, 3.0, 120):
        x = _design(d, beta)
        xm, ym = x.mean(), loss.mean()
        sxx = float(((x - xm) ** 2).sum())
        if sxx <= 0:
            continue
        a = float(((x - xm) * (loss - ym)).sum() / sxx)
        e = ym - a * xm
        e = min(max(e, 0.0), float(loss.min()))
        a = max(float(((loss - e) * x).sum() / (x * x).sum()), 1e-12)
        sse = float(((e + a * x - loss) ** 2).sum())
        if best is None or sse < best[0]:
            best = (sse, e, a, float(beta))
    if best is None:
        raise ValueError("loss_vs_data has no spread in n_samples")
    return best[1], best[2], best[3]


#: Exponents k of the variance model Var(L_i) ∝ μ_i^(2k) tried by the L(D) fit: k = 0 constant
#: noise on the loss (evaluation noise of a fixed held-out set), k = 1 noise proportional to
#: the loss (seed-to-seed spread of runs that end at different losses).
LOSS_VARIANCE_EXPONENTS = (0.0, 0.5, 1.0)
LossIntervalMethod = Literal["variance_function", "hc3", "constant"]


def fit_loss_vs_data(
    n_samples: FloatArray,
    losses: FloatArray,
    confidence: float,
    *,
    robust: bool = True,
    method: LossIntervalMethod | None = None,
) -> ScalingFit:
    """Fit L(D) = E + A·D^(−β) by bounded nonlinear least squares (scipy TRF).

    Parameters θ = (E, log A, β) with 0 ≤ E ≤ min L and β in BETA_BOUNDS. The noise of an
    L(D) table is constant (evaluation noise) or grows with the loss (seed spread), so the
    fit estimates its variance function (method "variance_function", the default): Var(L_i)
    ∝ μ_i^(2k), k in ``LOSS_VARIANCE_EXPONENTS`` chosen by the Gaussian profile likelihood,
    weights iterated three times (generalised least squares; Carroll & Ruppert 1988, ch. 2–3,
    ``variance_function``; with 4 points: unweighted). Intervals: θ ± t_{n−3}·se with cov the
    average of the model-based s_w²(JᵀWJ)⁻¹ and the HC3 sandwich of the weighted problem
    (√W J, √W r; MacKinnon & White 1985, ``robust_covariance``). Why the average (this
    project's choice, calibrated by benchmarks/bench_coverage.py on 8 sizes, 1000 tables): the
    model-based covariance alone under-covers log A (0.91) when k is misread, the sandwich
    alone over-covers (0.98–0.99, the unweighted HC3 this replaces: 0.985), the average
    covers 0.95–0.98 with additive and multiplicative noise. A's interval through exp, β's on
    log β. "hc3" (unweighted HC3) and "constant" (or ``robust=False``: unweighted s²(JᵀJ)⁻¹)
    stay for the coverage benchmark. Needs 3 points (4 for intervals) and at least 3 distinct
    dataset sizes.
    """
    d = np.asarray(n_samples, dtype=np.float64)
    y = np.asarray(losses, dtype=np.float64)
    n = d.size
    if np.unique(d).size < 3:
        raise ValueError("loss_vs_data needs at least 3 distinct n_samples")
    if method is None:
        method = "variance_function" if robust else "constant"
    log_d = np.log(d)
    e0, a0, b0 = _profile_start(d, y)

    def model(theta: FloatArray) -> FloatArray:
        predicted: FloatArray = theta[0] + np.exp(theta[1] - theta[2] * log_d)
        return predicted

    def jacobian(theta: FloatArray) -> FloatArray:
        power = np.exp(theta[1] - theta[2] * log_d)
        return np.column_stack([np.ones(n), power, -log_d * power])

    y_min = float(y.min())
    lower = np.array([0.0, -700.0, BETA_BOUNDS[0]])
    upper = np.array([max(y_min, 1e-12), 700.0, BETA_BOUNDS[1]])

    def solve(start: FloatArray, weights: FloatArray) -> FloatArray:
        root_w = np.sqrt(weights)
        res = optimize.least_squares(
            lambda th: root_w * (model(th) - y),
            np.clip(start, lower, upper),
            jac=lambda th: root_w[:, None] * jacobian(th),
            bounds=(lower, upper),
            method="trf",
            x_scale="jac",
            xtol=1e-14,
            ftol=1e-14,
            gtol=1e-14,
            max_nfev=5000,
        )
        return np.asarray(res.x, dtype=np.float64)

    ones = np.ones(n)
    theta = solve(np.array([e0, math.log(a0), b0]), ones)
    resid = model(theta) - y
    weights = ones
    if method == "variance_function" and n > 4 and float(resid @ resid) > 1e-24:
        chosen: tuple[float, FloatArray, FloatArray] | None = None
        for k in LOSS_VARIANCE_EXPONENTS:
            theta_k, w_k = theta, ones
            for _ in range(3):
                mu = model(theta_k)
                if not np.all(mu > 0):
                    break
                w_k = power_of_mean_weights(mu, k)
                theta_k = solve(theta_k, w_k)
            loglik = profile_loglik(np.sqrt(w_k) * (model(theta_k) - y), w_k)
            if loglik is not None and (chosen is None or loglik > chosen[0]):
                chosen = (loglik, theta_k, w_k)
        if chosen is not None:
            _, theta, weights = chosen
            resid = model(theta) - y
    ss_res = float(resid @ resid)
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    e_ci = a_ci = b_ci = None
    cov = None
    dof = n - 3
    if dof > 0:
        root_w = np.sqrt(weights)
        jac_w = jacobian(theta) * root_w[:, None]
        if method == "variance_function":
            model_cov = robust_covariance(jac_w, root_w * resid, robust=False)
            sandwich = robust_covariance(jac_w, root_w * resid)
            cov = None if model_cov is None or sandwich is None else 0.5 * (model_cov + sandwich)
        else:
            cov = robust_covariance(jacobian(theta), resid, robust=method == "hc3")
        if cov is not None and np.all(np.isfinite(cov)):
            t = float(stats.t.ppf((1 + confidence) / 2, dof))
            se = np.sqrt(np.maximum(np.diag(cov), 0.0))
            e_ci = (max(theta[0] - t * se[0], 0.0), theta[0] + t * se[0])
            a_ci = (math.exp(theta[1] - t * se[1]), math.exp(min(theta[1] + t * se[1], 700.0)))
            # β > 0: the interval is formed on log β (delta method, se(log β) = se(β)/β) and
            # mapped back, so its lower end is never 0
            log_b_half = min(t * se[2] / theta[2], 700.0)
            b_ci = (theta[2] * math.exp(-log_b_half), theta[2] * math.exp(log_b_half))
        else:
            cov = None
    return ScalingFit(
        E=float(theta[0]),
        A=math.exp(theta[1]),
        beta=float(theta[2]),
        E_ci=e_ci,
        A_ci=a_ci,
        beta_ci=b_ci,
        r2=r2,
        n_points=n,
        cov=cov,
        dof=dof,
        data=(d, y),
        weights=weights,
    )


def data_for_target(E: float, A: float, beta: float, target: float) -> float | None:
    """D = (A/(target − E))^(1/β) solving E + A·D^(−β) = target; None when target ≤ E."""
    if target <= E:
        return None
    log_d = (math.log(A) - math.log(target - E)) / beta
    return math.exp(log_d) if log_d < 700 else math.inf


def data_for_target_interval(
    fit: ScalingFit, target: float, confidence: float, rng: np.random.Generator | None = None
) -> tuple[float | None, float | None] | None:
    """Profile-likelihood interval of D_t = (A/(target − E))^(1/β), the data that reaches
    ``target`` on L(D) = E + A·D^(−β) (Hoffmann et al. 2022 eq. 2 without the model term).

    The law is rewritten in D_t itself, L(D) = E + (target − E)·(D_t/D)^β, and u = log D_t is
    profiled: SSR(u) = min over (E < target, β > 0) of the squared residuals. The interval is
    {u : SSR(u) ≤ SSR_min·(1 + t²_{n−3}/(n − 3))}, the F-calibrated likelihood-ratio region
    (Bates & Watts 1988, §6.1, eq. 6.4 for one parameter), mapped through exp: D_t > 0 by
    construction, so no end is ever 0 (the draws of β clamped at 1e-3 that used to send the
    lower end to 0.0 examples are gone). An end is None when the region is not bounded on that
    side within D ∈ [1, 10¹²·max D] (lower: the data cannot rule out one example; upper: the
    target may be unreachable). ``rng`` is unused (kept for callers)."""
    del rng
    if fit.data is None or fit.dof <= 0 or target <= 0:
        return None
    d, y = fit.data
    log_d = np.log(d)
    if not target > fit.E:
        return None
    u_hat = (math.log(fit.A) - math.log(target - fit.E)) / fit.beta
    y_min = float(y.min())

    lower = np.array([0.0, math.log(BETA_BOUNDS[0])])
    upper = np.array([max(min(y_min, target) - 1e-12, 1e-12), math.log(BETA_BOUNDS[1])])
    warm = {"p": np.clip(np.array([fit.E, math.log(fit.beta)]), lower, upper)}

    def ssr_at(u: float) -> float:
        def residuals(p: FloatArray) -> FloatArray:
            e, log_beta = p
            res: FloatArray = e + (target - e) * np.exp(np.exp(log_beta) * (u - log_d)) - y
            return res

        with np.errstate(over="ignore", invalid="ignore"):
            res = optimize.least_squares(
                residuals, warm["p"], bounds=(lower, upper), method="trf", max_nfev=200
            )
        if not np.all(np.isfinite(res.fun)):
            return math.inf
        warm["p"] = res.x  # the next u is close: start there
        return float(res.fun @ res.fun)

    ssr_min = min(ssr_at(u_hat), float("inf"))
    resid = fit.E + fit.A * np.exp(-fit.beta * log_d) - y
    ssr_min = min(ssr_min, float(resid @ resid))
    t = float(stats.t.ppf((1 + confidence) / 2, fit.dof))
    threshold = ssr_min * (1.0 + t * t / fit.dof) + 1e-300

    def crossing(edge: float) -> float | None:
        """The first u from û towards ``edge`` where SSR(u) exceeds the threshold: a scan
        of 48 steps (warm-started, the profile is not always monotone numerically), then
        brentq inside the bracketing step."""
        warm["p"] = np.clip(np.array([fit.E, math.log(fit.beta)]), lower, upper)
        grid = np.linspace(u_hat, edge, 49)
        prev = float(grid[0])
        for u in grid[1:]:
            if ssr_at(float(u)) > threshold:
                a, b = sorted((prev, float(u)))
                try:
                    return float(optimize.brentq(lambda v: ssr_at(v) - threshold, a, b, xtol=1e-3))
                except ValueError:  # the inner step was not bracketed after all
                    return float(u)
            prev = float(u)
        return None

    lo_u = crossing(0.0) if u_hat > 0 else None
    hi_u = crossing(float(log_d.max()) + math.log(1e12))
    lo = None if lo_u is None else math.exp(lo_u)
    hi = None if hi_u is None else math.exp(min(hi_u, 700.0))
    return (lo, hi)

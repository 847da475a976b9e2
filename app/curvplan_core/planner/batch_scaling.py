"""The critical batch as a power law in the tokens trained on, B_crit(D) = c·D^γ, fitted to
batch sweeps measured at several token counts, and its value for a larger target run
(docs/formulas.md#budgetbatch_scaling_law; docs/budget.md#batch).

Zhang et al. 2024 ("How Does Critical Batch Size Scale in Pre-training?", arXiv 2410.21676)
and Bergsma et al. 2025 ("Power Lines", arXiv 2505.13738) find that the critical batch grows
as a power of the data trained on, not of the model size. Each sweep's B_crit and its interval
come from the McCandlish fit S = S_min(1 + B_crit/B) of ``critical_batch.fit_steps_to_target``
(profile-likelihood intervals); the law is fitted to them here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy import stats

from curvplan_core.planner.critical_batch import fit_steps_to_target

FloatArray = NDArray[np.float64]

#: Bootstrap draws of the law (each a 2 × k matrix product: cheap).
LAW_BOOTSTRAP = 4000
#: A target beyond this many times the largest pilot's tokens is flagged as extrapolated.
EXTRAPOLATION_WARN_FACTOR = 10.0
#: Floor on a sweep's log-scale standard error (an exact table has a zero-width interval).
MIN_LOG_SE = 1e-4


@dataclass(frozen=True)
class SweepTable:
    """One batch sweep: the tokens each run trained on and its steps-to-target table."""

    tokens: float
    batch_sizes: Sequence[float]
    steps: Sequence[float]


@dataclass(frozen=True)
class SweepCritical:
    """A sweep's B_crit from the McCandlish fit, and whether the law uses it (``reason``:
    why not)."""

    tokens: float
    b_crit: float | None
    ci: tuple[float, float] | None
    batch_sizes: int
    used: bool
    reason: str | None = None


@dataclass(frozen=True)
class BatchLaw:
    """B_crit(D) = c·D^γ with intervals; ``draws`` holds the bootstrap (log B at the centre,
    γ) pairs that give every interval, ``tau`` the excess scatter of log B_crit about the law."""

    c: float
    gamma: float
    c_ci: tuple[float, float]
    gamma_ci: tuple[float, float]
    tau: float
    confidence: float
    log_d_centre: float
    centre_value: float
    tokens_range: tuple[float, float]
    sweeps: tuple[SweepCritical, ...]
    draws: FloatArray


def sweep_critical_batches(
    tables: Sequence[SweepTable], confidence: float, *, bootstrap: int, seed: int
) -> list[SweepCritical]:
    """B_crit and its profile interval for every sweep (``fit_steps_to_target``, McCandlish
    et al. 2018 eq. 2.11; docs/formulas.md#batchb_crit_fit). A sweep whose fit fails, runs to
    the edge of its range or has an open interval end is kept but not used by the law."""
    out = []
    for index, table in enumerate(tables):
        b = np.asarray(table.batch_sizes, dtype=np.float64)
        s = np.asarray(table.steps, dtype=np.float64)
        sweep_seed = int(np.random.SeedSequence(seed, spawn_key=(30, index)).generate_state(1)[0])
        try:
            fit = fit_steps_to_target(b, s, confidence, bootstrap=bootstrap, seed=sweep_seed)
        except ValueError as exc:
            out.append(SweepCritical(table.tokens, None, None, b.size, False, str(exc)))
            continue
        ci = fit.b_crit_ci
        if fit.unbounded:
            reason = "the steps do not bound B_crit (it runs to the edge of the fit's range)"
            out.append(SweepCritical(table.tokens, None, ci, b.size, False, reason))
        elif ci is None or ci[0] <= 0 or not math.isfinite(ci[1]):
            reason = "its B_crit interval is open: measure a wider range of batch sizes"
            out.append(SweepCritical(table.tokens, fit.b_crit, ci, b.size, False, reason))
        else:
            out.append(SweepCritical(table.tokens, fit.b_crit, ci, b.size, True))
    return out


def _side_scales(sweeps: Sequence[SweepCritical], z: float) -> tuple[FloatArray, FloatArray]:
    """Log-scale standard errors below and above each used B_crit from its interval ends:
    (log B̂ − log lo)/z and (log hi − log B̂)/z, floored at ``MIN_LOG_SE``."""
    lo, hi = [], []
    for sweep in sweeps:
        assert sweep.b_crit is not None and sweep.ci is not None
        centre = math.log(sweep.b_crit)
        lo.append(max((centre - math.log(sweep.ci[0])) / z, MIN_LOG_SE))
        hi.append(max((math.log(sweep.ci[1]) - centre) / z, MIN_LOG_SE))
    return np.array(lo), np.array(hi)


def _between_sweep_variance(x: FloatArray, y: FloatArray, variances: FloatArray) -> float:
    """τ² of the random-effects meta-regression y_i = a + γ·x_i + u_i + e_i, u ~ N(0, τ²),
    e_i ~ N(0, v_i): the method-of-moments estimator τ² = max(0, (Q − (k − 2))/tr P) with Q
    the weighted residual sum of the fixed-effects fit and P = W − WX(XᵀWX)⁻¹XᵀW, since
    E[Q] = k − 2 + τ²·tr P (the moment estimator of DerSimonian & Laird 1986 in its
    meta-regression form). 0 with two sweeps (no degree of freedom left)."""
    k = x.size
    if k < 3:
        return 0.0
    design = np.column_stack([np.ones(k), x])
    w = 1.0 / variances
    xtw = design.T * w
    beta = np.linalg.solve(xtw @ design, xtw @ y)
    resid = y - design @ beta
    q = float((w * resid**2).sum())
    proj = np.diag(w) - xtw.T @ np.linalg.solve(xtw @ design, xtw)
    return max(0.0, (q - (k - 2)) / float(np.trace(proj)))


def fit_batch_law(
    sweeps: Sequence[SweepCritical], confidence: float, *, seed: int = 0
) -> BatchLaw | str:
    """Fit log B_crit = log c + γ·log D to the sweeps the law can use, or say why it cannot be
    fitted: the power law of the critical batch in the data size of Zhang et al. 2024 (arXiv
    2410.21676) and Bergsma et al. 2025 (arXiv 2505.13738, B_crit ∝ D^γ independent of N);
    docs/formulas.md#budgetbatch_scaling_law.

    Method: weighted least squares on the log-log points, weights 1/(v_i + τ²), v_i the
    sweep's log-scale variance read off its profile interval (half the interval's log width
    over z) and τ² the between-sweep scatter the intervals do not explain (random-effects
    meta-regression, ``_between_sweep_variance``). Intervals: a parametric bootstrap over the
    per-sweep intervals (``LAW_BOOTSTRAP`` draws, seeded): each draw moves every log B_crit
    from the fitted line by a two-piece normal whose sides have the interval's lower and
    upper log half-widths (mirrored, so the percentile interval is the basic bootstrap
    interval; Davison & Hinkley 1997, §5.2) plus N(0, τ²), and refits; the intervals of log c,
    γ and of the law at any D are the ``confidence`` percentiles of the refits. With two sweeps
    the line runs through both points and its interval comes from their intervals alone."""
    used = [s for s in sweeps if s.used]
    tokens = sorted({s.tokens for s in used})
    if len(tokens) < 2:
        why = "; ".join(f"{s.tokens:.4g} tokens: {s.reason}" for s in sweeps if not s.used)
        return f"the law needs B_crit at 2 or more token counts; {len(tokens)} usable" + (
            f" ({why})" if why else ""
        )
    z = float(stats.norm.ppf((1 + confidence) / 2))
    log_d = np.log(np.array([s.tokens for s in used]))
    y = np.log(np.array([s.b_crit for s in used], dtype=np.float64))
    centre = float(log_d.mean())
    x = log_d - centre
    below, above = _side_scales(used, z)
    variances = ((below + above) / 2.0) ** 2
    tau2 = _between_sweep_variance(x, y, variances)
    design = np.column_stack([np.ones(x.size), x])
    w = 1.0 / (variances + tau2)
    xtw = design.T * w
    solve = np.linalg.solve(xtw @ design, xtw)  # θ = solve @ y, θ = (log B at the centre, γ)
    theta = solve @ y
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(31,)))
    normal = rng.standard_normal((LAW_BOOTSTRAP, x.size))
    moved = np.where(normal > 0, normal * above, normal * below)
    moved += math.sqrt(tau2) * rng.standard_normal((LAW_BOOTSTRAP, x.size))
    draws = (design @ theta)[None, :] + moved
    theta_draws = draws @ solve.T
    q = ((1 - confidence) / 2, (1 + confidence) / 2)
    gamma_lo, gamma_hi = np.quantile(theta_draws[:, 1], q)
    log_c_draws = theta_draws[:, 0] - theta_draws[:, 1] * centre
    log_c_lo, log_c_hi = np.quantile(log_c_draws, q)
    gamma = float(theta[1])
    return BatchLaw(
        c=_exp(float(theta[0]) - gamma * centre),
        gamma=gamma,
        c_ci=(_exp(float(log_c_lo)), _exp(float(log_c_hi))),
        gamma_ci=(float(gamma_lo), float(gamma_hi)),
        tau=math.sqrt(tau2),
        confidence=confidence,
        log_d_centre=centre,
        centre_value=float(theta[0]),
        tokens_range=(tokens[0], tokens[-1]),
        sweeps=tuple(sweeps),
        draws=np.asarray(theta_draws, dtype=np.float64),
    )


def law_at(law: BatchLaw, tokens: float, *, seed: int = 0) -> tuple[float, tuple[float, float]]:
    """B_crit(D) = c·D^γ at ``tokens`` and its interval: the percentiles of the bootstrap
    laws at D, each with a fresh N(0, τ²) (the scatter of one more run about the law), so it
    is a prediction interval for the target run's B_crit (docs/formulas.md)."""
    x0 = math.log(tokens) - law.log_d_centre
    value = _exp(law.centre_value + law.gamma * x0)
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(32,)))
    at = law.draws[:, 0] + law.draws[:, 1] * x0
    at = at + law.tau * rng.standard_normal(at.size)
    lo, hi = np.quantile(at, ((1 - law.confidence) / 2, (1 + law.confidence) / 2))
    return value, (_exp(float(lo)), _exp(float(hi)))


def extrapolation_warning(law: BatchLaw, tokens: float) -> str | None:
    """The warning for a target beyond ``EXTRAPOLATION_WARN_FACTOR``× the largest pilot's
    tokens (or below the smallest pilot's), else None."""
    lo, hi = law.tokens_range
    factor = tokens / hi
    if factor > EXTRAPOLATION_WARN_FACTOR:
        return (
            f"batch: the target run's {tokens:.4g} tokens are {factor:.3g}× the largest pilot's "
            f"{hi:.4g}: B_crit(D) = c·D^γ is extrapolated beyond {EXTRAPOLATION_WARN_FACTOR:g}× "
            "the measured range, where a bend in the law (or a change of recipe) goes unseen; "
            "a pilot sweep at more tokens narrows it"
        )
    if tokens < lo:
        return (
            f"batch: the target run's {tokens:.4g} tokens are below the smallest pilot's "
            f"{lo:.4g}: the law is extrapolated downwards"
        )
    return None


def _exp(value: float) -> float:
    """exp saturating at 0 and inf (an interval end beyond e^±700 is open)."""
    if value > 700.0:
        return math.inf
    if value < -700.0:
        return 0.0
    return math.exp(value)

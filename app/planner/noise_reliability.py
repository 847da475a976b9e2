"""How far a noise-scale ratio can be trusted: intervals on the log-ratio and conditional bias.

B_simple = tr Σ/|G|² and B_noise = tr(HΣ)/GᵀHG (McCandlish et al. 2018 §2.2) are ratios of two
estimates computed from the SAME per-example gradients, so their errors are correlated. The
engine supplies the leave-one-(group)-out jackknife standard error of log(ratio) (Efron &
Tibshirani 1993, ch. 11), which accounts for it; the interval is ratio·exp(±t·se) with Student-t
quantiles on (jackknife groups − 1) degrees of freedom.

A ratio is only reported when its denominator is significantly above zero. At low signal this
selects draws where the denominator came out large, so a REPORTED ratio is biased low.
``conditional_bias`` measures it by a parametric bootstrap at the measured statistics: draws of
(numerator, denominator) from the bivariate normal with the measured values, standard errors and
the covariance implied by the log-ratio standard error (delta method:
Var log r = s_n²/n² + s_d²/d² − 2c/(n·d)); P(defined) is the share of draws that pass the same
significance test, and the median of ratio*/ratio over those draws is the median
estimate/truth when the measured values are the truth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

BIAS_DRAWS = 4000


def t_quantile(confidence: float, dof: int | None, one_sided: bool = False) -> float:
    """Two-sided (or one-sided) Student-t quantile, normal when dof is None."""
    p = confidence if one_sided else (1.0 + confidence) / 2.0
    if dof is not None and dof > 0:
        return float(stats.t.ppf(p, dof))
    return float(stats.norm.ppf(p))


def log_ratio_interval(
    value: float, log_se: float, confidence: float, dof: int | None
) -> tuple[float, float]:
    """value·exp(±t·se) on the log scale (module docstring)."""
    half = t_quantile(confidence, dof) * log_se
    return value * math.exp(-min(half, 700.0)), value * math.exp(min(half, 700.0))


@dataclass(frozen=True)
class ConditionalBias:
    p_defined: float
    median_ratio: float | None
    draws: int


def implied_covariance(
    num: float, den: float, num_se: float, den_se: float, log_se: float | None
) -> float:
    """cov(num, den) from the delta-method identity of the module docstring (|ρ| ≤ 0.99)."""
    if log_se is None or num == 0 or den == 0:
        return 0.0
    c = 0.5 * num * den * ((num_se / num) ** 2 + (den_se / den) ** 2 - log_se**2)
    bound = 0.99 * num_se * den_se
    return float(min(max(c, -bound), bound))


def conditional_bias(
    num: float,
    den: float,
    num_se: float,
    den_se: float,
    log_se: float | None,
    confidence: float,
    dof: int | None,
    rng: np.random.Generator,
    draws: int = BIAS_DRAWS,
) -> ConditionalBias:
    """P(defined) and median(ratio*/ratio | defined) at the measured statistics (module doc)."""
    cov = implied_covariance(num, den, num_se, den_se, log_se)
    matrix = np.array([[num_se**2, cov], [cov, den_se**2]])
    sample = rng.multivariate_normal([num, den], matrix, size=draws, method="eigh")
    n_star, d_star = sample[:, 0], sample[:, 1]
    crit = t_quantile(confidence, dof, one_sided=True)
    defined = (d_star - crit * den_se > 0) & (n_star > 0)
    p = float(defined.mean())
    median = None
    if num > 0 and den > 0 and defined.any():
        median = float(np.median((n_star[defined] / d_star[defined]) / (num / den)))
    return ConditionalBias(p, median, draws)

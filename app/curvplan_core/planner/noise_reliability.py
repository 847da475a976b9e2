"""How far a noise-scale ratio can be trusted: intervals on the log-ratio and conditional bias.

B_simple = tr Σ/|G|² and B_noise = tr(HΣ)/GᵀHG (McCandlish et al. 2018 §2.2) are ratios of two
estimates computed from the SAME per-example gradients, so their errors are correlated. The
engine supplies the leave-one-(group)-out jackknife standard error of log(ratio) (Efron &
Tibshirani 1993, ch. 11), which accounts for it; the interval is ratio·exp(±t·se) with Student-t
quantiles on (jackknife groups − 1) degrees of freedom.

A ratio is only reported when its denominator is significantly above zero. At low signal this
selects draws where the denominator came out large, so a REPORTED ratio is biased low. The engine
measures that selection bias by a bootstrap on the gradients themselves
(``noise_stream.selection_bias``: P(defined), median estimate/truth); a normal approximation from
the four summary statistics alone is not used, because the distribution of |Ĝ|² depends on the
whole spectrum of Σ (it over-stated P(defined) threefold on a synthetic check).
"""

from __future__ import annotations

import math

from scipy import stats


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

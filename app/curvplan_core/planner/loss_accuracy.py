"""Loss-accuracy sample size: how many examples make the average loss accurate to ±ε.

With k i.i.d. examples the average loss L_k has standard deviation σ/√k (σ² the variance of the
per-example loss), so by the central limit theorem P(|L_k − μ| ≤ ε) ≈ confidence when

    k = ⌈z²·σ²/ε²⌉,   z = Φ⁻¹((1 + confidence)/2)

(the classical sample size for estimating a mean, e.g. Cochran 1977, "Sampling Techniques",
eq. 4.2). This is a different question from Petrov et al. 2025's k*(ε), which bounds the change
of the average loss when ONE example is added (≈ MAD(l)/k): at k* the loss error is ≈ σ/√k*,
many times ε. See docs/numbers.md.

The interval covers the population k: σ² is estimated by the sample variance s² whose standard
error, without assuming normal losses, is √((m₄ − s⁴·(n−3)/(n−1))/n) with m₄ the fourth central
moment (Cramér 1946, §27.4); the interval is s²·exp(±z·se/s²) (delta method on log s²).

Correlated samples. When the examples come in groups (windows of one document), the average
over k examples drawn as whole groups has variance σ²_eff/k with σ²_eff = deff·σ² ≥ σ². With a
group id per example, σ²_eff = n·V_CR, where V_CR is the cluster-robust (CR1) variance of the
mean over the G groups,

    V_CR = G/(G − 1) · Σ_g (Σ_{i∈g} (l_i − l̄))² / n²

(Liang & Zeger 1986; Cameron & Miller 2015, "A Practitioner's Guide to Cluster-Robust
Inference", eq. 11 for the intercept-only model). Its interval treats the G group totals as the
independent units: σ²_eff·(G − 1)/χ²_{G−1} quantiles. The design effect deff = σ²_eff/s² gives
the intra-cluster correlation ρ = (deff − 1)/(m̄ − 1) with m̄ = Σn_g²/n (Kish 1965, "Survey
Sampling", §5.4). Without group ids the lag-1 correlation of consecutive losses in file order is
the check: adjacent windows of one document are correlated, independent draws are not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy import stats

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class LossVariance:
    """s² of the per-example losses, its standard error and a two-sided interval."""

    variance: float
    se: float
    ci: tuple[float, float]
    n: int


def z_two_sided(confidence: float) -> float:
    """Φ⁻¹((1 + confidence)/2)."""
    return float(stats.norm.ppf((1.0 + confidence) / 2.0))


def loss_variance(losses: FloatArray, confidence: float) -> LossVariance:
    """s² (ddof 1) with the distribution-free standard error of the module docstring."""
    x = np.asarray(losses, dtype=np.float64)
    n = x.size
    if n < 4:
        raise ValueError("the loss variance interval needs at least 4 losses")
    centred = x - x.mean()
    s2 = float(centred @ centred) / (n - 1)
    m4 = float(np.mean(centred**4))
    var_s2 = max((m4 - s2 * s2 * (n - 3) / (n - 1)) / n, 0.0)
    se = math.sqrt(var_s2)
    z = z_two_sided(confidence)
    if s2 > 0:
        half = z * se / s2
        ci = (s2 * math.exp(-half), s2 * math.exp(min(half, 700.0)))
    else:
        ci = (0.0, 0.0)
    return LossVariance(s2, se, ci, n)


def k_loss_accuracy(variance: float, tolerance: float, confidence: float) -> float:
    """z²·σ²/ε² before the ceiling (module docstring)."""
    z = z_two_sided(confidence)
    return z * z * variance / (tolerance * tolerance)


def loss_error_at(k: int, variance: float, confidence: float) -> float:
    """Half-width z·σ/√k of the `confidence` interval of the average loss over k examples."""
    return z_two_sided(confidence) * math.sqrt(max(variance, 0.0) / max(k, 1))


@dataclass(frozen=True)
class ClusteredVariance:
    """σ²_eff = n·V_CR (module docstring) with its interval, and the grouping diagnostics."""

    effective_variance: float
    ci: tuple[float, float]
    n_groups: int
    mean_group_size: float
    design_effect: float | None
    design_effect_ci: tuple[float, float] | None
    intra_cluster_correlation: float | None


MIN_GROUPS = 4
"""The cluster-robust variance needs at least this many groups (G − 1 ≥ 3 degrees of freedom)."""


def cluster_robust_variance(
    losses: FloatArray, groups: NDArray[np.int64], confidence: float
) -> ClusteredVariance:
    """σ²_eff = n·V_CR, V_CR the CR1 cluster-robust variance of the mean (Cameron & Miller
    2015 eq. 11, intercept only), with a χ²_{G−1} interval and Kish's deff and ρ."""
    x = np.asarray(losses, dtype=np.float64)
    g = np.asarray(groups)
    if g.shape != x.shape:
        raise ValueError("one group id per loss is needed")
    _, codes, sizes = np.unique(g, return_inverse=True, return_counts=True)
    n_groups = int(sizes.size)
    if n_groups < MIN_GROUPS:
        raise ValueError(f"the cluster-robust variance needs at least {MIN_GROUPS} groups")
    n = x.size
    totals = np.bincount(codes, weights=x - x.mean(), minlength=n_groups)
    v_cr = n_groups / (n_groups - 1) * float(totals @ totals) / (n * n)
    eff = n * v_cr
    dof = n_groups - 1
    lo_q, hi_q = stats.chi2.ppf([(1 + confidence) / 2, (1 - confidence) / 2], dof)
    ci = (eff * dof / float(lo_q), eff * dof / float(hi_q))
    m_bar = float((sizes.astype(np.float64) ** 2).sum() / n)
    s2 = float(np.var(x, ddof=1)) if n > 1 else 0.0
    deff = deff_ci = rho = None
    if s2 > 0:
        deff = eff / s2
        deff_ci = (ci[0] / s2, ci[1] / s2)
        if m_bar > 1:
            rho = (deff - 1.0) / (m_bar - 1.0)
    return ClusteredVariance(eff, ci, n_groups, m_bar, deff, deff_ci, rho)


def adjacent_correlation(losses: FloatArray) -> float | None:
    """Lag-1 autocorrelation of the losses in their given order (module docstring)."""
    x = np.asarray(losses, dtype=np.float64)
    if x.size < 3:
        return None
    c = x - x.mean()
    denom = float(c @ c)
    return float(c[:-1] @ c[1:]) / denom if denom > 0 else None

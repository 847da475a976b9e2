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

"""Sample size k*(ε) for a tolerance ε (docs/formulas.md#sample-size)."""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from curvplan_core.planner.laws import theorem7_constant

# Sample sizes above this are reported as "not finite" rather than as a meaningless integer.
K_REPORT_LIMIT = 1e18


# Relative slack before taking a ceiling, so that float round-off (e.g. 10123.000000000002 for an
# exact 10123) does not add a sample.
_CEIL_SLACK = 1e-12


def _ceil_or_none(value: float) -> int | None:
    if not math.isfinite(value) or value > K_REPORT_LIMIT:
        return None
    return math.ceil(value * (1.0 - _CEIL_SLACK))


def k_empirical(C: float, alpha: float, tolerance: float) -> int | None:
    """k*(ε) = ⌈(C/ε)^(1/α)⌉ for the fitted Δ_k ≈ C·k^(−α) (docs/formulas.md#sample-size).

    None when the value is not finite (α ≤ 0, or beyond 1e18).
    """
    if alpha <= 0 or C <= 0:
        return None
    log_k = (math.log(C) - math.log(tolerance)) / alpha
    if log_k > math.log(K_REPORT_LIMIT):
        return None
    k = _ceil_or_none((C / tolerance) ** (1.0 / alpha))
    return None if k is None else max(1, k)


def k_empirical_many(
    C: NDArray[np.float64], alpha: NDArray[np.float64], tolerance: float
) -> NDArray[np.float64]:
    """Vectorised (C/ε)^(1/α) (before the ceiling) over bootstrap replicates; inf when α ≤ 0."""
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        log_k = (np.log(C) - math.log(tolerance)) / alpha
        k = np.where(alpha > 0, np.exp(log_k), np.inf)
    return np.maximum(k, 1.0)


def k_theorem7(
    loss_bound: float, hessian_bound: float, radius: float, tolerance: float
) -> int | None:
    """Petrov et al. 2025, Theorem 7 (docs/formulas.md#sample-size): k* = ⌈(2ℓ_max + M·R²)/ε⌉ −
    1."""
    return _ceil_minus_one(theorem7_constant(loss_bound, hessian_bound, radius) / tolerance)


def k_theorem7_tight(
    loss_bound: float, hessian_bound: float, radius: float, tolerance: float
) -> int | None:
    """Theorem 7 with the tighter constant ℓ_max (docs/formulas.md#sample-size, uses l ≥ 0):
    k* = ⌈(ℓ_max + M·R²)/ε⌉ − 1."""
    constant = theorem7_constant(loss_bound, hessian_bound, radius, tight=True)
    return _ceil_minus_one(constant / tolerance)


def k_squared(C2: float, tolerance: float) -> int | None:
    """Squared criterion (docs/formulas.md#sample-size): Δ2_k ≤ C2/(k+1)² ≤ ε ⇒ k* = ⌈√(C2/ε)⌉ −
    1."""
    return _ceil_minus_one(math.sqrt(C2 / tolerance))


def k_squared_rms(C2: float, tolerance: float) -> int | None:
    """Squared criterion read as an RMS tolerance √Δ2 ≤ ε: k* = ⌈√C2/ε⌉ − 1
    (docs/formulas.md#sample-size)."""
    return _ceil_minus_one(math.sqrt(C2) / tolerance)


def _ceil_minus_one(value: float) -> int | None:
    k = _ceil_or_none(value)
    return None if k is None else max(0, k - 1)


def percentile_interval(
    samples: NDArray[np.float64], confidence: float
) -> tuple[float, float] | None:
    """Two-sided percentile interval; None with fewer than 2 finite-or-infinite replicates."""
    if samples.size < 2:
        return None
    lo, hi = np.quantile(
        samples, [(1 - confidence) / 2, (1 + confidence) / 2], method="inverted_cdf"
    )
    return float(lo), float(hi)


def ceil_interval(
    interval: tuple[float, float] | None, minus_one: bool = False
) -> tuple[int | None, int | None] | None:
    """Apply the sample-size ceiling (⌈·⌉ or ⌈·⌉ − 1) to both ends of an interval."""
    if interval is None:
        return None
    shift = 1 if minus_one else 0
    ends = []
    for v in interval:
        k = _ceil_or_none(v)
        ends.append(None if k is None else max(0, k - shift))
    return ends[0], ends[1]

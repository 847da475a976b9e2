"""The power-of-the-mean variance function Var(y_i) ∝ μ_i^(2k) shared by the planner's
nonlinear fits (Carroll & Ruppert 1988, "Transformation and Weighting in Regression", ch. 2–3):
the weights of generalised least squares and the Gaussian profile log-likelihood that picks k."""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]


def power_of_mean_weights(mu: FloatArray, exponent: float) -> FloatArray:
    """GLS weights w_i = (μ_i/μ̄)^(−2k) for Var(y_i) ∝ μ_i^(2k) (Carroll & Ruppert 1988, eq.
    2.5), normalised by the mean of μ so they stay O(1); μ must be positive."""
    return np.asarray((mu / mu.mean()) ** (-2.0 * exponent), dtype=np.float64)


def profile_loglik(weighted_residuals: FloatArray, weights: FloatArray) -> float | None:
    """Gaussian log-likelihood with the scale profiled out, −n/2·log(SSR_w/n) + ½·Σ log w_i
    (Carroll & Ruppert 1988, §3.2, the pseudo-likelihood for the variance parameter); None
    when the weighted residuals are all zero."""
    ssr = float(weighted_residuals @ weighted_residuals)
    if ssr <= 0:
        return None
    n = weighted_residuals.size
    return -0.5 * n * math.log(ssr / n) + 0.5 * float(np.log(weights).sum())

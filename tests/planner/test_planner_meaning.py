"""Numbers that mean what they say: coverage and agreement over seeded synthetic replicates.

Each test draws data from a population with a known truth and checks an interval's coverage
(≥ 200 replicates, nominal 0.95, required in [0.90, 0.98]) or a number's stated meaning.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from curvplan_server.planner.loss_accuracy import k_loss_accuracy, loss_error_at, loss_variance

CONF = 0.95


def test_loss_accuracy_interval_covers_the_population_sample_size() -> None:
    """Gamma(2, 1) losses (skewed, σ² = 2): the interval of k = z²σ²/ε² covers the truth."""
    rng = np.random.default_rng(21)
    tol = 0.05
    truth = math.ceil(k_loss_accuracy(2.0, tol, CONF))
    hits = 0
    reps = 300
    for _ in range(reps):
        var = loss_variance(rng.gamma(2.0, 1.0, size=1000), CONF)
        lo = math.ceil(k_loss_accuracy(var.ci[0], tol, CONF))
        hi = math.ceil(k_loss_accuracy(var.ci[1], tol, CONF))
        hits += lo <= truth <= hi
    assert 0.90 <= hits / reps <= 0.98


def test_loss_accuracy_sample_size_delivers_the_accuracy() -> None:
    """With k = z²σ²/ε² examples the average loss is within ε of the mean ≈ 95 % of the time."""
    rng = np.random.default_rng(22)
    tol = 0.2
    k = math.ceil(k_loss_accuracy(2.0, tol, CONF))
    means = rng.gamma(2.0, 1.0, size=(4000, k)).mean(axis=1)
    within = float(np.mean(np.abs(means - 2.0) <= tol))
    assert 0.93 <= within <= 0.97
    assert loss_error_at(k, 2.0, CONF) == pytest.approx(tol, rel=0.01)

"""The profile-likelihood intervals of the steps-to-target fit S = S_min(1 + B_crit/B)
(McCandlish et al. 2018 §2.3; app/curvplan_core/planner/steps_interval.py) against closed
forms: the known-variance profile solved independently with scipy, an exact table, intervals
that shrink with the noise, and a table the data cannot bound."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import optimize, stats

from curvplan_core.planner import Measurements, Targets, make_plan
from curvplan_core.planner.critical_batch import fit_steps_to_target
from curvplan_core.planner.steps_interval import profile_intervals

B = 2.0 ** np.arange(3, 10)
S_MIN, B_CRIT = 1000.0, 200.0


def _log_steps(noise: np.ndarray) -> np.ndarray:
    return np.log(S_MIN * (1 + B_CRIT / B)) + noise


def _oracle_b_crit_interval(log_s: np.ndarray, confidence: float) -> tuple[float, float]:
    """Unweighted profile interval of B_crit by hand: for each c = log B_crit, log S_min by
    least squares (the mean of log S − log(1 + e^c/B)); the ends solve SSR(c) = SSR_min·(1 +
    t²_{n−2}/(n − 2)) (the F(1, n − 2) test), found with brentq on each side of the minimum."""

    def ssr(c: float) -> float:
        r = log_s - np.log1p(math.exp(c) / B)
        return float(((r - r.mean()) ** 2).sum())

    best = optimize.minimize_scalar(ssr, bounds=(0.0, 12.0), method="bounded")
    n = B.size
    t2 = stats.t.ppf(0.5 + confidence / 2, n - 2) ** 2
    level = best.fun * (1 + t2 / (n - 2))
    lo = optimize.brentq(lambda c: ssr(c) - level, -5.0, best.x, xtol=1e-10)
    hi = optimize.brentq(lambda c: ssr(c) - level, best.x, 15.0, xtol=1e-10)
    return math.exp(lo), math.exp(hi)


def test_known_variance_profile_matches_an_independent_solution() -> None:
    """Constant noise on log S, one variance function (no k to choose), F threshold: the
    grid projection must give the ends a scipy root-finder gives, to 0.5 %."""
    log_s = _log_steps(0.05 * np.random.default_rng(3).standard_normal(B.size))
    fit = fit_steps_to_target(B, np.exp(log_s), 0.95, method="hc3")  # unweighted point fit
    theta = np.array([math.log(fit.s_min), math.log(fit.b_crit)])
    got = profile_intervals(B, log_s, np.ones(B.size), theta, 0.95, exponents=(), bootstrap=0)
    want = _oracle_b_crit_interval(log_s, 0.95)
    assert got.bootstrap == 0
    assert got.b_crit[0] == pytest.approx(want[0], rel=5e-3)
    assert got.b_crit[1] == pytest.approx(want[1], rel=5e-3)
    assert got.b_crit[0] < fit.b_crit < got.b_crit[1]


def test_exact_table_gives_the_truth_as_a_point() -> None:
    fit = fit_steps_to_target(B, np.exp(_log_steps(np.zeros(B.size))), 0.95)
    for ci, truth in ((fit.b_crit_ci, B_CRIT), (fit.s_min_ci, S_MIN), (fit.e_min_ci, 2e5)):
        assert ci is not None
        assert ci[0] == pytest.approx(truth, rel=1e-3)
        assert ci[1] == pytest.approx(truth, rel=1e-3)


def test_intervals_hold_the_truth_and_shrink_with_the_noise() -> None:
    """One noise pattern scaled down (multiplicative, σ = 10 %, 3 %, 1 %): every interval
    holds the known S_min and B_crit, and each is narrower (in log) than the one before."""
    pattern = np.random.default_rng(5).standard_normal(B.size)
    widths: list[tuple[float, float]] = []
    for sigma in (0.1, 0.03, 0.01):
        fit = fit_steps_to_target(B, np.exp(_log_steps(sigma * pattern)), 0.95, seed=1)
        assert fit.b_crit_ci is not None and fit.s_min_ci is not None
        assert fit.b_crit_ci[0] <= B_CRIT <= fit.b_crit_ci[1], sigma
        assert fit.s_min_ci[0] <= S_MIN <= fit.s_min_ci[1], sigma
        widths.append(
            (
                math.log(fit.b_crit_ci[1] / fit.b_crit_ci[0]),
                math.log(fit.s_min_ci[1] / fit.s_min_ci[0]),
            )
        )
    for wider, narrower in itertools.pairwise(widths):
        assert narrower[0] < wider[0] and narrower[1] < wider[1]


def test_unbounded_b_crit_gets_an_open_interval_not_a_refusal() -> None:
    """Steps that fall as E/B over 8..128 (B_crit 10⁶, far above the sizes, 2 % noise): the
    fit runs to its edge; the interval must still hold the truth, open above (∞), with
    S_min's lower end 0, and the planner says not_computed with that interval."""
    b = 2.0 ** np.arange(3, 8)
    noise = 0.02 * np.random.default_rng(2).standard_normal(b.size)
    steps = 1.0 * (1 + 1e6 / b) * np.exp(noise)
    fit = fit_steps_to_target(b, steps, 0.95)
    assert fit.b_crit_ci is not None and fit.s_min_ci is not None
    assert math.isinf(fit.b_crit_ci[1]) and fit.b_crit_ci[0] <= 1e6
    assert fit.s_min_ci[0] == 0.0
    with pytest.raises(ValueError, match="edge"):
        fit_steps_to_target(b, steps, 0.95, method="variance_function")
    table = [{"batch_size": int(x), "steps": float(y)} for x, y in zip(b, steps, strict=True)]
    section = make_plan(Measurements.model_validate({"steps_to_target": table}), Targets())
    b_crit = section.batch_size.b_crit
    if fit.unbounded:
        assert b_crit.status == "not_computed"
        assert "profile interval" in b_crit.reason and "∞" in b_crit.reason


def test_intervals_are_well_formed_on_varied_tables() -> None:
    """3–8 batch sizes, B_crit from 0.1 to 10⁶, noise from 0.01 % to 100 %, and tables that do
    not follow the law (steps flat or rising): every interval is ordered, non-negative and
    holds its own point estimate (the profile statistic is 0 there), and each fit stays well
    under a second."""
    import time

    rng = np.random.default_rng(11)
    for i in range(40):
        n = int(rng.integers(3, 9))
        b = np.sort(rng.choice(2.0 ** np.arange(15), n, replace=False))
        sigma = 10 ** rng.uniform(-4, 0)
        if i % 3:
            steps = 10 ** rng.uniform(1, 5) * (1 + 10 ** rng.uniform(-1, 6) / b)
        else:
            steps = 100.0 * (b / b.min()) ** rng.uniform(-0.05, 0.3)
        steps = steps * np.exp(sigma * rng.standard_normal(n))
        start = time.perf_counter()
        fit = fit_steps_to_target(b, steps, 0.95, seed=i)  # n ≥ 3: never refused
        assert time.perf_counter() - start < 1.0
        for ci, value in ((fit.b_crit_ci, fit.b_crit), (fit.s_min_ci, fit.s_min)):
            assert ci is not None
            assert 0.0 <= ci[0] <= ci[1]
            assert ci[0] <= value * (1 + 1e-6) and value * (1 - 1e-6) <= ci[1], (ci, value)


def test_plans_with_open_interval_ends_are_storable_as_json() -> None:
    """An end the data do not bound is open (None), never a saturated float: a 3-size sweep
    whose S_min interval reached e^709 once made expected_steps_ci inf, and the worker could
    not store the sweep's result (JSON has no inf). Every plan must pass json.dumps with
    allow_nan=False, as the worker's check does."""
    import json

    from curvplan.types.planner import Measurements, Targets
    from curvplan_core.planner.plan import make_plan

    rng = np.random.default_rng(7)
    tables = [[(8, 33903.45276277323), (16, 18960.696163269324), (32, 10479.780744384056)]]
    for _ in range(30):
        sizes = [2**k for k in range(3, 3 + int(rng.integers(3, 6)))]
        b_crit, noise = 10 ** rng.uniform(-1, 5), rng.choice([0.02, 0.15, 0.4])
        tables.append([(b, 100 * (1 + b_crit / b) * math.exp(rng.normal(0, noise))) for b in sizes])
    for table in tables:
        rec = make_plan(
            Measurements(steps_to_target=[{"batch_size": b, "steps": s} for b, s in table]),
            Targets(target_loss=1.0),
        )
        json.dumps(rec.model_dump(mode="json"), allow_nan=False)
    first = make_plan(
        Measurements(steps_to_target=[{"batch_size": b, "steps": s} for b, s in tables[0]]),
        Targets(target_loss=1.0),
    )
    s_min_ci = first.batch_size.b_crit.s_min_ci
    assert s_min_ci is not None and s_min_ci[1] is None  # open, not a saturated float

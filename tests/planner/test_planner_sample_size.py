"""k*(ε): formulas, monotonicity in ε and the assembled sample_size section."""

from __future__ import annotations

import itertools
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from curvplan_core.planner import Measurements, Targets, make_plan
from curvplan_core.planner.sample_size import (
    k_empirical,
    k_squared,
    k_theorem7,
    k_theorem7_tight,
)

LOSSES = np.random.default_rng(0).exponential(size=4000).tolist()


def test_theorem7_formulas_by_hand() -> None:
    # (2·5 + 12.3·0.01)/0.001 = 10123 → ⌈·⌉ − 1 = 10122
    assert k_theorem7(5.0, 12.3, 0.1, 0.001) == 10122
    assert k_theorem7_tight(5.0, 12.3, 0.1, 0.001) == 5122
    assert k_empirical(0.8, 1.0, 0.001) == 800
    assert k_empirical(0.8, 0.5, 0.01) == 6400
    assert k_squared(1.0, 0.01) == 9  # ⌈√100⌉ − 1
    assert k_empirical(1.0, -0.2, 0.1) is None
    # float round-off must not add a sample: 0.07/0.01 evaluates to 7.000000000000001
    assert 0.07 / 0.01 > 7
    assert k_empirical(0.07, 1.0, 0.01) == 7
    assert k_theorem7_tight(0.07, 0.0, 0.0, 0.01) == 6  # ⌈7⌉ − 1


@settings(max_examples=200, deadline=None)
@given(
    C=st.floats(1e-6, 1e3),
    alpha=st.floats(0.05, 3),
    l_max=st.floats(1e-3, 1e3),
    m=st.floats(0, 1e3),
    r=st.floats(0, 10),
    e1=st.floats(1e-6, 10),
    e2=st.floats(1e-6, 10),
)
def test_property_smaller_tolerance_never_gives_smaller_k(
    C: float, alpha: float, l_max: float, m: float, r: float, e1: float, e2: float
) -> None:
    small, big = min(e1, e2), max(e1, e2)
    pairs = [
        (k_empirical(C, alpha, small), k_empirical(C, alpha, big)),
        (k_theorem7(l_max, m, r, small), k_theorem7(l_max, m, r, big)),
        (k_theorem7_tight(l_max, m, r, small), k_theorem7_tight(l_max, m, r, big)),
        (k_squared(C, small), k_squared(C, big)),
    ]
    for k_small, k_big in pairs:
        if k_small is None:  # beyond the reporting limit: "more than any finite k"
            continue
        assert k_big is not None and k_small >= k_big


@settings(max_examples=15, deadline=None)
@given(st.lists(st.floats(1e-4, 1.0), min_size=2, max_size=5, unique=True))
def test_property_plan_k_monotone_in_tolerance(tolerances: list[float]) -> None:
    m = Measurements(per_sample_losses=LOSSES, loss_bound=20.0, hessian_norm_bound=3.0)
    t = Targets(tolerances=tolerances, radius=0.5, orderings=8, bootstrap=50)
    rows = sorted(make_plan(m, t).sample_size.per_tolerance, key=lambda p: p.tolerance)
    for tighter, looser in itertools.pairwise(rows):
        for field in ("empirical", "theoretical", "theoretical_tight", "squared", "squared_rms"):
            a, b = getattr(tighter, field), getattr(looser, field)
            assert a.k >= b.k, field
            if a.ci is not None:
                assert a.ci[0] >= b.ci[0] and a.ci[1] >= b.ci[1]


def test_section_values_and_intervals() -> None:
    m = Measurements(per_sample_losses=LOSSES, hessian_norm_bound=12.3)
    t = Targets(
        tolerances=[0.01, 0.0001], radius=0.1, orderings=50, bootstrap=300, available_samples=1000
    )
    section = make_plan(m, t).sample_size
    fit = section.fit
    assert fit.alpha_ci[0] <= fit.alpha <= fit.alpha_ci[1]
    assert fit.C_ci[0] <= fit.C <= fit.C_ci[1]
    assert abs(fit.alpha - 1) < 0.05
    assert section.loss_bound.source == "observed_max"
    assert section.loss_bound.value == max(LOSSES)
    loose, tight = section.per_tolerance
    assert loose.empirical.k == math.ceil((fit.C / 0.01) ** (1 / fit.alpha))
    assert loose.empirical.ci[0] <= loose.empirical.k <= loose.empirical.ci[1]
    assert loose.theoretical.k == math.ceil((2 * max(LOSSES) + 12.3 * 0.01) / 0.01) - 1
    assert loose.theoretical_tight.k == math.ceil((max(LOSSES) + 12.3 * 0.01) / 0.01) - 1
    # 1000 examples stabilise the landscape at ε = 0.01 but do not pin the loss to ±0.01; no
    # warning compares the training data with an evaluation number (budget.data's
    # available_is_enough needs a data sweep)
    assert loose.empirical.ci[1] <= 1000 < loose.evaluation_set_size.ci[1]
    assert tight.evaluation_set_size.ci[1] > 1000
    assert section.available_samples == 1000 and section.available_samples_source == "targets"
    warnings = make_plan(m, t).warnings
    codes = [w.code for w in warnings]
    assert "available_samples_insufficient" not in codes
    assert "extrapolation" in codes
    deprecated = [w.detail for w in warnings if w.code == "deprecated_field"]
    assert not any("measurements.available_samples" in d for d in deprecated)


def test_available_samples_in_measurements_is_deprecated_but_accepted() -> None:
    t = Targets(tolerances=[0.5], orderings=8, bootstrap=0)
    old = make_plan(Measurements(per_sample_losses=LOSSES, available_samples=10**6), t)
    assert old.sample_size.available_samples == 10**6
    assert old.sample_size.available_samples_source == "measurements (deprecated)"
    assert "deprecated_field" in [w.code for w in old.warnings]
    # no fallback to the number of measured losses: without a dataset size there is no verdict
    none = make_plan(Measurements(per_sample_losses=LOSSES), t).sample_size
    assert none.available_samples is None


def test_off_minimum_curves_from_perturbed_losses() -> None:
    rng = np.random.default_rng(1)
    base = np.array(LOSSES)
    perturbed = [(base + 0.5 * rng.random(base.size) ** 2).tolist() for _ in range(3)]
    m = Measurements(
        per_sample_losses=LOSSES,
        perturbed_losses={"radius": 0.2, "losses": perturbed, "kind": "random"},
    )
    section = make_plan(m, Targets(orderings=10, bootstrap=50)).sample_size
    (off,) = section.off_minimum
    assert off.radius == 0.2 and off.n_points == 3
    assert abs(off.fit.alpha - 1) < 0.1
    assert off.theorem7_C is None  # no M given

    with_bounds = make_plan(
        m.model_copy(update={"loss_bound": 20.0, "hessian_norm_bound": 4.0}),
        Targets(orderings=10, bootstrap=50),
    ).sample_size.off_minimum[0]
    assert with_bounds.theorem7_C == 2 * 20.0 + 4.0 * 0.2**2
    assert with_bounds.theorem7_C_tight == 20.0 + 4.0 * 0.2**2
    assert with_bounds.tightness == with_bounds.fit.C / with_bounds.theorem7_C
    assert with_bounds.tightness < 1  # the bound holds for these losses


def test_theoretical_needs_radius_and_says_so() -> None:
    m = Measurements(per_sample_losses=LOSSES, hessian_norm_bound=1.0)
    row = make_plan(m, Targets(tolerances=[0.1], orderings=4, bootstrap=10)).sample_size
    assert row.per_tolerance[0].theoretical.status == "not_computed"
    assert "targets.radius" in row.per_tolerance[0].theoretical.reason


def test_short_window_and_far_alpha_are_flagged() -> None:
    m = Measurements(per_sample_losses=LOSSES)
    t = Targets(tolerances=[0.1], fit_window=[2, 12], orderings=20, bootstrap=20)
    codes = [w.code for w in make_plan(m, t).warnings]
    assert "fit_window_too_short" in codes


def test_theory_only_plan_without_losses() -> None:
    m = Measurements(loss_bound=5.0, hessian_norm_bound=12.3)
    section = make_plan(m, Targets(tolerances=[0.001], radius=0.1)).sample_size
    row = section.per_tolerance[0]
    assert row.theoretical.k == 10122
    assert row.empirical.status == "not_computed"
    assert section.fit.status == "not_computed"

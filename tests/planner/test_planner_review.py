"""Regression tests from the science review: analytic values for the noise-scale outputs,
negative unbiased estimates, the theory-applicability flag and the input size cap."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from curvplan.types import planner as schemas
from curvplan_core.planner import (
    Measurements,
    PlanInputError,
    Targets,
    check_workload,
    make_plan,
)
from curvplan_core.planner.batch_section import lr_scaling_at
from curvplan_core.planner.loss_curve import default_window, fit_power_law, loss_difference_curves
from curvplan_core.planner.sample_size import k_squared, k_squared_rms


def _codes(plan) -> set[str]:
    return {w.code for w in plan.warnings}


def test_epsilon_opt_matches_mccandlish_by_hand() -> None:
    """ε_max = |G|²/GᵀHG, B_noise = tr(HΣ)/GᵀHG, ε_opt(B) = ε_max/(1 + B_noise/B) (§7.1)."""
    m = Measurements(
        gradient_noise={
            "grad_sq_norm": 0.02,
            "trace_sigma": 3.1,
            "gHg": 0.004,
            "trace_h_sigma": 0.9,
        }
    )
    batch = make_plan(m, Targets()).batch_size
    assert batch.b_simple.value == pytest.approx(155.0)
    assert batch.b_noise.value == pytest.approx(225.0)
    # one checkpoint recommends no batch (budget.batch is not_available): no factor
    assert batch.lr_scaling.factor_at_recommended is None
    lr = lr_scaling_at(batch, 256).lr_scaling  # at a batch the budget would recommend
    assert lr.epsilon_max == pytest.approx(5.0)
    assert lr.factor_at_recommended == pytest.approx(1 / (1 + 225 / 256))
    assert lr.epsilon_opt_at_recommended == pytest.approx(5.0 / (1 + 225 / 256))
    assert lr.note is None


def test_negative_unbiased_grad_sq_norm_is_accepted_and_never_clamped() -> None:
    """Pitfall 13: the unbiased |G|² went to −64 at w*; it must validate, make B_simple
    undefined with its warning, and never yield a (negative) ε_max."""
    m = Measurements(
        gradient_noise={
            "grad_sq_norm": -64.0,
            "grad_sq_norm_se": 40.0,
            "trace_sigma": 3.0,
            "gHg": 0.01,
            "trace_h_sigma": 0.9,
        }
    )
    plan = make_plan(m, Targets())
    batch = plan.batch_size
    assert batch.grad_sq_norm.value == -64.0  # reported as measured
    assert batch.b_simple.status == "not_computed" and "|G|²" in batch.b_simple.reason
    assert "b_simple_undefined" in _codes(plan)
    assert batch.b_noise.value == pytest.approx(90.0)
    lr = lr_scaling_at(batch, 64).lr_scaling
    assert lr.epsilon_max is None and lr.epsilon_opt_at_recommended is None
    assert "ε_max undefined" in lr.note
    assert lr.factor_at_recommended == pytest.approx(1 / (1 + 90 / 64))


def test_negative_trace_sigma_and_gHg_validate_and_leave_the_ratios_undefined() -> None:
    m = Measurements(
        gradient_noise={"grad_sq_norm": 0.5, "trace_sigma": -1.0, "gHg": -0.2, "trace_h_sigma": 1.0}
    )
    plan = make_plan(m, Targets())
    assert plan.batch_size.b_simple.status == "not_computed"
    assert plan.batch_size.b_noise.status == "not_computed"
    assert {"b_noise_undefined", "noise_estimate_negative"} <= _codes(plan)
    assert plan.budget.batch.recommended is None


def test_theory_flag_warns_and_marks_theoretical_k() -> None:
    losses = np.random.default_rng(0).exponential(size=500).tolist()
    base = {"per_sample_losses": losses, "loss_bound": 20.0, "hessian_norm_bound": 3.0}
    targets = Targets(tolerances=[0.01], radius=0.1, orderings=10, bootstrap=50)
    outside = {"applicable": False, "reasons": ["n_heads=4: the theory is single-head"]}
    plan = make_plan(Measurements(**base, theory=outside), targets)
    warning = next(w for w in plan.warnings if w.code == "theory_assumptions_not_met")
    assert "n_heads=4" in warning.detail
    theo = plan.sample_size.per_tolerance[0].theoretical
    assert theo.k == math.ceil((2 * 20.0 + 3.0 * 0.01) / 0.01) - 1  # the number is still given
    assert "outside Theorem 7's assumptions" in theo.note
    for theory in (None, {"applicable": True}):
        quiet = make_plan(Measurements(**base, theory=theory), targets)
        assert "theory_assumptions_not_met" not in _codes(quiet)
        assert quiet.sample_size.per_tolerance[0].theoretical.note is None
    with pytest.raises(ValidationError) as err:
        Measurements(theory={"reasons": ["x"]})
    assert err.value.errors()[0]["loc"] == ("theory", "applicable")


def test_workload_cap_names_targets_orderings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schemas, "MAX_LOSS_EVALUATIONS", 10_000)
    losses = np.random.default_rng(1).exponential(size=300).tolist()
    m = Measurements(per_sample_losses=losses, perturbed_losses={"radius": 0.1, "losses": [losses]})
    check_workload(m, Targets(orderings=16))  # (300 + 300) × 16 = 9600: fine
    with pytest.raises(PlanInputError) as err:
        make_plan(m, Targets(orderings=17))  # 10200 > 10000
    assert err.value.field == "targets.orderings"
    assert str(err.value).startswith("targets.orderings: 600 losses × 17 orderings")
    assert "at most 16 orderings" in str(err.value)


def test_size_caps_are_in_the_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    props = Measurements.model_json_schema()["properties"]
    losses = next(s for s in props["per_sample_losses"]["anyOf"] if s.get("type") == "array")
    assert losses["maxItems"] == schemas.MAX_PER_SAMPLE_LOSSES
    assert schemas.MAX_LOSS_EVALUATIONS >= 1_000_000 * 100  # the benchmark size fits
    monkeypatch.setattr(schemas, "MAX_PERTURBED_LOSSES", 10)
    schemas.PerturbedLosses(radius=0.1, losses=[[0.0] * 5] * 2)
    with pytest.raises(ValidationError) as err:
        Measurements(perturbed_losses={"radius": 0.1, "losses": [[0.0] * 6] * 2})
    assert err.value.errors()[0]["loc"] == ("perturbed_losses", "losses")
    assert "exceeds the cap of 10" in err.value.errors()[0]["msg"]


def test_squared_criterion_constant_is_the_loss_variance() -> None:
    """Digest §3: E[Δ_k²] = Var(l)(1 + 1/k)/(k+1)², so the fixed-slope C2 ≈ Var(l) and
    k* = ⌈√(C2/ε)⌉ − 1 (mean-square tolerance) or ⌈√C2/ε⌉ − 1 (RMS tolerance)."""
    losses = np.random.default_rng(4).normal(5.0, 2.0, 20_000)
    curves = loss_difference_curves(losses, orderings=200, seed=0)
    window = default_window(losses.size)
    c2 = fit_power_law(
        curves.sq_by_ordering,
        curves.grid,
        window,
        bootstrap=0,
        seed=0,
        fixed_alpha=2.0,
        k_offset=1.0,
    )
    assert abs(c2.C / 4.0 - 1) < 0.05, c2.C
    assert k_squared(4.0, 1e-4) == 199  # √(4/1e-4) = 200
    assert k_squared_rms(4.0, 1e-2) == 199  # 2/0.01 = 200


def test_plan_intervals_include_the_data_sampling_and_say_so() -> None:
    losses = np.random.default_rng(7).exponential(size=3000)
    m = Measurements(per_sample_losses=losses.tolist())
    targets = Targets(tolerances=[1e-3], orderings=60, bootstrap=400)
    section = make_plan(m, targets).sample_size
    fit = section.fit
    # The formulas name the interval method; docs/formulas.md says it covers the N-sample draw.
    assert fit.formula.startswith("sample.power_law_fit:") and "sample.fit_intervals" in fit.formula
    assert section.per_tolerance[0].empirical.formula.startswith("sample.k_empirical:")
    docs = (Path(__file__).resolve().parents[2] / "docs" / "formulas.md").read_text()
    intervals = docs.split("### sample.fit_intervals", 1)[1].split("###", 1)[0]
    assert "drawing the N samples" in intervals
    # the same fit with the orderings' bootstrap only (as before the fix) is clearly narrower
    curves = loss_difference_curves(losses, orderings=60, seed=0)
    alone = fit_power_law(
        curves.abs_by_ordering, curves.grid, default_window(3000), bootstrap=400, seed=0, stream=1
    )
    assert abs(alone.C / fit.C - 1) < 1e-12
    lo, hi = np.quantile(alone.C_boot, [0.025, 0.975])
    assert np.log(fit.C_ci[1] / fit.C_ci[0]) > 1.2 * np.log(hi / lo)
    assert "few_orderings" not in _codes(make_plan(m, targets))
    few = make_plan(m, Targets(tolerances=[1e-3], orderings=10, bootstrap=50))
    assert "few_orderings" in _codes(few)


def test_theoretical_k_says_when_m_is_only_a_measured_maximum() -> None:
    losses = np.random.default_rng(2).exponential(size=200).tolist()
    targets = Targets(tolerances=[0.05], radius=0.5, orderings=4, bootstrap=0)
    measured = Measurements(per_sample_losses=losses, per_sample_hessian_norms=[1.0, 4.0])
    theo = make_plan(measured, targets).sample_size.per_tolerance[0].theoretical
    # ℓ_max = observed max, M = 4: k* = ⌈(2ℓ + 4·0.25)/0.05⌉ − 1
    assert theo.k == math.ceil((2 * max(losses) + 4.0 * 0.25) / 0.05) - 1
    assert "lower estimate" in theo.note and "observed maximum" in theo.note
    given = Measurements(per_sample_losses=losses, loss_bound=50.0, hessian_norm_bound=4.0)
    assert make_plan(given, targets).sample_size.per_tolerance[0].theoretical.note is None

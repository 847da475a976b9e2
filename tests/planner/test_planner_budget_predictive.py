"""budget.data and budget.learning_rate say only what predicts training, checked
against closed forms and generated ground truth: a synthetic L(D) with known parameters, the
unreachable rule against E's interval, the cluster-robust evaluation-set size against grouped
draws."""

from __future__ import annotations

import json
import math
import shlex

import numpy as np
import pytest
from pydantic import ValidationError
from scipy import stats

from curvplan.types.planner import FullModelCurvature, Measurements, Targets
from curvplan_core.planner import make_plan
from curvplan_core.planner.budget_section import data_sweep_next_step
from curvplan_core.planner.loss_accuracy import (
    adjacent_correlation,
    cluster_robust_variance,
    k_loss_accuracy,
)

FAST = {"orderings": 8, "bootstrap": 50}
Z = float(stats.norm.ppf(0.975))

# ------------------------------------------------------------------ a synthetic L(D)
E_TRUE, A_TRUE, BETA_TRUE = 1.5, 10.0, 0.5
SIZES = [100, 200, 400, 800, 1600, 3200, 6400]


def _loss_vs_data(noise: float, seed: int = 0) -> list[dict[str, float]]:
    rng = np.random.default_rng(seed)
    return [
        {
            "n_samples": float(d),
            "loss": float((E_TRUE + A_TRUE * d**-BETA_TRUE) * (1 + noise * rng.standard_normal())),
        }
        for d in SIZES
    ]


def test_a_synthetic_loss_vs_data_gives_the_closed_form_data_number_for_the_target():
    target = 1.65  # D = (A/(target − E))^(1/β) = (10/0.15)² ≈ 4,444: inside the sizes
    truth = (A_TRUE / (target - E_TRUE)) ** (1 / BETA_TRUE)
    m = Measurements(loss_vs_data=_loss_vs_data(noise=2e-4))
    plan = make_plan(m, Targets(target_loss=target, available_samples=50_000), seed=0)
    data = plan.budget.data
    assert data.source == "data_sweep" and data.target_status == "reachable"
    assert data.target_loss == target  # the target asked for is honoured
    assert data.recommended_examples == pytest.approx(truth, rel=0.05)
    lo, hi = data.recommended_examples_ci
    assert lo <= truth <= hi
    assert data.irreducible_loss == pytest.approx(E_TRUE, abs=0.02)
    assert data.available_is_enough is True and data.next_step is None
    short = make_plan(m, Targets(target_loss=target, available_samples=1_000), seed=0)
    assert short.budget.data.available_is_enough is False
    assert any("not enough data" in w for w in short.budget.warnings)


def _fit_e(noise: float, seed: int) -> tuple[float, tuple[float, float]]:
    plan = make_plan(Measurements(loss_vs_data=_loss_vs_data(noise, seed)), Targets(), seed=0)
    return plan.scaling.E, plan.scaling.E_ci


def test_unreachable_holds_only_below_the_lower_confidence_end_of_e():
    noise, seed = 0.01, 3
    e, (e_lo, _) = _fit_e(noise, seed)
    assert 0 < e_lo < e  # an interval with room below the point estimate
    m = Measurements(loss_vs_data=_loss_vs_data(noise, seed))

    plan = make_plan(m, Targets(target_loss=(e_lo + e) / 2), seed=0)
    budget = plan.budget
    inside = budget.data
    assert inside.target_status == "uncertain"
    assert inside.source == "not_available" and inside.recommended_examples is None
    assert inside.next_step is not None  # how to settle it
    assert "inside the interval" in inside.reason
    # the point estimate alone (target ≤ E) does not make it unreachable
    assert not any("below the lower" in w for w in budget.warnings)
    scaling = [w.detail for w in plan.warnings if w.code == "target_below_irreducible_loss"]
    assert scaling and "cannot tell" in scaling[0]

    below = make_plan(m, Targets(target_loss=e_lo * 0.9), seed=0).budget
    assert below.data.target_status == "unreachable"
    assert below.data.source == "not_available" and below.data.recommended_examples is None
    assert any("below the lower" in w for w in below.warnings)


def _sweep_option_names() -> set[str]:
    import typer.main

    from curvplan.cli import app

    group = typer.main.get_command(app)
    command = group.commands["sweep"]  # type: ignore[attr-defined]
    return {opt for p in command.params for opt in getattr(p, "opts", [])}


def test_without_a_data_sweep_the_data_number_is_not_available_with_the_real_command():
    losses = list(np.random.default_rng(0).gamma(4.0, 0.5, size=300))
    plan = make_plan(
        Measurements(per_sample_losses=losses, tokens_per_example=64.0),
        Targets(**FAST, target_loss=1.0, available_samples=100_000),
        seed=1,
    )
    data = plan.budget.data
    assert data.source == "not_available" and data.recommended_examples is None
    assert data.available_is_enough is None  # no training-data number to compare with
    assert data.target_loss == 1.0  # the target asked for is kept, and in the command
    step = data.next_step
    assert step is not None
    argv = shlex.split(step.command)
    assert argv[:4] == ["curvplan", "sweep", "--type", "data"]
    flags = {a for a in argv if a.startswith("--")}
    assert flags <= _sweep_option_names(), flags - _sweep_option_names()
    assert argv[argv.index("--target-loss") + 1] == "1"
    sizes = [int(x) for x in argv[argv.index("--data-sizes") + 1].split(",")]
    assert sizes == step.data_sizes and max(sizes) == 100_000 and len(sizes) == 6
    assert step.training_runs == 18  # 6 sizes × the 3 lr-grid multipliers
    assert step.max_tokens_processed == step.max_examples_processed * 64.0
    # the evaluation-set size is beside it, named for what it is
    ev = data.evaluation_set_size
    eps = plan.budget.defaults.tolerances[0]
    expected = math.ceil(Z**2 * np.var(losses, ddof=1) / eps**2)
    assert ev is not None and ev.examples == pytest.approx(expected, rel=1e-6)
    assert ev.variance_method == "iid" and "evaluation-set size" in ev.guarantee
    row = plan.sample_size.per_tolerance[0]
    assert row.evaluation_set_size.k == ev.examples


def test_next_step_without_a_known_dataset_size_leaves_the_sizes_to_the_service():
    step = data_sweep_next_step(None, None, None)
    assert "--data-sizes" not in step.command and "--target-loss" not in step.command
    assert step.data_sizes is None and step.training_runs == 18


# ------------------------------------------------------------------ correlated samples
def _grouped(rng, n_groups: int, size: int, between: float, within: float):
    means = between * rng.standard_normal(n_groups)
    losses = 3.0 + np.repeat(means, size) + within * rng.standard_normal(n_groups * size)
    return losses, np.repeat(np.arange(n_groups), size)


def test_cluster_robust_size_covers_grouped_draws_where_the_naive_one_under_covers():
    """Ground truth: groups of m examples with a shared group effect (ICC 0.5, deff 5.5). A
    fresh evaluation set of k examples drawn as k/m whole groups has a mean error
    N(0, (τ² + σ²/m)/(k/m)) exactly; the coverage of ±ε over replicates is the check."""
    rng = np.random.default_rng(7)
    n_groups, size, tau, sigma, eps, reps = 100, 10, 1.0, 1.0, 0.1, 800
    hits = {"naive": 0, "robust": 0}
    deffs = []
    for _ in range(reps):
        losses, groups = _grouped(rng, n_groups, size, tau, sigma)
        naive = k_loss_accuracy(float(np.var(losses, ddof=1)), eps, 0.95)
        cv = cluster_robust_variance(losses, groups, 0.95)
        deffs.append(cv.design_effect)
        robust = k_loss_accuracy(cv.effective_variance, eps, 0.95)
        for name, k in (("naive", naive), ("robust", robust)):
            g = max(1, math.ceil(k / size))  # whole groups
            error = math.sqrt((tau**2 + sigma**2 / size) / g) * rng.standard_normal()
            hits[name] += abs(error) <= eps
    assert hits["naive"] / reps < 0.75  # ≈ 0.60: i.i.d. n is 5.5× too small
    assert 0.92 <= hits["robust"] / reps <= 0.975
    assert np.median(deffs) == pytest.approx(1 + (size - 1) * 0.5, rel=0.15)


def test_robust_variance_equals_the_iid_one_for_independent_groups_on_average():
    rng = np.random.default_rng(1)
    ratios = []
    for _ in range(200):
        losses, groups = _grouped(rng, 60, 5, 0.0, 1.0)
        ratios.append(cluster_robust_variance(losses, groups, 0.95).design_effect)
    assert np.mean(ratios) == pytest.approx(1.0, abs=0.06)


def test_plan_with_groups_says_the_sample_looks_correlated():
    rng = np.random.default_rng(2)
    losses, groups = _grouped(rng, 80, 10, 1.0, 1.0)
    losses = np.abs(losses)
    m = Measurements(per_sample_losses=list(losses), per_sample_groups=[int(g) for g in groups])
    plan = make_plan(m, Targets(**FAST, tolerances=[0.1]), seed=0)
    corr = plan.sample_size.loss_correlation
    assert corr.variance_method == "cluster_robust" and corr.correlated
    assert corr.n_groups == 80 and corr.mean_group_size == pytest.approx(10)
    assert corr.intra_cluster_correlation == pytest.approx(0.5, abs=0.2)
    ev = plan.budget.data.evaluation_set_size
    assert ev.variance_method == "cluster_robust" and ev.correlated is True
    naive = math.ceil(k_loss_accuracy(float(np.var(losses, ddof=1)), 0.1, 0.95))
    assert ev.examples > 3 * naive
    assert "correlated_losses" in [w.code for w in plan.warnings]


def test_without_groups_adjacent_windows_of_one_document_are_flagged():
    rng = np.random.default_rng(3)
    losses, _ = _grouped(rng, 60, 10, 1.0, 1.0)  # file order: a document's windows together
    losses = np.abs(losses)
    assert adjacent_correlation(losses) > 0.3
    plan = make_plan(Measurements(per_sample_losses=list(losses)), Targets(**FAST), seed=0)
    corr = plan.sample_size.loss_correlation
    assert corr.variance_method == "iid" and corr.correlated
    assert "per_sample_groups" in corr.note
    shuffled = list(rng.permutation(losses))
    calm = make_plan(Measurements(per_sample_losses=shuffled), Targets(**FAST), seed=0)
    assert calm.sample_size.loss_correlation.correlated is False


def test_groups_must_match_the_losses_one_to_one():
    with pytest.raises(ValidationError) as err:
        Measurements(per_sample_losses=[1.0, 2.0, 3.0], per_sample_groups=[0, 1])
    assert err.value.errors()[0]["loc"] == ("per_sample_groups",)
    with pytest.raises(ValidationError) as err:
        Measurements(per_sample_groups=[0, 1])
    assert err.value.errors()[0]["loc"] == ("per_sample_groups",)


# ------------------------------------------------------------------ learning rate
def test_learning_rate_is_two_over_the_full_model_lambda_max_with_the_block_beside_it():
    blocks = [
        {"name": "a", "lambda_max": 10.0, "lambda_min": -1.0, "spectral_norm": 10.0},
        {"name": "b", "lambda_max": 4.0, "lambda_min": 0.0, "spectral_norm": 4.0},
    ]
    full = FullModelCurvature(lambda_max=14.0, residual=1e-7, converged=True, n_products=40)
    plan = make_plan(Measurements(blocks=blocks, full_model=full), Targets(), seed=0)
    lr = plan.budget.learning_rate
    assert lr.gd_sharpness_threshold == pytest.approx(2 / 14)
    assert lr.lambda_max_full == 14.0 and lr.lambda_max_full_products == 40
    assert lr.lambda_max_block == 10.0 and lr.lambda_max_block_name == "a"
    assert lr.block_threshold == pytest.approx(0.2)
    assert lr.block_threshold >= lr.gd_sharpness_threshold
    assert "edge of stability" in lr.meaning and "not a divergence limit" in lr.meaning
    assert "SGD" in lr.meaning and "Adam" in lr.meaning
    assert "diverges" not in plan.model_dump_json()
    without = make_plan(Measurements(blocks=blocks), Targets(), seed=0).budget.learning_rate
    assert without.gd_sharpness_threshold is None and "upper bound" in without.reason


def test_the_schema_types_every_new_field():
    from curvplan.types.planner import Recommendation

    schema = Recommendation.model_json_schema()
    defs = schema["$defs"]
    data = defs["BudgetData"]["properties"]
    for name in ("target_status", "irreducible_loss", "evaluation_set_size", "next_step"):
        assert name in data
    lr = defs["BudgetLearningRate"]["properties"]
    assert {"anyOf": [{"type": "number"}, {"type": "null"}]}.items() <= lr[
        "gd_sharpness_threshold"
    ].items()
    step = defs["DataSweepNextStep"]
    assert step["properties"]["training_runs"]["type"] == "integer"
    assert set(step["required"]) >= {"command", "training_runs", "max_examples_processed"}
    ev = defs["EvaluationSetSize"]["properties"]
    assert ev["variance_method"]["enum"] == ["iid", "cluster_robust"]
    corr = defs["LossCorrelation"]["properties"]
    assert corr["correlated"]["type"] == "boolean"
    per_tol = defs["PerTolerance"]["properties"]
    assert "evaluation_set_size" in per_tol
    json.dumps(schema)

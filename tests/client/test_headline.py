"""The headline numbers are the recommendation's own values under stable names."""

from __future__ import annotations

import json

import pytest
from plan_bodies import full_measurements, full_targets

from curvplan.headline import headline_dict, metric_name


@pytest.fixture(scope="module")
def recommendation():  # type: ignore[no-untyped-def]
    from curvplan_core.planner import Measurements, Targets, make_plan

    return make_plan(
        Measurements.model_validate_json(json.dumps(full_measurements())),
        Targets.model_validate_json(json.dumps(full_targets())),
        seed=0,
    )


def test_budget_numbers_are_the_budget_section(recommendation) -> None:  # type: ignore[no-untyped-def]
    numbers = headline_dict(recommendation)
    budget = recommendation.budget
    assert numbers["budget.samples"] == budget.data.recommended_examples
    assert numbers["budget.batch_size"] == budget.batch.recommended
    assert numbers["budget.critical_batch_size"] == budget.batch.critical
    assert "budget.lr_ceiling" not in numbers  # a block's 2/λ_max is not a budget answer
    assert "scaling.n_for_target_loss" not in numbers  # budget.samples is the data answer
    assert numbers["batch.b_crit"] == recommendation.batch_size.b_crit.value
    assert numbers["sample_size.alpha"] == recommendation.sample_size.fit.alpha
    for block in recommendation.curvature.blocks:
        assert numbers[f"curvature.lambda_max.{block.name}"] == block.lambda_max
    assert all(isinstance(v, float) for v in numbers.values())


def test_a_recommendation_without_budget_still_leads_with_one(recommendation) -> None:  # type: ignore[no-untyped-def]
    old = recommendation.model_copy(update={"budget": None})
    numbers = headline_dict(old)
    assert numbers["budget.critical_batch_size"] == recommendation.batch_size.b_crit.value
    # no batch size and no block's 2/λ_max is made up as a budget answer
    assert "budget.batch_size" not in numbers and "budget.lr_ceiling" not in numbers
    # the data size is solved from the stored fit: the same size budget.data answered
    assert recommendation.budget.data.source in ("data_sweep", "extrapolated")
    assert numbers["budget.samples"] == pytest.approx(
        recommendation.budget.data.recommended_examples, abs=1.0
    )


def test_metric_names_are_mlflow_safe() -> None:
    assert metric_name("curvature.lambda_max", "model.layers[0].attn:q") == (
        "curvature.lambda_max.model.layers_0_.attn_q"
    )

"""One number per question: `budget` holds the answers, the sections only the
evidence. A recommendation built from every kind of measurement carries no second batch size,
data size or learning rate under another name; neither does the schema; a recommendation
stored before the removal reads back without them; the learning-rate factor answers the
budget's own batch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from curvplan.types.planner import Measurements, Recommendation, Targets
from curvplan_core.planner import make_plan

ROOT = Path(__file__).resolve().parents[2]

#: (section, field) of every removed second answer (README, "Breaking changes").
REMOVED = {
    ("BatchSizeSection", "recommended"),
    ("BatchSizeSection", "recommended_basis"),
    ("BatchSizeSection", "recommended_formula"),
    ("BatchSizeSection", "recommended_tokens"),
    ("SampleSizeSection", "recommended_criterion"),
    ("SampleSizeSection", "recommended_criterion_reason"),
    ("PerTolerance", "loss_accuracy"),
    ("PerTolerance", "available_is_enough"),
    ("PerTolerance", "available_is_enough_stabilisation"),
    ("BudgetData", "loss_accuracy_examples"),
    ("BudgetLearningRate", "gd_stability_limit"),
    ("BudgetLearningRate", "lambda_max"),
    ("BudgetLearningRate", "lambda_max_source"),
    ("ScalingSection", "n_for_target_loss"),
    ("ScalingSection", "n_for_target_loss_ci"),
    ("ScalingSection", "n_for_target_loss_formula"),
    # renamed: a block's 2/λ_max is evidence, not a learning rate to use
    ("BlockSummary", "lr_ceiling"),
    ("CurvatureSection", "lr_ceiling_formula"),
}
#: Where each section sits in a recommendation's JSON.
SECTION_PATH = {
    ".batch_size": "BatchSizeSection",
    ".sample_size": "SampleSizeSection",
    ".sample_size.per_tolerance[]": "PerTolerance",
    ".budget.data": "BudgetData",
    ".budget.learning_rate": "BudgetLearningRate",
    ".scaling": "ScalingSection",
    ".curvature": "CurvatureSection",
    ".curvature.blocks[]": "BlockSummary",
}
S_MIN, B_CRIT = 300.0, 90.0  # S(B) = S_min(1 + B_crit/B), McCandlish et al. 2018 eq. 2.11
E, A, BETA = 1.5, 30.0, 0.35  # L(D) = E + A·D^(−β)


def _rich_measurements() -> Measurements:
    """Every measurement the planner reads, generated from known laws."""
    rng = np.random.default_rng(5)
    noise = {"grad_sq_norm": 0.02, "trace_sigma": 3.1, "gHg": 0.004, "trace_h_sigma": 0.9}
    trend = [
        {"grad_sq_norm": 4.0, "trace_sigma": 4.0 * b, "gHg": 1.0, "trace_h_sigma": b, "loss": loss}
        for b, loss in ((20.0, 3.0), (40.0, 2.5), (80.0, 2.0))
    ]
    return Measurements.model_validate(
        {
            "per_sample_losses": rng.gamma(4.0, 0.5, size=400).tolist(),
            "gradient_noise": noise,
            "gradient_noise_trend": trend,
            "steps_to_target": [
                {"batch_size": b, "steps": S_MIN * (1 + B_CRIT / b)} for b in (16, 32, 64, 128, 256)
            ],
            "loss_vs_data": [
                {"n_samples": d, "loss": E + A * d**-BETA} for d in (500, 1000, 2000, 4000, 8000)
            ],
            "blocks": [
                {"name": "a", "lambda_max": 10.0, "lambda_min": 0.0, "spectral_norm": 10.0},
                {"name": "b", "lambda_max": 4.0, "lambda_min": -0.1, "spectral_norm": 4.0},
            ],
            "full_model": {
                "lambda_max": 14.0,
                "residual": 1e-7,
                "converged": True,
                "n_products": 9,
            },
            "tokens_per_example": 64.0,
        }
    )


@pytest.fixture(scope="module")
def rich() -> Recommendation:
    target = E + A * 3000.0**-BETA  # inside the swept sizes
    targets = Targets(target_loss=target, tolerances=[0.05], orderings=8, bootstrap=50)
    return make_plan(_rich_measurements(), targets, seed=0)


def _keys(value: Any, path: str = "") -> list[tuple[str, str]]:
    """(path, key) of every key of a JSON value."""
    out: list[tuple[str, str]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            out.append((path, key))
            out += _keys(item, f"{path}.{key}")
    elif isinstance(value, list):
        for item in value:
            out += _keys(item, f"{path}[]")
    return out


def _values(value: Any, path: str = "") -> list[tuple[str, Any]]:
    """(path, value) of every leaf of a JSON value (list items under ``path[]``)."""
    if isinstance(value, dict):
        return [pv for key, item in value.items() for pv in _values(item, f"{path}.{key}")]
    if isinstance(value, list):
        return [pv for item in value for pv in _values(item, f"{path}[]")]
    return [(path, value)]


def test_a_full_recommendation_answers_each_question_once(rich: Recommendation) -> None:
    body = json.loads(rich.model_dump_json())
    assert rich.budget is not None
    # every question is answered, in the budget
    assert rich.budget.data.source == "data_sweep"
    assert rich.budget.data.recommended_examples == pytest.approx(3000, rel=0.01)
    assert rich.budget.batch.source == "batch_sweep"
    assert rich.budget.batch.recommended == 64  # log2 90 = 6.49
    assert rich.budget.learning_rate.gd_sharpness_threshold == pytest.approx(2 / 14)
    keys = _keys(body)
    assert {SECTION_PATH[p] for p, _ in keys if p in SECTION_PATH} == set(SECTION_PATH.values())
    assert not [(p, k) for p, k in keys if (SECTION_PATH.get(p), k) in REMOVED]
    # outside the budget no field is named like an answer
    answers = [
        (p, k) for p, k in keys if k.startswith("recommended") and not p.startswith(".budget")
    ]
    assert not answers, answers
    # no second number for the data question: outside budget.data no value equals its size
    size = rich.budget.data.recommended_examples
    seconds = [
        (p, v)
        for p, v in _values(body)
        if not p.startswith(".budget.data")
        and isinstance(v, int | float)
        and not isinstance(v, bool)
        and v > 1
        and abs(v - size) < 1.0
    ]
    assert not seconds, seconds
    # no deprecated_field warning is left to explain a second number
    assert "deprecated_field" not in {w.code for w in rich.warnings}


def test_the_learning_rate_factor_answers_the_budget_batch(rich: Recommendation) -> None:
    batch = rich.budget.batch.recommended  # type: ignore[union-attr]
    rule = rich.batch_size.lr_scaling  # type: ignore[union-attr]
    b_noise = 0.9 / 0.004  # tr(HΣ)/GᵀHG of the checkpoint's statistics
    assert rule.b_noise == pytest.approx(b_noise)
    assert rule.factor_at_recommended == pytest.approx(1 / (1 + b_noise / batch))
    assert rule.epsilon_opt_at_recommended == pytest.approx(0.02 / 0.004 / (1 + b_noise / batch))


def _properties(schemas: dict[str, Any]) -> set[tuple[str, str]]:
    return {
        (name, prop)
        for name, schema in schemas.items()
        for prop in (schema.get("properties") or {})
    }


def test_no_removed_field_is_in_the_schema_or_the_openapi_document() -> None:
    live = _properties(Recommendation.model_json_schema()["$defs"])
    assert {name for name, _ in REMOVED} <= {name for name, _ in live}  # the sections exist
    assert not REMOVED & live
    document = json.loads((ROOT / "docs" / "openapi.json").read_text())
    assert not REMOVED & _properties(document["components"]["schemas"])
    # nothing is kept "for one release" any more: no property is marked deprecated
    deprecated = [
        (name, prop)
        for name, schema in document["components"]["schemas"].items()
        for prop, spec in (schema.get("properties") or {}).items()
        if isinstance(spec, dict) and spec.get("deprecated")
    ]
    assert not deprecated, deprecated


def test_a_recommendation_stored_with_the_old_fields_reads_back_without_them(
    rich: Recommendation,
) -> None:
    body = json.loads(rich.model_dump_json())
    old = json.loads(json.dumps(body))
    old["batch_size"].update(
        recommended=32, recommended_basis="B_noise", recommended_formula="f", recommended_tokens=7
    )
    old["sample_size"].update(
        recommended_criterion="loss_accuracy", recommended_criterion_reason="r"
    )
    for row in old["sample_size"]["per_tolerance"]:
        row.update(loss_accuracy=row["evaluation_set_size"], available_is_enough=True)
        row["available_is_enough_stabilisation"] = False
    old["budget"]["data"]["loss_accuracy_examples"] = 5
    old["budget"]["learning_rate"].update(gd_stability_limit=0.2, lambda_max=10.0)
    old["scaling"].update(
        n_for_target_loss=2999.4,
        n_for_target_loss_ci=[2500.0, 3600.0],
        n_for_target_loss_formula="scaling.n_for_target: D = (A/(target − E))^(1/β)",
    )
    old["budget"]["learning_rate"]["lambda_max_source"] = "largest block λ_max (a)"
    old["curvature"]["lr_ceiling_formula"] = old["curvature"].pop("block_threshold_formula")
    for block in old["curvature"]["blocks"]:
        block["lr_ceiling"] = block.pop("block_threshold")
    again = Recommendation.model_validate(old)
    assert json.loads(again.model_dump_json()) == body
